"""A stable argsort, running extrema and searchsorted that export: the reductions and path
orders sort keys with many ties (0 / 1 flags, equal scores) and rely on ties keeping their
sequence order.

``torch.argsort(..., stable=True)`` has no form in the TorchScript ONNX exporter (``aten::sort``
with ``stable`` fails there), and ONNX's ``TopK`` promises no order among ties. While a model is
exported (:func:`amvim_mm.runtime.exporting`) :func:`stable_argsort` computes each element's
stable rank from pairwise comparisons (``x_j`` before ``x_i`` when it is smaller, or equal with
``j < i``) and scatters the positions by rank: the same permutation, from element-wise ops,
``Less`` / ``Equal``, ``ReduceSum`` and ``ScatterElements`` (O(n^2) numbers per row: a few
hundred tokens cost less than one mixer). Outside an export it is ``torch.argsort``.
"""
from __future__ import annotations

import torch

from amvim_mm import runtime

__all__ = ['stable_argsort', 'running_max', 'running_min', 'search_sorted']


def stable_argsort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> torch.Tensor:
    """``torch.argsort(x, dim, descending, stable=True)`` (see the module docstring)."""
    if not runtime.exporting():
        return torch.argsort(x, dim=dim, descending=descending, stable=True)
    last = x.dim() - 1
    d = dim % x.dim()
    moved = x if d == last else x.transpose(d, last)
    n = moved.shape[-1]
    xi, xj = moved.unsqueeze(-1), moved.unsqueeze(-2)        # [..., i, j]
    pos = torch.arange(n, device=x.device)
    before = (xj > xi) if descending else (xj < xi)
    tie = (xj == xi) & (pos.view(1, -1) < pos.view(-1, 1))
    rank = (before | tie).sum(-1)                              # stable rank of element i
    order = torch.zeros_like(rank).scatter(-1, rank, pos.expand_as(rank).contiguous())
    return order if d == last else order.transpose(d, last)


def running_max(x: torch.Tensor) -> torch.Tensor:
    """``torch.cummax(x, dim=-1).values`` (ONNX has no cummax: under an export the maximum of
    each prefix from a masked pairwise table, O(n^2) numbers per row)."""
    if not runtime.exporting():
        return torch.cummax(x, dim=-1).values
    return _prefix(x).amax(-1)


def running_min(x: torch.Tensor) -> torch.Tensor:
    """``torch.cummin(x, dim=-1).values`` (see :func:`running_max`)."""
    if not runtime.exporting():
        return torch.cummin(x, dim=-1).values
    return _prefix(x).amin(-1)


def _prefix(x: torch.Tensor) -> torch.Tensor:
    """[..., i, j] = x[..., j] for j <= i, else x[..., 0] (in every prefix: no sentinel)."""
    n = x.shape[-1]
    pos = torch.arange(n, device=x.device)
    upto = pos.view(1, -1) <= pos.view(-1, 1)                 # [i, j]: j <= i
    return torch.where(upto, x.unsqueeze(-2), x[..., :1].unsqueeze(-1))


def search_sorted(sorted_rows: torch.Tensor, values: torch.Tensor, right: bool = False
                  ) -> torch.Tensor:
    """``torch.searchsorted(sorted_rows, values, right=right)`` for (B, M) rows and (B, L)
    values (ONNX has no searchsorted: under an export the count of row entries below (or, with
    ``right``, not above) each value from a pairwise table)."""
    if not runtime.exporting():
        return torch.searchsorted(sorted_rows, values.contiguous(), right=right)
    rows, v = sorted_rows.unsqueeze(1), values.unsqueeze(2)      # (B, 1, M), (B, L, 1)
    return ((rows <= v) if right else (rows < v)).sum(-1)
