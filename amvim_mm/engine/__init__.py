from .fileio import AtomicLocalBackend, atomic_write_bytes
from .hooks import TokenReductionHook
from .optim import LayerDecayOptimWrapperConstructor

__all__ = ['TokenReductionHook', 'LayerDecayOptimWrapperConstructor', 'AtomicLocalBackend',
           'atomic_write_bytes']
