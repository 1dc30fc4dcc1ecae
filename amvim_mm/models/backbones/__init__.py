from .vim import AMVim, Vim

__all__ = ['Vim', 'AMVim']
