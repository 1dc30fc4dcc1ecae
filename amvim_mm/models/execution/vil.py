"""ViL's routes (and AMViL's): per block, the mLSTM cell on its fused Triton kernel
(inference on CUDA) or its PyTorch forms (parallel up to a length, chunkwise beyond, chosen
by the op from the sequence length). :func:`amvim_mm.ops.mlstm.kernel_misfit` says why the
kernel cannot run; this file only asks it."""
from __future__ import annotations

from typing import Optional

import torch

from amvim_mm.ops import mlstm
from .facts import ForwardFacts, image_size, plan_family
from .plan import NO_KERNEL, TORCH, TRITON, BlockPlan, Choice, ExecutionPlan

__all__ = ['plan_vil']


def plan_vil(model, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
    """The plan of one ViL / AMViL forward on images ``x``."""
    H, W = image_size(x)
    head_dim = model.cell_head_dim()

    def block(f: ForwardFacts, i: int, grad: bool) -> BlockPlan:
        misfit = 'fused=False by the caller' if fused is False else mlstm.kernel_misfit(
            f.device, f.autocast or f.dtype, head_dim, grad, f.exporting)
        cell = Choice(TORCH, f'{misfit}: parallel or chunkwise by length') if misfit else \
            Choice(TRITON, 'inference')
        return BlockPlan(NO_KERNEL, cell)
    return plan_family(model, x, fused, model.reduction_grid(H, W), block)
