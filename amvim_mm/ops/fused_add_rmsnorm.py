"""The Vim block's residual add + RMSNorm as a trainable fused operation (Triton forward and
backward kernels in :mod:`amvim_mm.ops._fused_norm_kernels`).

Forward: ``res = residual + s[b] * hidden`` (``s``: the per-sample stochastic-depth factor
``mask / keep_prob`` of :meth:`amvim_mm.models.skeleton.drop.DropPath.scale`, None = 1;
``residual`` None = 0) in fp32, and ``out = RMSNorm(res) * weight`` (the project's
:class:`~amvim_mm.models.vim.norm.RMSNorm`) in the autocast dtype, or in the weight's
dtype without autocast, like :func:`amvim_mm.ops.fused_mixer.fused_add_rmsnorm`, the
inference-only kernel (which stays the choice when no gradient is wanted, and which also does
ToMe merges; this one does not).

Backward (one kernel): with ``x_hat = res * rstd`` and ``d_res_total = d_res + rstd * (g -
x_hat * mean(g * x_hat))``, ``g = d_out * weight``: ``d_hidden = s[b] * d_res_total`` (in
``hidden``'s dtype), ``d_residual = d_res_total`` (in ``residual``'s dtype), ``d_weight = sum
over rows of d_out * x_hat`` (per-program partials, then one ``torch.sum``: deterministic).
No gradient for ``s`` (a sampled constant). Saved for the backward: ``res`` (an output the
next block reads anyway), the (rows,) ``rstd``, the weight and ``s``; ``x_hat`` is recomputed.

On CUDA the kernels are compiled; on CPU tensors they run in Triton's interpreter when
``TRITON_INTERPRET=1`` was set before Python started (slow; tests). The arithmetic is fp32
(fp64 when the stream is fp64).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from amvim_mm.errors import ConfigError
from .triton_loader import jit_kernels
from .fused_mixer import autocast_dtype

__all__ = ['FusedAddRMSNorm', 'fused_add_rmsnorm_train']

FWD_BLOCK_M = 8
BWD_BLOCK_M = 8


def _kernels(interpret: bool):
    """(forward, backward) kernels, compiled (or wrapped for the interpreter) once."""
    return jit_kernels('_fused_norm_kernels', ('add_rmsnorm_fwd_kernel', 'add_rmsnorm_bwd_kernel'),
                       'the fused add + RMSNorm', interpret)

def _backward_programs(device: torch.device, n_blocks: int) -> int:
    """Programs of the backward kernel: a few per SM on CUDA (each walks several row blocks and
    keeps its ``d_weight`` partial in registers), 64 at most in the interpreter."""
    if device.type == 'cuda':
        cap = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        cap = 64
    return max(1, min(n_blocks, cap))


class FusedAddRMSNorm(torch.autograd.Function):
    """``(out, res) = FusedAddRMSNorm.apply(hidden, residual, weight, scale, eps, out_dtype)``
    (see the module docstring; :func:`fused_add_rmsnorm_train` is the convenient entry).

    ``hidden``: (B, ..., D); ``residual``: the same shape (any float dtype; fp32 in the block)
    or None; ``weight``: (D,); ``scale``: (B,) or None; ``out_dtype``: the dtype of ``out``.
    Returns ``out`` (``out_dtype``) and ``res`` (fp32, fp64 for fp64 streams)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, residual: Optional[Tensor], weight: Tensor,
                scale: Optional[Tensor], eps: float, out_dtype: torch.dtype
                ) -> Tuple[Tensor, Tensor]:
        import triton
        D = hidden.shape[-1]
        if weight.shape != (D, ):
            raise ConfigError(f'fused add + RMSNorm: weight {tuple(weight.shape)} does not fit '
                              f'width {D}')
        if residual is not None and residual.shape != hidden.shape:
            raise ConfigError(f'fused add + RMSNorm: residual {tuple(residual.shape)} and hidden '
                              f'{tuple(hidden.shape)} differ')
        B = hidden.shape[0]
        if scale is not None and scale.shape != (B, ):
            raise ConfigError(f'fused add + RMSNorm: scale must be ({B},), got '
                              f'{tuple(scale.shape)}')
        f64 = hidden.dtype == torch.float64 or (residual is not None and
                                                residual.dtype == torch.float64)
        acc = torch.float64 if f64 else torch.float32
        h = hidden.contiguous()
        r = residual.contiguous() if residual is not None else h
        w = weight.contiguous()
        s = scale.to(acc).contiguous() if scale is not None else h
        M = h.numel() // D
        res = torch.empty(h.shape, device=h.device, dtype=acc)
        out = torch.empty(h.shape, device=h.device, dtype=out_dtype)
        rstd = torch.empty(M, device=h.device, dtype=acc)
        fwd, _ = _kernels(h.device.type != 'cuda')
        if M:
            fwd[(triton.cdiv(M, FWD_BLOCK_M), )](
                h, r, s, w, out, res, rstd, M, D, max(1, M // B), float(eps),
                HAS_RES=residual is not None, HAS_SCALE=scale is not None,
                BLOCK_M=FWD_BLOCK_M, BLOCK_D=triton.next_power_of_2(D), num_warps=4)
        ctx.save_for_backward(res, rstd, w, s if scale is not None else None)
        ctx.meta = (hidden.dtype, None if residual is None else residual.dtype, weight.dtype,
                    scale is not None, max(1, M // B))
        ctx.set_materialize_grads(False)
        return out, res

    @staticmethod
    def backward(ctx, d_out: Optional[Tensor], d_res: Optional[Tensor]):
        import triton
        res, rstd, w, s = ctx.saved_tensors
        h_dtype, r_dtype, w_dtype, has_scale, rows_per_sample = ctx.meta
        need_dh, need_dr, need_dw = ctx.needs_input_grad[:3]
        need_dr = need_dr and r_dtype is not None
        if not (need_dh or need_dr or need_dw):
            return None, None, None, None, None, None
        D = res.shape[-1]
        M = res.numel() // D
        if d_out is None:
            d_out = torch.zeros_like(res)
        d_out = d_out.contiguous()
        has_dres = d_res is not None
        d_res = d_res.contiguous() if has_dres else res
        dh = torch.empty(res.shape, device=res.device, dtype=h_dtype) if need_dh else None
        dr = torch.empty(res.shape, device=res.device, dtype=r_dtype) if need_dr else None
        n_blocks = triton.cdiv(M, BWD_BLOCK_M)
        n_prog = _backward_programs(res.device, n_blocks)
        dw = torch.zeros(n_prog, D, device=res.device, dtype=res.dtype) if need_dw else None
        _, bwd = _kernels(res.device.type != 'cuda')
        if M:
            bwd[(n_prog, )](
                res, rstd, w, s if has_scale else res, d_out, d_res,
                dh if need_dh else res, dr if need_dr else res, dw if need_dw else res,
                M, D, rows_per_sample, n_blocks, HAS_DRES=has_dres, HAS_SCALE=has_scale,
                NEED_DH=need_dh, NEED_DR=need_dr, NEED_DW=need_dw, BLOCK_M=BWD_BLOCK_M,
                BLOCK_D=triton.next_power_of_2(D), num_warps=4)
        d_w = dw.sum(0).to(w_dtype) if need_dw else None
        return dh, dr, d_w, None, None, None


def fused_add_rmsnorm_train(hidden: Tensor, residual: Optional[Tensor], weight: Tensor,
                            eps: float, scale: Optional[Tensor] = None,
                            out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """``(normed, residual)`` of the block's add + RMSNorm, differentiable in ``hidden``,
    ``residual`` and ``weight`` (:class:`FusedAddRMSNorm`).

    ``residual`` None: ``res = s * hidden`` (block 0; the block passes no ``scale`` then, as
    the unfused block applies no stochastic depth to the first stream). ``scale``: (B,)
    per-sample factor of ``hidden`` (:meth:`DropPath.scale`), None = 1. ``out_dtype`` (default:
    the autocast dtype when autocast is on, else the weight's dtype) is ``normed``'s dtype;
    ``residual`` comes back fp32 (fp64 for fp64 streams).
    """
    if out_dtype is None:
        out_dtype = autocast_dtype(hidden.device.type) or weight.dtype
    return FusedAddRMSNorm.apply(hidden, residual, weight, scale, float(eps), out_dtype)
