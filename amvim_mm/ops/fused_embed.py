"""The Vim-family embedding (patch GEMM, middle class token, position embedding) in one Triton
launch, for the fused path (inference: :func:`fused_patch_embed`; training: the autograd
Function :class:`FusedPatchEmbed`, the same kernel forward and a PyTorch backward).

The reference is :meth:`amvim_mm.models.vim.embed.VimEmbedding.embed`: the
non-overlapping patch convolution as a GEMM over unfolded patches, then the class token
concatenated at ``cls_slot(M)`` (= M // 2) and the fp32 position embedding added: five
launches, a fixed cost that does not shrink with the tokens under reduction (measurements in
benchmarks/README.md). Here one kernel reads the image once through the patch indices,
multiplies on tensor cores, and writes the fp32 token stream in its final layout.

Numerics as the reference: under 16-bit autocast the patches and weights are 16-bit, the
product accumulates in fp32, ``+ bias`` is rounded to the autocast dtype (what ``F.linear``
returns), then the fp32 position embedding is added. In fp32 the dot products are fp32 (tf32
only where ``torch.backends.cuda.matmul.allow_tf32`` allows it, as for ``F.linear``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from .triton_loader import jit_kernels
from amvim_mm.token_layout import cls_slot
from .fused_mixer import autocast_dtype

__all__ = ['fused_patch_embed', 'EMBED_CONFIG', 'embed_config', 'FusedPatchEmbed',
           'fused_patch_embed_train']

# Launch configuration (BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_N is capped at the
# width's next power of two. `tools/benchmark.py --suite gpu --parts tune-embed` times the
# candidates on Vim-T's shape (the timings: benchmarks/README.md, "The GPU issue's results");
# override: AMVIM_EMBED_CONFIG="64,256,8,1".
EMBED_CONFIG = (64, 128, 4, 4)


def embed_config() -> Tuple[int, int, int, int]:
    """The embedding kernel's launch configuration (``AMVIM_EMBED_CONFIG`` overrides)."""
    return runtime.settings().embed_config or EMBED_CONFIG


def _kernel(interpret: bool):
    return jit_kernels('_fused_embed_kernels', ('patch_embed_kernel', ),
                       'the fused embedding', interpret)[0]

def pack_patch_weight(weight: Tensor, bias: Tensor, dtype: torch.dtype
                      ) -> Tuple[Tensor, Tensor]:
    """A (D, C, p, p) patch convolution as the kernel's GEMM operand: ((C * p * p, D) weight,
    (D,) bias) in ``dtype``."""
    with torch.no_grad():
        return weight.reshape(weight.shape[0], -1).t().to(dtype).contiguous(), bias.to(dtype)


def fused_patch_embed(x: Tensor, weight_kd: Tensor, bias: Tensor, pos_embed: Tensor,
                      cls_token: Optional[Tensor], patch_size: int, grid) -> Tensor:
    """Tokens of images ``x`` (B, C, H, W) as the backbone's ``embed`` makes them.

    Args:
        weight_kd: the patch projection as a (C * p * p, D) matrix (``proj.weight`` flattened
            and transposed) in the compute dtype (the autocast dtype, or fp32).
        bias: (D,) in the same dtype; pos_embed: (1, M + 1, D) fp32 with the class token's
            entry at ``M // 2``; cls_token: (1, 1, D) (None: no class token, the stream is the
            M patch tokens and ``pos_embed``'s entry ``M // 2`` is skipped).
        patch_size: p (stride = p); grid: (gh, gw), patches past the image read zeros.

    Returns:
        (B, M + 1 or M, D) fp32.
    """
    import triton
    B, C, H, W = x.shape
    gh, gw = grid
    M = gh * gw
    K, D = weight_kd.shape
    p = patch_size
    if K != C * p * p or pos_embed.shape[-2:] != (M + 1, D):
        raise ConfigError(f'fused_patch_embed: weight {tuple(weight_kd.shape)} / pos_embed '
                          f'{tuple(pos_embed.shape)} do not fit {C} channels, {p}x{p} patches, '
                          f'{M} patches')
    if p & (p - 1) or p < 4:
        raise ConfigError(f'fused_patch_embed needs a power-of-two patch size >= 4; got {p}')
    x = x.contiguous()
    L = M + (cls_token is not None)
    out = torch.empty(B, L, D, device=x.device, dtype=torch.float32)
    rows = max(1, min(p, 64 // p))          # K step: 64 (p = 16: 4 patch rows of a channel)
    block_m, block_n, warps, stages = embed_config()
    block_n = min(block_n, triton.next_power_of_2(D))
    n_mb = triton.cdiv(M, block_m)
    lowp = weight_kd.dtype in (torch.float16, torch.bfloat16)
    tf32 = not lowp and x.is_cuda and torch.backends.cuda.matmul.allow_tf32
    cls = cls_token if cls_token is not None else pos_embed
    _kernel(not x.is_cuda)[(B * n_mb, triton.cdiv(D, block_n))](
        x, weight_kd.contiguous(), bias.contiguous(), pos_embed.float().contiguous(),
        cls.float().contiguous(), out, H, W, M, gw, D, cls_slot(M), n_mb, x.stride(0), x.stride(1),
        x.stride(2), out.stride(0), out.stride(1), P=p, C=C, ROWS=rows, BLOCK_M=block_m,
        BLOCK_N=block_n, HAS_CLS=cls_token is not None, ROUND=lowp,
        PREC=0 if lowp else (1 if tf32 else 2), num_warps=warps, num_stages=stages)
    return out


class FusedPatchEmbed(torch.autograd.Function):
    """The trainable fused embedding: the forward is :func:`fused_patch_embed` (one kernel), the
    backward is PyTorch ops.

    ``tokens = FusedPatchEmbed.apply(x, weight, bias, pos_embed, cls_token, patch_size, grid,
    compute_dtype)`` with ``weight`` the (D, C, p, p) patch convolution and ``bias`` (D,) as
    parameters (packed to the kernel's (C * p * p, D) operand in ``compute_dtype`` here, so the
    gradients reach the parameters), ``pos_embed`` the (1, M + 1, D) embedding **for this grid**
    (the caller passes ``pos_embed_for(grid)``, so a resized embedding's gradient flows back
    through the interpolation) and ``cls_token`` (1, 1, D) or None.

    Why the backward is PyTorch: its work is two GEMMs over the unfolded patches (``d_weight =
    patches^T @ d_tokens``, ``d_image = d_tokens @ weight^T``, the latter only when the image
    requires grad) plus column sums (bias, class token, position embedding over the batch).
    cuBLAS runs these GEMMs near peak, the unfold is one strided copy of the image, and the
    sums are single reductions, so a Triton kernel would save a few launches per training step
    (negligible next to the blocks' backward) and add a kernel to maintain. The numerics follow
    the unfused embedding (:meth:`~amvim_mm.models.vim.embed.VimEmbedding.embed`)
    under autocast: the patch rows' gradient is rounded to ``compute_dtype`` before
    the GEMMs (what the gradient of autocast's ``F.linear`` output is), in fp32 everything is
    fp32. The class token's and the position embedding's gradients are fp32 sums over the
    batch of the fp32 token gradient; the row ``M // 2`` of ``pos_embed`` gets none without a
    class token (the kernel skips it).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, pos_embed: Tensor,
                cls_token: Optional[Tensor], patch_size: int, grid,
                compute_dtype: torch.dtype) -> Tensor:
        w_kd, b = pack_patch_weight(weight, bias, compute_dtype)
        out = fused_patch_embed(x, w_kd, b, pos_embed, cls_token, patch_size, grid)
        ctx.save_for_backward(x, w_kd)
        ctx.meta = (patch_size, tuple(grid), compute_dtype, weight.shape, weight.dtype,
                    bias.dtype, pos_embed.dtype, None if cls_token is None else cls_token.dtype)
        return out

    @staticmethod
    def backward(ctx, d_out: Tensor):
        x, w_kd = ctx.saved_tensors
        p, (gh, gw), dtype, w_shape, w_dtype, b_dtype, pos_dtype, cls_dtype = ctx.meta
        need_x, need_w, need_b, need_pos, need_cls = ctx.needs_input_grad[:5]
        B, C, H, W = x.shape
        M = gh * gw
        mid = cls_slot(M)
        with torch.autocast(x.device.type, enabled=False):
            g = d_out.float()
            d_pos = d_cls = None
            if cls_dtype is not None:
                gp = torch.cat([g[:, :mid], g[:, mid + 1:]], 1)             # (B, M, D) patches
                if need_pos:
                    d_pos = g.sum(0, keepdim=True).to(pos_dtype)
                if need_cls:
                    d_cls = g[:, mid:mid + 1].sum(0, keepdim=True).to(cls_dtype)
            else:
                gp = g
                if need_pos:
                    s = g.sum(0, keepdim=True)
                    d_pos = torch.cat([s[:, :mid], s.new_zeros(1, 1, s.shape[-1]), s[:, mid:]],
                                      1).to(pos_dtype)
            gc = gp.to(dtype).reshape(B * M, -1)           # the GEMM output's gradient
            d_w = d_b = d_x = None
            if need_w:
                pad_h, pad_w = gh * p - H, gw * p - W
                xp = x if not (pad_h or pad_w) else torch.nn.functional.pad(
                    x, (0, pad_w, 0, pad_h))
                patches = torch.empty(B, gh, gw, C, p, p, device=x.device, dtype=dtype)
                patches.copy_(xp.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5))
                d_w = (gc.t() @ patches.view(B * M, -1)).reshape(w_shape).to(w_dtype)
            if need_b:
                d_b = gc.sum(0, dtype=torch.float32).to(b_dtype)
            if need_x:
                dp = (gc @ w_kd.t()).view(B, gh, gw, C, p, p)
                d_x = dp.permute(0, 3, 1, 4, 2, 5).reshape(B, C, gh * p, gw * p)
                d_x = d_x[:, :, :H, :W].to(x.dtype)
        return d_x, d_w, d_b, d_pos, d_cls, None, None, None


def fused_patch_embed_train(x: Tensor, weight: Tensor, bias: Tensor, pos_embed: Tensor,
                            cls_token: Optional[Tensor], patch_size: int, grid,
                            compute_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Differentiable :func:`fused_patch_embed` (:class:`FusedPatchEmbed`): gradients for the
    image (when it requires grad), the (D, C, p, p) ``weight``, ``bias``, ``pos_embed`` (the
    embedding for ``grid``, resized or not) and ``cls_token``. ``compute_dtype`` (default: the
    autocast dtype when autocast is on, else the weight's dtype) is the GEMM operands' dtype."""
    if compute_dtype is None:
        compute_dtype = autocast_dtype(x.device.type) or weight.dtype
    return FusedPatchEmbed.apply(x, weight, bias, pos_embed, cls_token, patch_size, tuple(grid),
                                 compute_dtype)
