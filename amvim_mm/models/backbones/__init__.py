# registration order: the Vim family, then VMamba, then PlainMamba (tools list them so)
from .vim import AMVim, Vim
from .local_vim import LocalVim
from .vmamba import VMamba
from .plain_mamba import PlainMamba
from .vil import AMViL, ViL

__all__ = ['Vim', 'AMVim', 'LocalVim', 'VMamba', 'PlainMamba', 'ViL', 'AMViL']
