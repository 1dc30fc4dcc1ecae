"""Token connection survival rate (AMVim Fig. 1c), with our definitions.

The paper gives no formula. **Decision** (ours):

* edge survival: the share of the original direct edges (pairs of patches adjacent in any
  path's order of the first block, union over paths) whose two endpoints both survive as their
  own tokens (not pruned, not merged with another patch);
* connectivity: the share of surviving patch tokens that keep at least one original direct
  neighbour that also survives.
"""
from __future__ import annotations

from typing import Dict

import torch

from amvim_mm.models.layout.scan_orders import scan_rank


def _edges(model, grid) -> torch.Tensor:
    M = grid[0] * grid[1]
    pairs = set()
    for spec in model.layers[0].paths:
        seq = torch.argsort(scan_rank(*grid, spec)).tolist()
        for a, b in zip(seq[:-1], seq[1:]):
            pairs.add((min(a, b), max(a, b)))
    e = torch.tensor(sorted(pairs), dtype=torch.long)
    assert int(e.max()) < M
    return e


@torch.no_grad()
def token_survival(model, images: torch.Tensor) -> Dict[str, float]:
    """Run ``model`` (with its reducer) on ``images``; survival measured after the last block."""
    was = model.training
    model.eval()
    model(images)
    model.train(was)
    ctx = model.last_context
    grid = ctx.grid
    M = grid[0] * grid[1]
    B = images.shape[0]
    if not ctx.reduced:
        own = torch.ones(B, M, dtype=torch.bool)
    else:
        src = ctx.source.cpu()
        size = torch.gather(ctx.size.cpu(), 1, src.clamp(min=0))
        own = (src >= 0) & (size == 1)
    e = _edges(model, grid)
    both = own[:, e[:, 0]] & own[:, e[:, 1]]
    edge_survival = both.float().mean().item()
    neigh = torch.zeros(B, M, dtype=torch.bool)
    neigh.index_put_((torch.arange(B).repeat_interleave(e.shape[0]), e[:, 0].repeat(B)),
                     both.flatten(), accumulate=True)
    neigh.index_put_((torch.arange(B).repeat_interleave(e.shape[0]), e[:, 1].repeat(B)),
                     both.flatten(), accumulate=True)
    survivors = own.sum().item()
    connectivity = (neigh & own).sum().item() / max(survivors, 1)
    return dict(edge_survival=edge_survival, connectivity=connectivity,
                own_token_share=own.float().mean().item(), num_edges=int(e.shape[0]))
