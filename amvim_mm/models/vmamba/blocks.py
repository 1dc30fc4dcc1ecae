"""VMamba's layers (channel-last): the stems, the downsamples, the VSS block and a stage.

Parameter names equal the official classification checkpoint's (``patch_embed.{0,2,5,7}``,
``layers.{i}.blocks.{j}.{norm,op,norm2,mlp}``, ``layers.{i}.downsample.{1,3}``).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from ..layout.scan_context import ScanContext
from ..execution import BlockPlan, PlannedBlock
from ..skeleton.drop import DropPath
from .ss2d import SS2D

class _ToLast(nn.Module):
    """NCHW -> NHWC (the official ``Permute(0, 2, 3, 1)``; holds no weights)."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1)


class _ToFirst(nn.Module):
    """NHWC -> NCHW."""

    def forward(self, x):
        return x.permute(0, 3, 1, 2)


def patch_embed_v2(in_channels: int, dims: int, patch_size: int = 4) -> nn.Sequential:
    """conv k3 s2 -> LN -> GELU -> conv k3 s2 -> LN (indices as the official Sequential)."""
    if patch_size != 4:
        raise ConfigError(f'VMamba patch embed v2 has stride 4, got patch_size={patch_size}')
    return nn.Sequential(
        nn.Conv2d(in_channels, dims // 2, 3, 2, 1), _ToLast(), nn.LayerNorm(dims // 2),
        _ToFirst(), nn.GELU(), nn.Conv2d(dims // 2, dims, 3, 2, 1), _ToLast(),
        nn.LayerNorm(dims))


def patch_embed_v1(in_channels: int, dims: int, patch_size: int = 4) -> nn.Sequential:
    """conv k4 s4 -> LN (Vanilla VMamba)."""
    return nn.Sequential(nn.Conv2d(in_channels, dims, patch_size, patch_size), _ToLast(),
                         nn.LayerNorm(dims))


def downsample_v3(dim: int, out_dim: int) -> nn.Sequential:
    """conv k3 s2 p1 -> LN on NHWC input (odd sizes round up)."""
    return nn.Sequential(_ToFirst(), nn.Conv2d(dim, out_dim, 3, 2, 1), _ToLast(),
                         nn.LayerNorm(out_dim))


class PatchMerging2D(nn.Module):
    """Swin's patch merging on NHWC input (Vanilla VMamba's downsample): 2x2 neighbours
    concatenated (odd sizes zero-padded), LN, linear 4C -> 2C."""

    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x):
        H, W = x.shape[1:3]
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                      -1)
        return self.reduction(self.norm(x))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class VSSBlock(PlannedBlock, nn.Module):
    """``x = x + drop_path(op(norm(x))); x = x + drop_path(mlp(norm2(x)))`` on (B, L, d)
    tokens (the MLP half is absent when ``mlp_ratio == 0``, Vanilla VMamba)."""

    def __init__(self, dim: int, drop_path: float, mlp_ratio: float, norm_eps: float,
                 **ss2d_kwargs) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.op = SS2D(dim, **ss2d_kwargs)
        self.drop_path = DropPath(drop_path)
        self.mlp_branch = mlp_ratio > 0
        if self.mlp_branch:
            self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
            self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def merge_metric(self, x: torch.Tensor) -> torch.Tensor:
        """ToMe's similarity features of this block's input: its normalised input."""
        return self.norm(x)

    def flops(self, L: int, official: bool) -> int:
        """FLOPs on ``L`` tokens: the norms (``official``: 5 per element), SS2D, the MLP."""
        ln = 5 if official else 0
        d = self.op.d_model
        f = ln * L * d + self.op.flops(L, official)
        if self.mlp_branch:
            f += ln * L * d + 2 * L * d * self.mlp.fc1.out_features
        return f

    def forward(self, x: torch.Tensor, ctx: ScanContext, keep: Optional[torch.Tensor] = None,
                route: Optional[BlockPlan] = None) -> torch.Tensor:
        """``route``: this block's part of the forward's execution plan (None: the ops
        decide for the call). ``keep``: a learned reducer's (B, L) keep mask (training):
        SS2D's masked forward, and the MLP leaves the dropped tokens as they are (inference
        does not touch a pruned token)."""
        x = x + self.drop_path(self.op(self.norm(x), ctx, keep=keep, route=route))
        if self.mlp_branch:
            h = self.mlp(self.norm2(x))
            if keep is not None:
                h = h * keep.to(h.dtype).unsqueeze(-1)
            x = x + self.drop_path(h)
        return x


class VSSLayer(nn.Module):
    """One stage: ``blocks`` and its ``downsample`` (Identity in the last stage)."""

    def __init__(self, blocks: List[VSSBlock], downsample: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


def conv_out(n: int, k: int, s: int, p: int) -> int:
    """Output size of a convolution."""
    return (n + 2 * p - k) // s + 1


def stem_flops(kind: str, cin: int, C: int, H: int, W: int, ln: int) -> Tuple[int, int, int]:
    """(FLOPs, h, w) of the patch embed ``kind`` (``'v2'``/``'v1'``) on an H x W image; ``ln``
    FLOPs per LayerNorm element."""
    if kind == 'v2':
        h1, w1 = conv_out(H, 3, 2, 1), conv_out(W, 3, 2, 1)
        h, w = conv_out(h1, 3, 2, 1), conv_out(w1, 3, 2, 1)
        return (C // 2) * cin * 9 * h1 * w1 + ln * (C // 2) * h1 * w1 \
            + C * (C // 2) * 9 * h * w + ln * C * h * w, h, w
    h, w = H // 4, W // 4
    return C * cin * 16 * h * w + ln * C * h * w, h, w


def downsample_flops(kind: str, dim: int, out_dim: int, h: int, w: int, ln: int
                     ) -> Tuple[int, int, int]:
    """(FLOPs, h, w) of the downsample ``kind`` (``'v3'`` conv / ``'v1'`` patch merging) of an
    h x w grid."""
    if kind == 'v3':
        h, w = conv_out(h, 3, 2, 1), conv_out(w, 3, 2, 1)
        return out_dim * dim * 9 * h * w + ln * out_dim * h * w, h, w
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    return ln * 4 * dim * h * w + h * w * 4 * dim * out_dim, h, w
