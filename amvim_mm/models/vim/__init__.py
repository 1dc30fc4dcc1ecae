"""The Vim family: Vim, AMVim and LocalVim (one backbone class, :mod:`.family`, with its
embedding, block, bidirectional mixer and norm)."""
from .local_vim import LocalVim
from .vim import VIM_ARCHS, AMVim, Vim

__all__ = ['Vim', 'AMVim', 'LocalVim', 'VIM_ARCHS']
