"""VMamba's routes: per block, SS2D's cross-scan and cross-merge as Triton kernels (CUDA,
with their backward) or PyTorch gathers; the selective scan picks its own backend
(:mod:`amvim_mm.ops.backends`). :func:`amvim_mm.ops.cross_scan.kernel_misfit` says why the
kernels cannot run; this file only asks it."""
from __future__ import annotations

from typing import Optional

import torch

from amvim_mm.ops import cross_scan
from .facts import ForwardFacts, image_size, plan_family
from .plan import NO_KERNEL, TORCH, TRITON, BlockPlan, Choice, ExecutionPlan

__all__ = ['plan_vmamba']


def plan_vmamba(model, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
    """The plan of one VMamba forward on images ``x``."""
    size = image_size(x)

    def block(f: ForwardFacts, i: int, grad: bool) -> BlockPlan:
        misfit = 'fused=False by the caller' if fused is False else \
            cross_scan.kernel_misfit(f.device, f.exporting)
        cross = Choice(TORCH, misfit) if misfit else Choice(TRITON, 'CUDA')
        return BlockPlan(NO_KERNEL, Choice(TORCH, 'the selective scan picks its backend'),
                         (('cross_scan', cross), ))
    return plan_family(model, x, fused, model.stage_grid(model.reduction_stage, size), block)
