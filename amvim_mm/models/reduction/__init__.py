"""Token reduction for Vim-family backbones (see ``../shared/spec/token_reduction.md``)."""
from .reducers import (TOKEN_REDUCERS, EViT, RandomPrune, ToMe, ToP, TokenReducer,
                       build_reducer)
from .schedule import ReductionSchedule
from .state import Streams, reduce_tokens, restore_grid

__all__ = ['TOKEN_REDUCERS', 'TokenReducer', 'ToMe', 'RandomPrune', 'EViT', 'ToP',
           'build_reducer', 'ReductionSchedule', 'Streams', 'reduce_tokens', 'restore_grid']
