"""The mixer's inference forward on a CPU, fused around the compiled kernels of
:mod:`amvim_mm.ops.cpu_ops`.

Every activation stays token-major (batch, L, E), as the GEMMs give it: per path one kernel reads
``x`` in the path's order and writes ``silu(conv(x))`` (no gather, no flip, no copy), one GEMM
gives ``x_dbl``, and the scan kernel forms ``delta`` from its low-rank columns (``dt_proj``, R
FMAs per step instead of a skinny GEMM), reads ``B`` and ``C`` straight out of ``x_dbl`` and
``z`` in token order, and adds ``y * silu(z) / P`` into the paths' sum at each step's token
(Vim's mean of the paths folded into the scan's store, as the GPU path folds it into
``out_proj``). What is left to PyTorch is one GEMM per path and the two shared projections.
The unfused mixer on a CPU spent most of its time in the depthwise ``conv1d`` (oneDNN), the
flips and copies of the reversed path and the (batch, E, L, N) intermediates of the scan.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm.errors import ConfigError
from . import cpu_ops


def cpu_mixer_misfit(hidden: Tensor, grad: bool) -> Optional[str]:
    """Why this call cannot take the fused CPU mixer (``None`` if it can)."""
    if hidden.is_cuda or hidden.device.type != 'cpu':
        return 'not a CPU tensor'
    if grad:
        return 'it has no backward'
    if cpu_ops.tracing():
        return 'a trace or compile is recording'
    if hidden.dtype != torch.float32 or torch.is_autocast_enabled('cpu'):
        return 'it computes in float32 (no CPU autocast)'
    ok, reason = cpu_ops.available()
    return None if ok else reason


def cpu_mixer_forward(hidden: Tensor, in_proj_weight: Tensor, out_proj_weight: Tensor,
                      stacked: Tuple[Tensor, ...], perms: Tensor) -> Tensor:
    """The mixer (``in_proj``, every path's conv, projections and gated scan, the paths' mean,
    ``out_proj``) for ``hidden`` (B, L, D) float32 on a CPU, without autograd.

    ``stacked``: the per-path parameters as
    :func:`~amvim_mm.ops.fused_mixer.pack_mixer_weights` stacks them (conv weight (P, E, K),
    conv bias, ``x_proj`` (P, R'+2N+pad, E) with ``R`` padded to ``R'``, ``dt_proj`` (P, E, R'),
    its bias, ``A`` (P, E, N), ``D``); ``perms`` (P, 1 or B, L) int: the token at each step of
    each path. Returns (B, L, D).
    """
    conv_w, conv_b, x_proj, dt_w, dt_b, A, D = stacked
    bsz, length, _ = hidden.shape
    P, E, N = A.shape
    if perms.shape[0] != P or perms.shape[-1] != length:
        raise ConfigError(f'perms must be (P={P}, 1 or B, L={length}); got {tuple(perms.shape)}')
    r = dt_w.shape[-1]
    xz = F.linear(hidden, in_proj_weight)                        # (B, L, 2E)
    x, z = xz[..., :E], xz[..., E:]
    y = hidden.new_empty(bsz, length, E)
    order = perms.to(torch.int32)
    for k in range(P):
        o = order[k].contiguous()
        u = cpu_ops.conv_silu(x, conv_w[k], conv_b[k], o, length)   # (B, L, E), path order
        x_dbl = F.linear(u, x_proj[k])                               # (B, L, W)
        # delta = dt_proj @ x_dbl[..., :R'] inside the kernel (R' FMAs per step)
        cpu_ops.scan_tokens(u, x_dbl[..., :r], A[k], x_dbl[..., r:r + N],
                            x_dbl[..., r + N:r + 2 * N], D[k], z, dt_b[k], o, y, k > 0, 1.0 / P,
                            dt_proj=dt_w[k])
    return F.linear(y, out_proj_weight)
