from .local_vim import LocalVim
from .vim import AMVim, Vim
from .vmamba import VMamba

__all__ = ['Vim', 'AMVim', 'LocalVim', 'VMamba']
