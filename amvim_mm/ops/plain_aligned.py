"""The inputs of PlainMamba's ToP-aligned scan (``PlainMamba2D._aligned_scan``).

With ToP's hidden-state alignment each direction scans its survivors as the official
full-length pass with zero input at the absent cells would. In that pass step ``t`` of a
direction takes delta, B, C of RASTER cell ``t`` (the official first quirk) and the dt bias
twice (the second quirk); an absent cell's ``dt`` is the bias itself. The zero-input steps
between two kept steps fold into the later one's step size
(:func:`~amvim_mm.ops.selective_scan.aligned_selective_scan`): kept step ``j`` (at full-grid
step ``s_j``) takes ``delta_j``, the ``dt`` of raster cell ``s_j``, and ``gap_j``: ``'bias'``:
the step sizes of the raster cells strictly between ``s_{j-1}`` and ``s_j``
(``softplus(dt_c + b)`` at a present cell, ``softplus(b + b)`` at an absent one); ``'token'``:
``(s_j - s_{j-1} - 1) * softplus(delta_j + b)``. :func:`aligned_inputs_torch` forms them with
PyTorch ops.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['aligned_inputs_torch', 'at_steps', 'step_lookup']


def step_lookup(pos: Tensor, steps: Tensor) -> Tuple[Tensor, Tensor]:
    """The stored survivor at raster cell ``steps[b, k, j]`` (the cell whose delta, B, C kept
    step ``j`` takes): (idx, here), both (B, K, L); ``pos`` (B, L) raster-ascending cells of the
    stored survivors; ``idx`` is meaningless where ``here`` is False."""
    B, K, L = steps.shape
    flat = steps.reshape(B, K * L)
    idx = torch.searchsorted(pos, flat).clamp(max=L - 1)
    here = (torch.gather(pos, 1, idx) == flat).view(B, K, L)
    return idx.view(B, K, L), here


def at_steps(t: Tensor, idx: Tensor, here: Tensor, absent) -> Tensor:
    """(B, L, X) per stored survivor -> (B, K, X, L) at the kept steps' raster cells
    (:func:`step_lookup`), ``absent`` (a number or broadcastable tensor) where no survivor is."""
    B, K, L = idx.shape
    X = t.shape[-1]
    g = torch.gather(t, 1, idx.reshape(B, K * L, 1).expand(-1, -1, X))
    g = g.view(B, K, L, X).transpose(2, 3)
    return torch.where(here.unsqueeze(2), g, absent)


def aligned_inputs_torch(dt: Tensor, bias: Tensor, steps: Tensor, pos: Tensor, idx: Tensor,
                         here: Tensor, align: str) -> Tuple[Tensor, Tensor]:
    """``delta`` (raw, the second bias not yet added) and ``gap`` (B, K*E, L) of the folded
    scan with PyTorch ops. ``dt`` (B, L, E) the stored survivors' ``dt_proj`` outputs (one
    bias); ``bias`` (K*E,) the dt bias per direction; ``steps`` (B, K, L) the full-grid step of
    each kept step; ``pos``, ``idx``, ``here`` as in :func:`step_lookup`.

    Nothing full-length is formed: a gap's present cells are summed by a scatter-add (no
    prefix-sum differences) and its absent cells count ``softplus(2 b)`` each."""
    B, K, L = steps.shape
    E = dt.shape[-1]
    b1 = bias[:E]
    delta = at_steps(dt, idx, here, b1.view(1, 1, E, 1)).reshape(B, K * E, L)  # absent: dt = b
    prev = torch.cat([steps.new_full((B, K, 1), -1), steps[..., :-1]], -1)
    skipped = (steps - prev - 1).to(dt.dtype)                             # (B, K, L)
    if align == 'token':
        own = F.softplus(delta + bias[None, :, None]).view(B, K, E, L)
        return delta, (skipped.unsqueeze(2) * own).reshape(B, K * E, L)
    # survivor i (raster cell pos_i) lies in the gap before the first kept step after it; the
    # kept step at its own cell, or none after it, is no gap (slot L)
    flat_steps = steps.reshape(B * K, L)
    flat_pos = pos.unsqueeze(1).expand(B, K, L).reshape(B * K, L)
    seg = torch.searchsorted(flat_steps, flat_pos)
    own_step = torch.gather(flat_steps, 1, seg.clamp(max=L - 1)) == flat_pos
    seg = torch.where(own_step | (seg >= L), torch.full_like(seg, L), seg).view(B, K, L)
    d = F.softplus(dt + b1).transpose(1, 2)                               # (B, E, L)
    present = d.new_zeros(B, K, E, L + 1).scatter_add_(
        3, seg.unsqueeze(2).expand(B, K, E, L), d.unsqueeze(1).expand(B, K, E, L))
    n_present = skipped.new_zeros(B, K, L + 1).scatter_add_(2, seg, torch.ones_like(skipped))
    absent = (skipped - n_present[..., :L]).unsqueeze(2)
    gap = present[..., :L] + absent * F.softplus(b1 + b1).view(1, 1, E, 1)
    return delta, gap.reshape(B, K * E, L)
