"""mamba-ssm's selective scan called at its chunk length (:func:`mamba_even_length`), the
``cuda`` backend of :func:`~amvim_mm.ops.selective_scan.selective_scan_fn`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['MAMBA_CHUNKS', 'MAMBA_PAD_MIN_STATE', 'mamba_even_length']

ScanOut = Union[Tensor, Tuple[Tensor, Tensor]]

#: mamba-ssm's forward kernel runs a sequence of L <= 1024 steps as one chunk of the smallest
#: of these lengths >= L; a sequence of exactly that length takes its even-length path
#: (vectorised loads, no per-step bounds), which on an H200 is faster than a shorter uneven
#: sequence in the same chunk (PlainMamba's reduced lengths; benchmarks/README.md)
MAMBA_CHUNKS = (128, 256, 512, 1024)
#: the padding pays where the scan's per-step work dominates (N = 16: PlainMamba faster end to
#: end); with VMamba-T's single state (N = 1) the copies cost more than the kernel saves
MAMBA_PAD_MIN_STATE = 16


def mamba_even_length(fn, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                      D: Optional[Tensor], z: Optional[Tensor], delta_bias: Optional[Tensor],
                      delta_softplus: bool, return_last_state: bool) -> ScanOut:
    """``fn`` (mamba-ssm's ``selective_scan_fn``) on the sequences padded at the end to the
    kernel's chunk length (:data:`MAMBA_CHUNKS`), the outputs cut back to L: the scan is
    causal, so the steps after L change nothing before it (the same arithmetic, bit for bit,
    in the same launch configuration). Only where it pays and changes nothing else: no last
    state asked, no autograd recorded, L <= 1024 and not a chunk length already, at least
    :data:`MAMBA_PAD_MIN_STATE` states."""
    L = u.shape[-1]
    Lp = next((c for c in MAMBA_CHUNKS if L <= c), L)
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (u, delta, A, B, C, D, z, delta_bias))
    if Lp == L or return_last_state or grad or B.shape[-2] < MAMBA_PAD_MIN_STATE:
        return fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    pad = (0, Lp - L)
    y = fn(F.pad(u, pad), F.pad(delta, pad), A, F.pad(B, pad), F.pad(C, pad), D,
           None if z is None else F.pad(z, pad), delta_bias, delta_softplus, False)
    return y[..., :L].contiguous()
