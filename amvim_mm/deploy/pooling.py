"""Adaptive average pooling that exports whatever the exporter knows of its input's size.

The TorchScript exporter writes ``adaptive_avg_pool2d`` only when its shape inference knows
the input's height and width (and they are multiples of the output size). After a reduced
backbone (token counts, gathers and scatters computed in the graph) it no longer knows them,
and UperNet's pooling module stops the export ("input size not accessible"). An export fixes
the image size, so the sizes are known when the model is traced: :class:`ExportableAdaptiveAvgPool2d`
then pools by two products with constant pooling matrices built at those sizes (each output
cell the mean of PyTorch's bin, ``floor(i n / s)`` to ``ceil((i + 1) n / s)``), which any
exporter writes and which equals ``adaptive_avg_pool2d`` to rounding for every size, multiples
or not. Outside an export it is ``adaptive_avg_pool2d`` itself.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from amvim_mm import runtime

__all__ = ['ExportableAdaptiveAvgPool2d', 'pooling_matrix', 'make_pools_exportable']


def pooling_matrix(n: int, s: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """(s, n): row ``i`` averages PyTorch's adaptive bin ``i`` of ``n`` cells into ``s``."""
    m = torch.zeros(s, n, dtype=dtype, device=device)
    for i in range(s):
        lo, hi = (i * n) // s, math.ceil((i + 1) * n / s)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


class ExportableAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` that exports by constant pooling matrices (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not runtime.exporting():
            return F.adaptive_avg_pool2d(x, self.output_size)
        h, w = (runtime.static_int(s) for s in x.shape[-2:])
        sh, sw = _pair(self.output_size, (h, w))
        ph = pooling_matrix(h, sh, x.dtype, x.device)
        pw = pooling_matrix(w, sw, x.dtype, x.device)
        return torch.matmul(torch.matmul(ph, x), pw.t())


def _pair(size, hw: Tuple[int, int]) -> Tuple[int, int]:
    """The output size as two ints (``None`` keeps the input's size, as PyTorch does)."""
    pair = size if isinstance(size, (tuple, list)) else (size, size)
    return tuple(hw[i] if p is None else int(p) for i, p in enumerate(pair))


def make_pools_exportable(model: nn.Module) -> int:
    """Replace every ``nn.AdaptiveAvgPool2d`` in ``model`` by
    :class:`ExportableAdaptiveAvgPool2d` (same output size, no parameters); returns how many."""
    count = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.AdaptiveAvgPool2d:
                setattr(parent, name, ExportableAdaptiveAvgPool2d(child.output_size))
                count += 1
    return count
