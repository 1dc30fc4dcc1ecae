"""The patch embedding and the position embedding's resize around the middle class token."""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.ops.fused_embed import pack_patch_weight
from amvim_mm.ops.fused_mixer import autocast_dtype
from amvim_mm.token_layout import cls_slot
from .input_check import check_image_shape



class PatchEmbed(nn.Module):
    """Conv patch embedding (``patch_embed.proj`` as in the official Vim checkpoints).

    Any input size of at least one patch is accepted. When ``(H - patch) % stride != 0`` the
    image is zero-padded at the bottom/right so that every pixel is covered (as mmpretrain's
    ``AdaptivePadding(padding='corner')``); the grid is then ``ceil((H - patch) / stride) + 1``.
    """

    def __init__(self, in_channels: int = 3, embed_dims: int = 192, patch_size: int = 16,
                 stride: int = 16) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.stride = stride
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size, stride=stride)

    def grid_size(self, H: int, W: int) -> Tuple[int, int]:
        # Python ints also under a trace: an export fixes the image size, and a traced
        # ceil division of sizes becomes an integer Div that truncates (a wrong padding)
        H, W = runtime.static_int(H), runtime.static_int(W)
        p, s = self.patch_size, self.stride
        if H < p or W < p:
            raise ConfigError(f'input image {H}x{W} is smaller than one patch ({p}x{p})')
        return -(-(H - p) // s) + 1, -(-(W - p) // s) + 1

    def check_input(self, x: torch.Tensor) -> Tuple[int, int]:
        """The patch grid of images ``x``, or a ConfigError naming what is wrong with them
        (not a tensor, not 4-D, wrong channel count, an empty batch, smaller than a patch)."""
        check_image_shape(type(self).__name__, x, self.proj.in_channels, self.patch_size)
        return self.grid_size(*x.shape[-2:])

    def _apply(self, fn, *args, **kwargs):
        self._gemm_cache = None   # .to() / .cuda() / .half(): rebuilt on the next call
        return super()._apply(fn, *args, **kwargs)

    def gemm_weight(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """``proj`` as a GEMM operand: ((C * p * p, D) weight, (D,) bias) in ``dtype``, cached
        until a parameter changes (for :func:`amvim_mm.ops.fused_embed.fused_patch_embed`)."""
        w, b = self.proj.weight, self.proj.bias
        key = (dtype, w.data_ptr(), w._version, b.data_ptr(), b._version)
        cache = getattr(self, '_gemm_cache', None)
        if cache is None or cache[0] != key:
            cache = (key, pack_patch_weight(w, b, dtype))
            self._gemm_cache = cache
        return cache[1]

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        gh, gw = self.check_input(x)
        H, W = (runtime.static_int(d) for d in x.shape[-2:])
        pad_h = (gh - 1) * self.stride + self.patch_size - H
        pad_w = (gw - 1) * self.stride + self.patch_size - W
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        p = self.patch_size
        if self.stride == p and x.is_cuda:
            # non-overlapping patches: one GEMM over the unfolded patches (cuDNN's conv for
            # a 16x16 stride-16 kernel is much slower on the GPU); same weights, same math
            # the unfold and autocast's cast of the patches in one copy
            B, C = x.shape[:2]
            dtype = autocast_dtype('cuda') or x.dtype
            patches = torch.empty(B, gh, gw, C, p, p, device=x.device, dtype=dtype)
            patches.copy_(x.reshape(B, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5))
            return F.linear(patches.view(B, gh * gw, -1),
                            self.proj.weight.reshape(self.proj.out_channels, -1),
                            self.proj.bias), (gh, gw)
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (gh, gw)


def resize_pos_embed(pos_embed: torch.Tensor, src_shape: Sequence[int], dst_shape: Sequence[int],
                     mode: str = 'bicubic', with_cls_token: bool = True) -> torch.Tensor:
    """Resize a Vim position embedding around its **middle** class token.

    Args:
        pos_embed: (1, M + 1, D) with the class token's entry at index ``M // 2`` (or (1, M, D)
            when ``with_cls_token`` is False).
        src_shape, dst_shape: (H, W) patch grids before and after.

    The class token's entry is taken out at ``M // 2``, the grid is resized (bicubic by default,
    ``align_corners=False``), and the entry is put back at ``M' // 2``. (The official fine-tune
    code takes index 0 as the class token, which is wrong for the middle-class-token models.)
    """
    src_h, src_w = src_shape
    dst_h, dst_w = dst_shape
    if pos_embed.dim() != 3 or pos_embed.shape[0] != 1:
        raise ConfigError(f'pos_embed must be (1, L, D), got {tuple(pos_embed.shape)}')
    extra = 1 if with_cls_token else 0
    M = src_h * src_w
    if pos_embed.shape[1] != M + extra:
        raise ConfigError(f'pos_embed has {pos_embed.shape[1]} tokens, but a {src_h}x{src_w} grid '
                          f'{"+ class token " if extra else ""}needs {M + extra}')
    if (src_h, src_w) == (dst_h, dst_w):
        return pos_embed
    if extra:
        mid = cls_slot(M)
        cls = pos_embed[:, mid:mid + 1]
        grid = torch.cat([pos_embed[:, :mid], pos_embed[:, mid + 1:]], dim=1)
    else:
        grid = pos_embed
    D = grid.shape[-1]
    dtype = grid.dtype
    # at least fp32 (a 16-bit embedding is resized in fp32; fp64 stays fp64)
    grid = grid.reshape(1, src_h, src_w, D).permute(0, 3, 1, 2).to(
        torch.promote_types(dtype, torch.float32))
    grid = F.interpolate(grid, size=(dst_h, dst_w), mode=mode, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, dst_h * dst_w, D).to(dtype)
    if not extra:
        return grid
    mid = cls_slot(dst_h * dst_w)
    return torch.cat([grid[:, :mid], cls, grid[:, mid:]], dim=1)


def infer_square_grid(num_patches: int) -> Tuple[int, int]:
    side = int(math.isqrt(num_patches))
    if side * side != num_patches:
        raise ConfigError(f'cannot infer the grid of a position embedding with {num_patches} '
                          'patch tokens (not a square); resize it with resize_pos_embed and '
                          'explicit shapes')
    return side, side
