"""LTMP's learned threshold: one scalar per masker, a hard mask with a straight-through
gradient (the sigmoid's)."""
from __future__ import annotations

import torch
import torch.nn as nn

from .settings import check_number


def threshold_mask(v: torch.Tensor, theta: torch.Tensor, tau: float) -> torch.Tensor:
    """``sigmoid((v - theta) / tau) > 0.5`` as 0. / 1. in the forward pass, with the gradient of
    the soft sigmoid w.r.t. ``v`` and ``theta`` (straight-through; LTMP's ``ThresholdMasker``:
    the comparison is made on the sigmoid, strict, so ``v == theta`` gives 0). Output dtype:
    at least float32."""
    soft = torch.sigmoid((v - theta) / tau)
    hard = (soft > 0.5).to(torch.promote_types(soft.dtype, torch.float32))
    return soft + (hard - soft).detach()


class ThresholdMasker(nn.Module):
    """One learnable threshold ``theta`` (shape (1,)) and a temperature ``tau``: ``forward(v)``
    keeps the entries whose value passes the threshold (:func:`threshold_mask`).

    Args:
        init: the initial threshold (LTMP: 0.9 for merging, 0.0 for pruning), any finite
            number (its useful range depends on the score; the owner checks it).
        tau: the sigmoid's temperature (LTMP's training default 0.5; its models 0.1), in
            (0, inf).
    """

    def __init__(self, init: float = 0.0, tau: float = 0.5) -> None:
        super().__init__()
        self.tau = check_number('ThresholdMasker', 'tau', tau, low=0, low_open=True)
        init = check_number('ThresholdMasker', 'init', init)
        self.threshold = nn.Parameter(torch.tensor([init]))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return threshold_mask(v, self.threshold, self.tau)

    def extra_repr(self) -> str:
        return f'tau={self.tau}'
