"""The fused mixer under autograd: training on the fused path.

:func:`fused_mixer_train` is :func:`~amvim_mm.ops.fused_mixer.fused_mixer_forward` with
gradients. ``in_proj`` and ``out_proj`` (with Vim's mean of the paths folded in) stay PyTorch
ops; everything between them - the causal conv of every path, ``x_proj``, ``dt_proj`` and the
gated scan - is one autograd Function, :class:`FusedSSM`, whose forward runs the inference
kernels and whose backward runs the kernels of :mod:`._fused_mixer_bwd_kernels`.

Memory habits of mamba-ssm: the Function keeps only its input ``xz`` and the (small) stacked
parameters; in the backward it recomputes the conv output, ``x_dbl`` and ``delta`` (one conv
launch and two batched GEMMs) and the scan's states, one (E, N) state per chunk of ``T`` steps
(transient), from which each chunk's states are rebuilt step by step into a small scratch.
The output ``y`` is kept by ``out_proj``'s autograd (as the unfused path keeps its scan
output).

Numerics: in the forward everything is the inference path's (the same kernels). The backward
accumulates in fp32; the GEMMs of the backward run in the forward's compute dtype (the autocast
dtype under AMP, as autograd runs the unfused path's GEMMs), fp32 otherwise.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm import runtime
from .fused_mixer import CONV_BLOCK, chunk_initial_states, launch_scan, mixer_front
from .triton_loader import jit_kernels

__all__ = ['FusedSSM', 'fused_mixer_train', 'BWD_CONFIG', 'bwd_config', 'bwd_groups',
           'auto_prefers_fused_training', 'TRAIN_MIN_LEN']

# Launch configuration of the scan's backward: (T steps per chunk, BLOCK_E channels, num_warps);
# override AMVIM_FUSED_BWD_CONFIG="32,32,2". A program's scratch holds T states of
# (BLOCK_E, N) fp32. The tune-bwd part of tools/benchmark.py times candidates; the timings
# behind this choice are in benchmarks/README.md ("Fused training and dense workloads again").
BWD_CONFIG = (32, 32, 2)


#: The automatic choice trains on the fused path only where it was at least as fast as the
#: unfused path (the mamba-ssm and causal-conv1d kernels): under 16-bit autocast with sequences
#: of at least TRAIN_MIN_LEN tokens. Below that, and in fp32, ``fused_mixer=True`` still halves
#: the activation memory, at a lower speed (timings: benchmarks/README.md, "Fused training and
#: long sequences").
TRAIN_MIN_LEN = 512


def auto_prefers_fused_training(seq_len: int, amp_dtype: Optional[torch.dtype]) -> bool:
    """The automatic choice for a training forward (see ``TRAIN_MIN_LEN``)."""
    return amp_dtype in (torch.bfloat16, torch.float16) and seq_len >= TRAIN_MIN_LEN


#: the scan backward splits each sequence into contiguous groups of chunks walked in parallel
#: until it has about this many programs (8 per SM of an H200): long sequences with small
#: batches (segmentation, detection) would otherwise leave the GPU idle
BWD_TARGET_PROGRAMS = 8 * 132


def bwd_groups(programs: int, n_chunks: int) -> int:
    """Chunk groups of the scan backward for ``programs`` = batch x channel blocks x paths
    (``AMVIM_FUSED_BWD_GROUPS`` would be a switch too many: the rule is deterministic)."""
    if programs >= BWD_TARGET_PROGRAMS:
        return 1
    return max(1, min(n_chunks, -(-BWD_TARGET_PROGRAMS // programs)))


def bwd_config() -> Tuple[int, int, int]:
    """The scan backward's launch configuration (``AMVIM_FUSED_BWD_CONFIG`` overrides)."""
    return runtime.settings().bwd_config or BWD_CONFIG


def _bwd_kernels(interpret: bool):
    """The backward kernels, compiled (or wrapped for the interpreter) once: (scan_bwd,
    scan_bwd_carry, scan_bwd_link, conv_bwd, conv_bwd_dx)."""
    return jit_kernels('_fused_mixer_bwd_kernels', (
        'scan_bwd_kernel', 'scan_bwd_carry_kernel', 'scan_bwd_link_kernel', 'conv_bwd_kernel',
        'conv_bwd_dx_kernel'), "the fused mixer's backward", interpret)


def _inverse(perm: Tensor) -> Tensor:
    """``inv[p, b, perm[p, b, i]] = i`` (int32, same shape)."""
    ar = torch.arange(perm.shape[-1], device=perm.device, dtype=torch.int32)
    return torch.empty_like(perm).scatter_(-1, perm.long(), ar.expand_as(perm)).contiguous()


class FusedSSM(torch.autograd.Function):
    """``y = scan(conv(xz[..., :E]), ...)`` gated by ``silu(xz[..., E:])``, every path at once
    (see the module docstring); arguments as :func:`fused_mixer_train` passes them."""

    @staticmethod
    def forward(ctx, xz: Tensor, perm: Tensor, conv_w: Tensor, conv_b: Tensor,
                x_proj_w: Tensor, dt_w: Tensor, dt_b: Tensor, A: Tensor, D: Tensor) -> Tensor:
        Bsz, L, E2 = xz.shape
        P, E, _ = conv_w.shape
        with torch.autocast(xz.device.type, enabled=False):
            xc, x_dbl, delta = mixer_front(xz, perm, conv_w, conv_b, x_proj_w, dt_w,
                                           with_delta=True)
            y = torch.empty(Bsz, L, P * E, device=xz.device, dtype=x_dbl.dtype)
            launch_scan(xc, x_dbl, delta, xz[..., E:], perm, dt_w, dt_b, A, D, y)
        ctx.save_for_backward(xz, perm, conv_w, conv_b, x_proj_w, dt_w, dt_b, A, D)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        import triton
        xz, perm, conv_w, conv_b, x_proj_w, dt_w, dt_b, A, D = ctx.saved_tensors
        Bsz, L, _ = xz.shape
        P, E, K = conv_w.shape
        N = A.shape[-1]
        R = dt_w.shape[-1]
        dev, dtype = xz.device, xz.dtype
        scan_bwd_k, carry_k, link_k, conv_bwd_k, conv_dx_k = _bwd_kernels(dev.type != 'cuda')
        T, block_e, warps = bwd_config()
        block_e = min(block_e, triton.next_power_of_2(E))
        n_chunks = triton.cdiv(L, T)
        dy = dy.contiguous()
        s_pb = perm.stride(1) if perm.shape[1] > 1 else 0
        with torch.autocast(dev.type, enabled=False):
            xc, x_dbl, delta = mixer_front(xz, perm, conv_w, conv_b, x_proj_w, dt_w,
                                           with_delta=True)
            z = xz[..., E:]
            dt_b32, A32, D32 = dt_b.float().contiguous(), A.float().contiguous(), \
                D.float().contiguous()
            n_eb = triton.cdiv(E, block_e)
            # the state before each chunk of T steps (chunk-parallel, fused_mixer)
            states = chunk_initial_states(xc, x_dbl, delta, dt_b32, A32, R, T)
            strides = (xc.stride(0), xc.stride(1), xc.stride(2), x_dbl.stride(0),
                       x_dbl.stride(1), x_dbl.stride(2), delta.stride(0), delta.stride(1),
                       delta.stride(2))
            tail = (z.stride(0), z.stride(1), perm.stride(0), s_pb, dy.stride(0), dy.stride(1))
            groups = bwd_groups(Bsz * n_eb * P, n_chunks)
            kin = states       # unused with one group
            if groups > 1:     # the gradient carried between chunks, then the groups in parallel
                kl = torch.empty_like(states)
                ds = torch.empty(P, Bsz, n_chunks, E, device=dev, dtype=torch.float32)
                carry_k[(Bsz * n_chunks, n_eb, P)](
                    delta, x_dbl, z, perm, dy, dt_b32, A32, kl, ds, L, E, R, n_chunks,
                    *strides[3:], *tail, N=N, T=T, BLOCK_E=block_e, num_warps=warps)
                kin = torch.empty_like(states)
                link_k[(Bsz, n_eb, P)](kl, ds, A32, kin, E, n_chunks, N=N, BLOCK_E=block_e,
                                       num_warps=warps)
                del kl, ds
            hs = torch.empty(P * Bsz * groups * n_eb, T, block_e, N, device=dev,
                             dtype=torch.float32)
            dxc = torch.empty_like(xc)
            dbc = torch.zeros(P, Bsz, L, 2 * N, device=dev, dtype=torch.float32)
            ddelta = torch.empty_like(delta)
            dz = torch.empty(P, Bsz, L, E, device=dev, dtype=torch.float32)
            part = torch.empty(P, Bsz * groups, E, N + 2, device=dev, dtype=torch.float32)
            scan_bwd_k[(Bsz * groups, n_eb, P)](
                xc, x_dbl, delta, z, perm, dy, dt_b32, A32, D32, states, kin, hs, dxc, dbc,
                ddelta, dz, part, L, E, R, n_chunks, groups, *strides, *tail, N=N, T=T,
                BLOCK_E=block_e, HAS_CARRY=groups > 1, num_warps=warps)
            del states, kin, hs
            part = part.sum(1)                                        # (P, E, N + 2)
            dA, dD, ddt_b = part[..., :N], part[..., N], part[..., N + 1]
            # dt_proj: delta = x_dbl[..., :R] @ dt_w.T
            BL = Bsz * L
            dd2 = ddelta.view(P, BL, E)
            xr = x_dbl.view(P, BL, -1)[..., :R]
            ddt_w = torch.bmm(dd2.transpose(1, 2), xr)                 # (P, E, R)
            dx_dbl = torch.zeros_like(x_dbl).view(P, BL, -1)
            dx_dbl[..., :R] = torch.bmm(dd2, dt_w.to(dtype))
            dx_dbl[..., R:R + 2 * N] = dbc.view(P, BL, 2 * N)
            del dbc, ddelta
            # x_proj: x_dbl = xc @ x_proj_w.T
            dxp = torch.bmm(dx_dbl.transpose(1, 2), xc.view(P, BL, E))  # (P, W, E)
            g = dxc.view(P, BL, E).add_(torch.bmm(dx_dbl, x_proj_w.to(dtype))).view(P, Bsz, L, E)
            del dx_dbl, xc
            dxz, dconv_w, dconv_b = _conv_backward(xz, perm, conv_w, conv_b, g, dz,
                                                   conv_bwd_k, conv_dx_k)
        return (dxz, None, dconv_w.to(conv_w.dtype), dconv_b.to(conv_b.dtype),
                dxp.to(x_proj_w.dtype), ddt_w.to(dt_w.dtype), ddt_b.to(dt_b.dtype),
                dA.to(A.dtype), dD.to(D.dtype))


def _conv_backward(xz: Tensor, perm: Tensor, conv_w: Tensor, conv_b: Tensor, g: Tensor,
                   dz: Tensor, conv_bwd_k, conv_dx_k) -> Tuple[Tensor, Tensor, Tensor]:
    """The conv's backward from ``g`` (P, B, L, E), the gradient of its SiLU output in path
    order: ``dpre`` (path order), the weight and bias sums, then the input's gradient in token
    order, with the gate's gradient ``dz.sum(0)`` in the upper half. Returns (dxz, dconv_w,
    dconv_b)."""
    import triton
    Bsz, L, _ = xz.shape
    P, E, K = conv_w.shape
    dev = xz.device
    s_pb = perm.stride(1) if perm.shape[1] > 1 else 0
    bl, be = CONV_BLOCK
    n_lb = triton.cdiv(L, bl)
    dpre = torch.empty(P, Bsz, L, E, device=dev, dtype=torch.float32)
    cpart = torch.empty(P, Bsz * n_lb, K + 1, E, device=dev, dtype=torch.float32)
    conv_bwd_k[(Bsz * n_lb, triton.cdiv(E, be), P)](
        xz, perm, conv_w.contiguous(), conv_b, g, dpre, cpart, L, E, n_lb, xz.stride(0),
        xz.stride(1), perm.stride(0), s_pb, g.stride(0), g.stride(1), g.stride(2), K=K,
        BLOCK_L=bl, BLOCK_E=be, num_warps=4)
    del g
    cpart = cpart.sum(1)                                       # (P, K + 1, E)
    dconv_w, dconv_b = cpart[:, :K].transpose(1, 2), cpart[:, K]
    dxz = torch.empty_like(xz)
    inv = _inverse(perm)
    conv_dx_k[(Bsz * n_lb, triton.cdiv(E, be))](
        dpre, inv, conv_w.contiguous(), dxz, L, E, P, n_lb, inv.stride(0),
        inv.stride(1) if inv.shape[1] > 1 else 0, dxz.stride(0), dxz.stride(1), K=K,
        BLOCK_L=bl, BLOCK_E=be, num_warps=4)
    dxz[..., E:] = dz.sum(0)
    return dxz, dconv_w, dconv_b


def fused_mixer_train(hidden: Tensor, in_proj_weight: Tensor, conv_weight: Tensor,
                      conv_bias: Tensor, x_proj_weight: Tensor, dt_proj_weight: Tensor,
                      dt_proj_bias: Tensor, A: Tensor, D: Tensor, perm: Tensor,
                      out_proj_cat: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """The fused mixer with autograd: arguments as
    :func:`~amvim_mm.ops.fused_mixer.fused_mixer_forward` (parameters as
    :func:`~amvim_mm.ops.fused_mixer.stack_mixer_params` stacks them, differentiably), the
    result and the gradients equal the unfused mixer's up to rounding."""
    xz = F.linear(hidden, in_proj_weight)                       # (B, L, 2E), autograd
    if xz.stride(-1) != 1:
        xz = xz.contiguous()
    perm = perm.to(device=xz.device, dtype=torch.int32).contiguous()
    y = FusedSSM.apply(xz, perm, conv_weight, conv_bias, x_proj_weight, dt_proj_weight,
                       dt_proj_bias, A, D)
    return F.linear(y, out_proj_cat)
