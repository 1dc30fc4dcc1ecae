"""VMamba: the hierarchical backbone (:mod:`.vmamba`), its blocks and the SS2D mixer."""
from .vmamba import VMAMBA_ARCHS, VMamba

__all__ = ['VMamba', 'VMAMBA_ARCHS']
