from .local_vim import LocalVim
from .plain_mamba import PlainMamba
from .vim import AMVim, Vim
from .vmamba import VMamba

__all__ = ['Vim', 'AMVim', 'LocalVim', 'VMamba', 'PlainMamba']
