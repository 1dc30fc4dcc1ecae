"""PlainMamba's layer (mixer block with L1's depthwise block) and its convolutional patch
embedding."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layout.grid_conv import grid_depthwise_conv
from ..layout.scan_context import ScanContext
from ..execution import BlockPlan, PlannedBlock
from ..skeleton.drop import DropPath
from .mixer import PlainMamba2D

STEM_CHANNELS = 64


class ConvPatchEmbed(nn.Module):
    """The official convolutional patch embedding: a 7x7 stride-2 stem conv + BN + ReLU,
    ``num_convs`` 3x3 convs + BN + ReLU, and a ``patch_size / 2`` projection of the same stride
    (8x8 stride 8 for the released models: stride 16 in all); inputs are zero-padded
    bottom/right to a multiple of the projection's stride (mmcv's
    ``AdaptivePadding('corner')``)."""

    def __init__(self, in_channels: int, embed_dims: int, num_convs: int,
                 patch_size: int = 16) -> None:
        super().__init__()
        self.patch_size = patch_size
        c = STEM_CHANNELS
        self.stem = nn.Sequential(nn.Conv2d(in_channels, c, 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        convs = []
        for _ in range(num_convs):
            convs += [nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c),
                      nn.ReLU(inplace=True)]
        self.convs = nn.Sequential(*convs)
        k = patch_size // 2
        self.projection = nn.Conv2d(c, embed_dims, k, k)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.convs(self.stem(x))
        h, w = x.shape[-2:]
        k = self.projection.stride[0]
        ph, pw = -h % k, -w % k
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        x = self.projection(x)
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:])


class PlainMambaLayer(PlannedBlock, nn.Module):
    """``x = x + drop_path(mamba(norm(x)))``, then (L1's layer 0) ``x = dw(x)`` on the grid:
    dw3x3 (no bias) + BN + GELU, no residual."""

    def __init__(self, embed_dims: int, drop_path: float, with_dwconv: bool,
                 norm_eps: float = 1e-5, **mixer_kwargs) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mamba = PlainMamba2D(embed_dims, **mixer_kwargs)
        self.drop_path = DropPath(drop_path)
        if with_dwconv:
            self.dw = nn.Sequential(
                nn.Conv2d(embed_dims, embed_dims, 3, 1, 1, groups=embed_dims, bias=False),
                nn.BatchNorm2d(embed_dims), nn.GELU())

    def merge_metric(self, x: torch.Tensor) -> torch.Tensor:
        """ToMe's similarity features of this layer's input: its normalised input."""
        return self.norm(x)

    def flops(self, L: int, official: bool) -> int:
        """FLOPs on ``L`` tokens: the norm (``official``: 5 per element), the mixer, L1's
        depthwise 3x3 block (``official``: eval BN 2 per element)."""
        C = self.norm.normalized_shape[0]
        ln, bn = (5, 2) if official else (0, 0)
        f = ln * L * C + self.mamba.flops(L, official)
        if hasattr(self, 'dw'):
            f += C * 9 * L + bn * C * L
        return f

    def forward(self, x: torch.Tensor, ctx: ScanContext, keep: Optional[torch.Tensor] = None,
                route: Optional[BlockPlan] = None) -> torch.Tensor:
        """``route``: this layer's part of the forward's execution plan (None: the ops
        decide for the call). ``keep``: a learned reducer's (B, L) keep mask (training): the
        mixer's masked forward; the dw block (L1's layer 0) sees the dropped cells as zero and leaves the
        dropped tokens as they are (inference does not touch a pruned token)."""
        if keep is not None:
            x = x + self.drop_path(self.mamba.forward_masked(self.norm(x), ctx, keep))
            if hasattr(self, 'dw'):
                kf = keep.to(x.dtype).unsqueeze(-1)
                g = grid_depthwise_conv(x * kf, ctx, self.dw[0])
                g = self.dw[1](g.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)
                x = torch.where(kf > 0.5, self.dw[2](g), x)
            return x
        y = self.mamba(self.norm(x), ctx, route)
        x = x + (self.drop_path(y) if self.training else y)
        if hasattr(self, 'dw'):
            B, L, C = x.shape
            # the 3x3 conv on the grid cells (absent cells zero); BN over the present tokens
            g = grid_depthwise_conv(x, ctx, self.dw[0])
            g = self.dw[1](g.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)
            x = self.dw[2](g)
        return x
