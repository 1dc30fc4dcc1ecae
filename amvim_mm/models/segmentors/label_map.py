"""Per-pixel labels of resized logits without the resized logits: :func:`label_map`.

mmseg's ``BaseSegmentor.postprocess_result`` resizes an image's whole (C, h, w) logits
bilinearly to its ``ori_shape`` (H, W) and takes ``argmax`` over the classes: the resized
C x H x W tensor (150 ADE20K classes at full image size) is written to memory, read back once,
and kept in the data sample. :func:`label_map` gives the same labels, bit for bit, resizing
``chunk`` classes at a time and keeping a running maximum and its class:

* **the same values**: each chunk goes through the ``F.interpolate`` call mmseg's ``resize``
  makes (bilinear, ``size``, ``align_corners``); bilinear interpolation is per channel, so a
  channel's values are those of the full call as long as both calls run the same kernel (see
  below);
* **the same decision**: ``torch.argmax`` takes the first maximum (ties go to the lower class)
  and treats NaN as larger than every number (the first NaN wins); a later chunk replaces the
  running maximum only where its own maximum (``torch.max``, same rule) is strictly greater, or
  is NaN where the running one is not;
* **memory**: chunk x H x W values plus a few H x W maps instead of C x H x W.

On CUDA with fp32 logits none of this runs: :func:`~amvim_mm.ops.label_map.fused_label_map`
computes the labels in one Triton kernel (PyTorch's CUDA interpolation reproduced bit for bit,
no resized values stored; faster than mmseg's two calls: docs/performance.md). The chunked path
below is the rest (CPU, other dtypes): the same labels with less memory, not faster.

When the kernel could differ, the whole resize runs as mmseg does it (same labels, no saving).
PyTorch's CPU bilinear kernel is chosen per call: its channel-vectorised kernel for
channels-last inputs with more than 3 channels, for outputs with H + W <= 128, and for exactly
3 channels with one thread, the generic kernel otherwise; the vectorised kernel's rounding
depends on a channel's position in its vector. So on the CPU a chunked call needs the generic
kernel for the full call (channels-first logits, H + W > 128, C != 3) and never passes 3
channels to one call. The CUDA kernels compute every channel by the same expression; only
channels-first logits are chunked there as well (a channel slice of channels-last logits would
switch CUDA's kernel). Other devices: the whole resize.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from amvim_mm.ops.label_map import fused_label_map

#: classes resized per step by default (a 16 x 512 x 683 fp32 chunk is 22 MiB)
DEFAULT_CHUNK = 16
#: PyTorch's CPU bilinear kernel is the channel-vectorised one for H + W at most this
_CPU_SMALL_OUTPUT = 128


def label_map(logits: torch.Tensor, size: Sequence[int], align_corners: bool, *,
              chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """The labels ``resize(logits, size, 'bilinear', align_corners).argmax(0, keepdim=True)``
    gives (mmseg's ``postprocess_result`` for C > 1), computed ``chunk`` classes at a time.

    Args:
        logits: (C, h, w) logits of one image, padding already removed (any float dtype).
        size: the output (H, W), e.g. the image's ``ori_shape``.
        align_corners: the decode head's ``align_corners``, as mmseg passes it.
        chunk: classes interpolated per step; peak extra memory chunk x H x W values.

    Returns:
        (1, H, W) int64 labels, identical to mmseg's.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ConfigError(f'label_map: logits must be a (C, h, w) tensor, got '
                          f'{getattr(logits, "shape", type(logits).__name__)}')
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f'label_map: chunk must be a positive int, got {chunk!r}')
    out_hw = _output_size(size)
    fused = fused_label_map(logits, out_hw, align_corners)     # CUDA fp32: one Triton kernel
    if fused is not None:
        return fused
    x = logits.unsqueeze(0)
    C = x.shape[1]
    if chunk >= C or not _chunks_are_exact(x, out_hw):
        return F.interpolate(x, out_hw, None, 'bilinear', align_corners)[0].argmax(
            0, keepdim=True)
    best = labels = None
    for c0, c1 in chunk_bounds(C, chunk):
        part = F.interpolate(x[:, c0:c1], out_hw, None, 'bilinear', align_corners)[0]
        value, index = torch.max(part, 0)
        del part
        if best is None:
            best, labels = value, index
            continue
        # strictly greater, or NaN where the running maximum is a number (argmax's rule)
        take = (value > best).logical_or_(value.isnan()).logical_and_(~best.isnan())
        best = torch.where(take, value, best)
        labels = torch.where(take, index.add_(c0), labels)
    return labels.unsqueeze(0)


def chunk_bounds(channels: int, chunk: int) -> List[Tuple[int, int]]:
    """[start, end) class ranges of at most ``chunk`` classes, none of exactly 3 classes (the
    CPU kernel takes another path for 3 channels: a 3 becomes 2 + 1)."""
    step = 2 if chunk == 3 else chunk
    bounds = [(c, min(c + step, channels)) for c in range(0, channels, step)]
    if bounds and bounds[-1][1] - bounds[-1][0] == 3:
        c = bounds.pop()[0]
        bounds += [(c, c + 2), (c + 2, c + 3)]
    return bounds


def _output_size(size: Sequence[int]) -> Tuple[int, int]:
    try:
        out = tuple(int(s) for s in size)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 2 or min(out) < 1:
        raise ConfigError(f'label_map: size must be (H, W) positive ints, got {size!r}')
    return out


def _chunks_are_exact(x: torch.Tensor, out_hw: Tuple[int, int]) -> bool:
    """Whether every chunk's interpolation runs the kernel of the full call (module
    docstring): channels-first logits on CUDA; on the CPU also H + W > 128 and C != 3."""
    channels_last = x.is_contiguous(memory_format=torch.channels_last) or (
        x.shape[1] > 1 and x.stride(1) == 1)
    if channels_last:
        return False
    if x.device.type == 'cuda':
        return True
    return x.device.type == 'cpu' and sum(out_hw) > _CPU_SMALL_OUTPUT and x.shape[1] != 3
