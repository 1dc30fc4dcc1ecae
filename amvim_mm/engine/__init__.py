from .checkpoint_hook import AtomicCheckpointHook, latest_checkpoint
from .fileio import AtomicLocalBackend, atomic_write_bytes
from .hooks import FrozenWarmupHook, TokenReductionHook
from .loops import AmpTestLoop
from .optim import LayerDecayOptimWrapperConstructor

__all__ = ['TokenReductionHook', 'FrozenWarmupHook', 'LayerDecayOptimWrapperConstructor',
           'AtomicLocalBackend', 'atomic_write_bytes', 'AtomicCheckpointHook', 'latest_checkpoint',
           'AmpTestLoop']
