"""Heads that run on the backbone's kept tokens (``out_type='tokens'``): the carriers and
their restore map (:mod:`.token_grid`), Segmenter's linear and mask-transformer heads on them
(:mod:`.token_heads`; registered here, mmseg imported when one is built)."""
from .token_grid import TokenGrid, token_grid
from .token_heads import (proportional_attention_bias, token_fcn_head_class,
                          token_mask_head_class)

__all__ = ['TokenGrid', 'token_grid', 'proportional_attention_bias', 'token_fcn_head_class',
           'token_mask_head_class']
