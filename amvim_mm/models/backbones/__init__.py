from .local_vim import LocalVim
from .vim import AMVim, Vim

__all__ = ['Vim', 'AMVim', 'LocalVim']
