"""A backbone's output as tokens with their restore map (``out_type='tokens'``), for heads
that run on the kept tokens instead of the restored grid (:mod:`.token_heads`).

After a token reduction every grid cell is carried by one token: a merged token carries all
the cells merged into it (``ctx.source``), a pruned cell its frozen last feature
(``ctx.frozen``). :func:`token_grid` lists the **carriers** once each: the sequence's tokens
(the class token and EViT's fused token among them, carrying no cell) and, after a pruning
step, each sample's pruned cells. ``size`` is how many cells a carrier stands for (0: none),
``index`` the carrier of every cell. A head that computes per-token scores restores them with
:meth:`TokenGrid.restore` (a merged token's scores copied to every cell it stands for), which
equals running the head per cell on the restored grid; a head that mixes tokens (attention)
weighs a carrier by its size (:func:`~.token_heads.proportional_attention`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from amvim_mm.errors import ConfigError
from amvim_mm.token_layout import drop_cls
from ..layout.scan_context import ScanContext

__all__ = ['TokenGrid', 'token_grid']


class TokenGrid(NamedTuple):
    """tokens (B, N, D) the carriers; size (B, N) float, the cells each stands for; index
    (B, M) int64, the carrier of each cell in raster order (None: the carriers are the M cells
    in raster order, an unreduced forward); grid (H, W)."""
    tokens: torch.Tensor
    size: torch.Tensor
    index: Optional[torch.Tensor]
    grid: Tuple[int, int]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """A torch op given the whole TokenGrid (a neck or head that expects a feature map):
        one line naming the fix instead of a type error deep in the op."""
        raise ConfigError(f"{getattr(func, '__name__', func)} got a TokenGrid: out_type='tokens' "
                          "feeds TokenFCNHead / TokenMaskTransformerHead only; use "
                          "out_type='featmap' for other necks and heads")

    def restore(self, scores: torch.Tensor) -> torch.Tensor:
        """(B, N, C) per-carrier scores -> (B, C, H, W) on the grid."""
        if self.index is not None:
            idx = self.index.unsqueeze(-1).expand(-1, -1, scores.shape[-1])
            scores = torch.gather(scores, 1, idx)
        B, _, C = scores.shape
        return scores.transpose(1, 2).reshape(B, C, *self.grid)

    def dense(self) -> 'TokenGrid':
        """The same output as one carrier per cell (what a restored feature map holds)."""
        if self.index is None:
            return self
        idx = self.index.unsqueeze(-1).expand(-1, -1, self.tokens.shape[-1])
        tokens = torch.gather(self.tokens, 1, idx)
        return TokenGrid(tokens, tokens.new_ones(tokens.shape[:2]), None, self.grid)

    def map(self, fn) -> 'TokenGrid':
        """``fn`` (a per-token function such as a norm) applied to the carriers."""
        return self._replace(tokens=fn(self.tokens))


def token_grid(ctx: ScanContext, stream: torch.Tensor) -> TokenGrid:
    """The carriers of ``stream`` (B, L, D), the sequence of context ``ctx``."""
    B, L, D = stream.shape
    H, W = ctx.grid
    if not ctx.reduced:
        tokens = drop_cls(stream, ctx.cls_index)
        return TokenGrid(tokens, tokens.new_ones(B, H * W), None, (H, W))
    pos = ctx.pos if ctx.pos.dim() == 2 else ctx.pos.expand(B, -1)
    size = torch.where(pos >= 0, ctx.size.to(stream.dtype), stream.new_zeros(()))
    source = ctx.source
    if ctx.frozen is None:
        return TokenGrid(stream, size, source, (H, W))
    # pruned cells: each its own carrier, after the sequence in raster order, padded with
    # size-0 carriers to P = M - n_patches, a bound known without reading the device (every
    # patch token carries at least its own cell, so at most M - n_patches cells are pruned;
    # exact when nothing was merged): a CUDA graph captures it and an export fixes it
    pruned = source < 0
    rank = pruned.long().cumsum(1) - 1                                   # (B, M)
    P = H * W - ctx.n_patches
    at = torch.where(pruned, rank, torch.full_like(rank, P))             # P: dropped below
    cells = torch.arange(source.shape[1], device=source.device).expand(B, -1)
    order = torch.zeros(B, P + 1, dtype=torch.long, device=source.device).scatter_(
        1, at, cells)[:, :P]
    real = torch.zeros(B, P + 1, dtype=torch.bool, device=source.device).scatter_(
        1, at, pruned)[:, :P]
    frozen = torch.gather(ctx.frozen.to(stream.dtype), 1,
                          order.unsqueeze(-1).expand(-1, -1, D))
    index = torch.where(pruned, rank + L, source)
    return TokenGrid(torch.cat([stream, frozen], 1),
                     torch.cat([size, real.to(stream.dtype)], 1), index, (H, W))
