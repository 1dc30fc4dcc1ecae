"""The Vim family's token layout: where the class token sits, and the position codes.

A sequence holds ``n`` patch tokens in raster order (of the grid, or of the survivors of a
reduction) and, if the model has one, the class token **in the middle**: at index
:func:`cls_slot` ``(n) = n // 2``, i.e. between patch ``n // 2 - 1`` and patch ``n // 2``
(Vim's "middle class token"). Every site and kernel wrapper takes the slot from here; after a
reduction step the class token moves to the slot of the new count. An EViT fused token, when
present, is the last token of the sequence.

Each token's grid position (``pos``) is its raster index on the patch grid, or one of the codes
below for tokens that stand for no grid cell.
"""
from __future__ import annotations

import torch

#: ``pos`` of the class token
CLS_POS = -1
#: ``pos`` of EViT's fused token (always the last token of the sequence)
FUSED_POS = -2
#: class-token index of a sequence without a class token
NO_CLS = -1


def cls_slot(n_patches: int) -> int:
    """Index of the middle class token in a sequence of ``n_patches`` patch tokens."""
    return n_patches // 2


def cls_index_for(n_patches: int, with_cls_token: bool) -> int:
    """The class token's index (:func:`cls_slot`), or :data:`NO_CLS` without one."""
    return cls_slot(n_patches) if with_cls_token else NO_CLS


def grid_positions(n_cells: int, cls_index: int, device=None) -> torch.Tensor:
    """``pos`` of the unreduced sequence: raster indices ``0..n_cells-1`` with :data:`CLS_POS`
    inserted at ``cls_index`` (none for :data:`NO_CLS`)."""
    pos = torch.arange(n_cells, device=device)
    if cls_index >= 0:
        pos = torch.cat([pos[:cls_index], pos.new_full((1, ), CLS_POS), pos[cls_index:]])
    return pos


def insert_cls(patches: torch.Tensor, cls: torch.Tensor, cls_index: int) -> torch.Tensor:
    """(B, M, ...) patch tokens and a (B, 1, ...) class token -> (B, M + 1, ...) with the class
    token at ``cls_index`` (:func:`cls_slot`); :data:`NO_CLS` returns the patches."""
    if cls_index < 0:
        return patches
    return torch.cat([patches[:, :cls_index], cls, patches[:, cls_index:]], 1)


def drop_cls(tokens: torch.Tensor, cls_index: int) -> torch.Tensor:
    """(B, L, ...) sequence -> (B, L - 1, ...) its patch tokens (raster order); the sequence
    itself for :data:`NO_CLS`."""
    if cls_index < 0:
        return tokens
    return torch.cat([tokens[:, :cls_index], tokens[:, cls_index + 1:]], 1)


def cls_row(tokens: torch.Tensor, cls_index: int) -> torch.Tensor:
    """(B, L, ...) sequence -> (B, 1, ...) the class token's row (a view)."""
    return tokens[:, cls_index:cls_index + 1]
