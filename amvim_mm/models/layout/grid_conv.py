"""A depthwise convolution over the tokens of a sequence that may have lost some grid cells.

Mixers with a 2D depthwise conv (VMamba's SS2D 3x3, PlainMamba's 7x7 and L1's layer-0 3x3)
read each token's neighbours on the patch grid. After token reduction not every cell has its
own token. **Decision**: the grid is filled as the dense restore fills it, every cell with the
token that carries it (a merged token at all of its cells: ToMe's "unmerge", so merging alone
leaves no holes), and a **pruned** cell (or one fused into EViT's token) holds **zero** (the
block then equals the full-grid block with zero input there, the same convention as the scan's
hidden-state alignment); the conv runs on that grid and each token reads its own cell. A token
without a cell (EViT's fused token) sees no neighbours: the centre tap only.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .scan_context import ScanContext


def whole_grid(ctx: ScanContext) -> bool:
    """The sequence is the whole grid in raster order (no token removed yet, no extra
    token): the official computation needs no index."""
    return (ctx.full_grid or not ctx.reduced) and ctx.cls_index < 0 and not ctx.has_fused


def grid_depthwise_conv(x: torch.Tensor, ctx: ScanContext, conv: nn.Conv2d) -> torch.Tensor:
    """``conv`` (depthwise, 'same' padding) of (B, L, E) tokens on their grid cells -> (B, L, E),
    before any activation.

    On the whole grid this is the conv of the NCHW view of the channel-last tokens (no
    transposes); else the grid is filled from ``ctx.source`` (module docstring).
    """
    B, L, E = x.shape
    H, W = ctx.grid
    w, b = conv.weight, conv.bias
    if whole_grid(ctx):
        g = x.reshape(B, H, W, E).permute(0, 3, 1, 2)
        out = F.conv2d(g, w, b, padding=conv.padding, groups=conv.groups)
        return out.permute(0, 2, 3, 1).reshape(B, L, E)
    pos = ctx.pos if ctx.pos.dim() == 2 else ctx.pos.expand(B, -1)
    cell = torch.where(pos >= 0, pos, torch.full_like(pos, H * W))   # extras -> a spare row
    src = ctx.source                                   # (B, M): token carrying each cell
    if src is None:
        buf = x.new_zeros(B, H * W + 1, E)
        buf.scatter_(1, cell.unsqueeze(-1).expand(-1, -1, E), x)
        grid = buf[:, :H * W]
    else:
        grid = torch.gather(x, 1, src.clamp(min=0).unsqueeze(-1).expand(-1, -1, E))
        grid = torch.where((src >= 0).unsqueeze(-1), grid, torch.zeros_like(grid))
    g = grid.view(B, H, W, E).permute(0, 3, 1, 2)     # the channel-last grid's NCHW view
    out = F.conv2d(g, w, b, padding=conv.padding, groups=conv.groups)
    out = out.permute(0, 2, 3, 1).reshape(B, H * W, E)
    out = torch.gather(out, 1, cell.clamp(max=H * W - 1).unsqueeze(-1).expand(-1, -1, E))
    if ctx.cls_index >= 0 and not bool(ctx.has_fused):    # a token without a cell reads zero
        out = torch.where((pos >= 0).unsqueeze(-1), out, torch.zeros_like(out))
    if not bool(ctx.has_fused):
        return out
    # tokens without a cell (EViT's fused token): the centre tap only
    ch, cw = conv.kernel_size[0] // 2, conv.kernel_size[1] // 2
    alone = x * w[:, 0, ch, cw].to(x.dtype) + (0 if b is None else b.to(x.dtype))
    return torch.where((pos >= 0).unsqueeze(-1), out, alone)
