"""PlainMamba: the backbone (:mod:`.plain_mamba`), its block, the 2D mixer and the snake
scan's orders and direction codes."""
from .plain_mamba import PLAIN_MAMBA_ARCHS, PlainMamba

__all__ = ['PlainMamba', 'PLAIN_MAMBA_ARCHS']
