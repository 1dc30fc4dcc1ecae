"""Fused label map: the labels of ``F.interpolate(logits, size, 'bilinear').argmax(0)`` in one
Triton kernel that never writes the resized logits (``_label_map_kernels.py``).

mmseg's post-processing resizes a (C, h, w) logit map to the image size and takes the argmax
over the classes: 150 x H x W values written and read back per image. The kernel computes, per
output pixel, the source rows / columns and weights and every class's value exactly as PyTorch's
CUDA ``upsample_bilinear2d`` kernel does (fp32), keeping the first maximum (``torch.argmax``:
ties to the lower class, NaN above every number). Exactness rests on reproducing nvcc's fused
multiply-adds of that kernel: of the 18 placements of the FMAs, one gives PyTorch's values bit
for bit (``VARIANT`` = (1, 1, 1): FMA in the source index, the first product of the inner
(columns) and of the outer (rows) mix; measured on an H200 with torch 2.11, 6 shapes incl.
align_corners, ``benchmarks/runs/2026-12-07_sweep``), and the kernel is compiled with
``enable_fp_fusion=False`` so that Triton fuses nothing else. ``tests/ops/test_label_map_kernel.py``
checks the labels against the reference on the GPU (and the kernel's argmax rule in Triton's
interpreter). The reference is :func:`reference_label_map` (mmseg's own two calls).

Taken for CUDA fp32 logits (other dtypes: PyTorch's half kernels round the resized values
before the argmax, which this kernel does not reproduce), output sizes other than the input's
(equal sizes: a plain argmax, as PyTorch copies then) and fewer than 2**31 elements.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

#: (source index, inner mix, outer mix) FMA placement that equals PyTorch's CUDA kernel
VARIANT = (1, 1, 1)
BLOCK = 256


def reference_label_map(logits: torch.Tensor, size: Sequence[int],
                        align_corners: bool) -> torch.Tensor:
    """mmseg's labels: the whole bilinear resize, then ``argmax`` over the classes (1, H, W)."""
    return F.interpolate(logits[None], tuple(size), mode='bilinear',
                         align_corners=align_corners)[0].argmax(0, keepdim=True)


def fused_applies(logits: torch.Tensor, size: Sequence[int]) -> bool:
    """Whether :func:`fused_label_map` runs for these logits (see the module docstring)."""
    if not (logits.is_cuda and logits.dtype == torch.float32 and logits.dim() == 3):
        return False
    C, h, w = logits.shape
    H, W = (int(s) for s in size)
    return max(C * h * w, C * H * W) < 2 ** 31 and (h, w) != (H, W) and _triton() is not None


@functools.lru_cache(maxsize=None)
def _triton():
    try:
        import triton  # noqa: F401

        from . import _label_map_kernels as k
    except ImportError:
        return None
    return k


def _scale(src: int, dst: int, align_corners: bool) -> float:
    """PyTorch's ``area_pixel_compute_scale`` in fp32 (no scale factor given)."""
    if align_corners:
        return float(torch.tensor(src - 1, dtype=torch.float32) / (dst - 1)) if dst > 1 else 0.
    return float(torch.tensor(src, dtype=torch.float32) / dst)


def fused_label_map(logits: torch.Tensor, size: Sequence[int], align_corners: bool,
                    values: bool = False) -> Optional[torch.Tensor]:
    """(1, H, W) int64 labels of ``logits`` (C, h, w) resized to ``size``, or None where the
    kernel does not apply (:func:`fused_applies`). ``values``: return the (C, H, W) resized
    values instead (the test of the arithmetic)."""
    import triton
    if not fused_applies(logits, size):
        return None
    k = _triton()
    x = logits.contiguous()
    C, h, w = x.shape
    H, W = (int(s) for s in size)
    labels = torch.empty(H * W, dtype=torch.int64, device=x.device)
    out = torch.empty(C, H * W, dtype=torch.float32, device=x.device) if values else labels
    S, inner, outer = VARIANT
    k.label_map_kernel[(triton.cdiv(H * W, BLOCK), )](
        x, labels, out, C, h, w, H, W, _scale(h, H, align_corners), _scale(w, W, align_corners),
        ALIGN=bool(align_corners), S=S, INNER=inner, OUTER=outer, WRITE_VALUES=values,
        BLOCK=BLOCK, enable_fp_fusion=False)
    return out.view(C, H, W) if values else labels.view(1, H, W)
