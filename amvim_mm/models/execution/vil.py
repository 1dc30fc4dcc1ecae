"""ViL's routes (and AMViL's): per block, the mLSTM cell on its fused Triton kernel
(inference on CUDA), its compiled CPU cell (float32 CPU inference) or its PyTorch forms
(parallel up to a length, chunkwise beyond, chosen by the op from the sequence length). :func:`amvim_mm.ops.mlstm.kernel_misfit` and
:func:`~amvim_mm.ops.mlstm.cpu_kernel_misfit` say why a kernel cannot run; this file only asks
them."""
from __future__ import annotations

from typing import Optional

import torch

from amvim_mm.ops import mlstm
from .facts import ForwardFacts, image_size, plan_family
from .plan import CPU, NO_KERNEL, TORCH, TRITON, BlockPlan, Choice, ExecutionPlan

__all__ = ['plan_vil']


def plan_vil(model, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
    """The plan of one ViL / AMViL forward on images ``x``."""
    H, W = image_size(x)
    head_dim = model.cell_head_dim()

    def block(f: ForwardFacts, i: int, grad: bool) -> BlockPlan:
        misfit = 'fused=False by the caller' if fused is False else mlstm.kernel_misfit(
            f.device, f.autocast or f.dtype, head_dim, grad, f.exporting)
        if not misfit:
            return BlockPlan(NO_KERNEL, Choice(TRITON, 'inference'))
        cpu_misfit = mlstm.cpu_kernel_misfit(f.device, f.autocast or f.dtype, grad,
                                             f.exporting or f.tracing)
        cell = Choice(CPU, 'inference: the compiled CPU cell') if not cpu_misfit else \
            Choice(TORCH, f'{misfit}; {cpu_misfit}: parallel or chunkwise by length')
        return BlockPlan(NO_KERNEL, cell)
    return plan_family(model, x, fused, model.reduction_grid(H, W), block)
