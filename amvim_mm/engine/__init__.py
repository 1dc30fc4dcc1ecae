from .hooks import TokenReductionHook
from .optim import LayerDecayOptimWrapperConstructor

__all__ = ['TokenReductionHook', 'LayerDecayOptimWrapperConstructor']
