"""The Vim-family embedding (patch GEMM, middle class token, position embedding) in one Triton
launch, for the fused inference path.

The reference is :meth:`amvim_mm.models.backbones.vim_family.VimFamilyBackbone.embed`: the
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

import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import BackendUnavailableError, ConfigError
from amvim_mm.token_layout import cls_slot

__all__ = ['fused_patch_embed', 'EMBED_CONFIG', 'embed_config']

# Launch configuration (BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_N is capped at the
# width's next power of two. `tools/benchmark.py --suite gpu --parts tune-embed` times the
# candidates on Vim-T's shape (runs 18 and 19: (64, 128, 4, 4) 61.1 / 61.3 us, (64, 128, 4, 3)
# 61.7 / 61.9, (64, 256, 4, 1) 71.9, (64, 128, 8, 3) 103.7; the reference's five launches 127.5);
# override: AMVIM_EMBED_CONFIG="64,256,8,1".
EMBED_CONFIG = (64, 128, 4, 4)


def embed_config() -> Tuple[int, int, int, int]:
    """The embedding kernel's launch configuration (``AMVIM_EMBED_CONFIG`` overrides)."""
    return runtime.settings().embed_config or EMBED_CONFIG


@functools.lru_cache(maxsize=None)
def _kernel(interpret: bool):
    import triton

    from . import _fused_embed_kernels as k
    if interpret and not triton.knobs.runtime.interpret:
        raise BackendUnavailableError('on CPU tensors the fused embedding runs in Triton\'s '
                                      'interpreter only: set TRITON_INTERPRET=1 before '
                                      'starting Python (slow; tests)')
    return triton.jit(k.patch_embed_kernel)


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
