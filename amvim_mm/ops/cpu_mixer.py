"""The mixer's inference forward on a CPU, fused around the compiled kernels of
:mod:`amvim_mm.ops.cpu_ops`.

Every activation stays token-major (batch, L, E), as the GEMMs give it: per path one kernel reads
``x`` in the path's order and writes ``silu(conv(x))`` (no gather, no flip, no copy), one GEMM
gives ``x_dbl``, and the scan kernel forms ``delta`` from its low-rank columns (``dt_proj``, R
FMAs per step instead of a skinny GEMM), reads ``B`` and ``C`` straight out of ``x_dbl`` and
``z`` in token order, and adds ``y * silu(z) / P`` into the paths' sum at each step's token
(Vim's mean of the paths folded into the scan's store, as the GPU path folds it into
``out_proj``). The GEMMs (one per path and the two shared projections) are ATen's, called with
the kernels from one compiled op (``amvim_cpu::mixer_forward``): at ToMe's short sequences the
dozen Python-level calls and slices a path took cost more than the scan they fed.
ToP's hidden-state alignment (the pruned positions' zero-input decay folded into each kept
token's decay, ``gaps``) and ToP's importance score run inside the same op.
The unfused mixer on a CPU spent most of its time in the depthwise ``conv1d`` (oneDNN), the
flips and copies of the reversed path and the (batch, E, L, N) intermediates of the scan.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
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
                      stacked: Tuple[Tensor, ...], perms: Tensor, gaps: Optional[Tensor] = None,
                      gap_delta: str = 'bias', importance: bool = False
                      ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The mixer (``in_proj``, every path's conv, projections and gated scan, the paths' mean,
    ``out_proj``) for ``hidden`` (B, L, D) float32 on a CPU, without autograd.

    ``stacked``: the per-path parameters as
    :func:`~amvim_mm.ops.fused_mixer.pack_mixer_weights` stacks them (conv weight (P, E, K),
    conv bias, ``x_proj`` (P, R'+2N+pad, E) with ``R`` padded to ``R'``, ``dt_proj`` (P, E, R'),
    its bias, ``A`` (P, E, N), ``D``); ``perms`` (P, 1 or B, L) int: the token at each step of
    each path. ``gaps`` (P, B (or 1), L): ToP's hidden-state alignment, the pruned positions
    right before each step of path ``p`` in path ``p``'s order (aligned with ``perms[p]``),
    each decaying the state with zero input at the step size ``softplus(dt_bias)``
    (``gap_delta='bias'``) or the next kept token's own (``'token'``), as
    :meth:`BiMambaMixer.scan_path <amvim_mm.models.vim.mixer.BiMambaMixer.scan_path>`.
    Returns (B, L, D); with ``importance``, ``(output, importance)``: ToP's importance (B, L)
    float32, the sum over paths and channels of ``max(0, y_p)`` (each path's gated output,
    token order, before the paths' mean).
    """
    conv_w, conv_b, x_proj, dt_w, dt_b, A, D = stacked
    bsz, length, P = hidden.shape[0], hidden.shape[1], A.shape[0]
    if perms.shape[0] != P or perms.shape[-1] != length:
        raise ConfigError(f'perms must be (P={P}, 1 or B, L={length}); got {tuple(perms.shape)}')
    if gap_delta not in ('bias', 'token'):
        raise ConfigError(f"gap_delta must be 'bias' or 'token'; got {gap_delta!r}")
    if gaps is not None:
        if gaps.dim() != 3 or gaps.shape[0] != P or gaps.shape[1] not in (1, bsz) \
                or gaps.shape[2] != length:
            raise ConfigError(f'gaps must be (P={P}, B={bsz}, L={length}); '
                              f'got {tuple(gaps.shape)}')
        gaps = gaps.to(torch.float32).contiguous()
    out, imp = torch.ops.amvim_cpu.mixer_forward(hidden, in_proj_weight, out_proj_weight, conv_w,
                                                 conv_b, x_proj, dt_w, dt_b, A, D, perms, gaps,
                                                 gap_delta == 'token', importance)
    return (out, imp) if importance else out
