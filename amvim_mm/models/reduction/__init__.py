"""Token reduction for Vim-family backbones (protocols and math: docs/token_reduction.md)."""
from .reducers import (TOKEN_REDUCERS, EViT, RandomPrune, Selection, ToMe, ToP, TokenReducer,
                       build_reducer)
from .learned import DynamicViTReducer, LearnedReducer
from .ltmp import LTMPReducer
from .reducible import ReducibleBackbone
from .schedule import ReductionSchedule
from .session import ReductionSession
from .state import Streams, reduce_tokens, restore_grid

__all__ = ['TOKEN_REDUCERS', 'TokenReducer', 'Selection', 'ToMe', 'RandomPrune', 'EViT', 'ToP',
           'build_reducer', 'LearnedReducer', 'DynamicViTReducer', 'LTMPReducer',
           'ReducibleBackbone', 'ReductionSchedule', 'ReductionSession', 'Streams',
           'reduce_tokens', 'restore_grid']
