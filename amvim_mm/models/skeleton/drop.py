"""Stochastic depth (drop path) per sample."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn




class DropPath(nn.Module):
    """Stochastic depth per sample (identity at eval time and for ``p == 0``)."""

    def __init__(self, drop_prob: float = 0.) -> None:
        super().__init__()
        self.drop_prob = float(drop_prob)

    def sample_mask(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The 0 / 1 keep mask (B, 1, ..., 1) in ``x``'s dtype that :meth:`forward` draws for
        ``x`` (the same random numbers), or None when it is the identity."""
        if self.drop_prob == 0. or not self.training:
            return None
        return x.new_empty((x.shape[0], ) + (1, ) * (x.dim() - 1)).bernoulli_(1. - self.drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.sample_mask(x)
        if mask is None:
            return x
        return x * mask / (1. - self.drop_prob)

    def scale(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """The per-sample factor (B,) fp32 that :meth:`forward` multiplies ``x`` by, ``mask /
        keep_prob``, drawn like :meth:`forward` draws it (same random numbers, so with the same
        seed ``x * scale`` equals ``forward(x)`` up to rounding), or None for the identity. For
        fused operations that apply stochastic depth themselves
        (:func:`amvim_mm.ops.fused_add_rmsnorm.fused_add_rmsnorm_train`)."""
        mask = self.sample_mask(x)
        if mask is None:
            return None
        return mask.reshape(-1).float() / (1. - self.drop_prob)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'
