"""PlainMamba's routes: per block, the four snake-direction scans in one Triton kernel or the
unfused mixer (mamba-ssm's grouped scan between a cross-scan and a cross-merge, each Triton
on CUDA), and ToP's aligned-scan inputs from their Triton kernel or PyTorch ops. Each op's
own ``*_misfit`` function says why a kernel cannot run; this file only asks them."""
from __future__ import annotations

from typing import Optional

import torch

from amvim_mm.ops import cross_scan, plain_aligned, plain_scan
from .facts import ForwardFacts, image_size, plan_family
from .plan import NO_KERNEL, TORCH, TRITON, BlockPlan, Choice, ExecutionPlan

__all__ = ['plan_plain_mamba']


def _choice(misfit: Optional[str], why: str) -> Choice:
    return Choice(TORCH, misfit) if misfit else Choice(TRITON, why)


def plan_plain_mamba(model, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
    """The plan of one PlainMamba forward on images ``x``."""
    mixer = model.layers[0].mamba
    H, W = image_size(x)

    def block(f: ForwardFacts, i: int, grad: bool) -> BlockPlan:
        if fused is False:
            off = Choice(TORCH, 'fused=False by the caller')
            return BlockPlan(NO_KERNEL, off, (('cross_scan', off), ))
        snake = _choice(plain_scan.snake_scan_misfit(
            f.device, f.dtype, grad, f.exporting, f.batch, mixer.d_inner, mixer.d_state,
            mixer.scan_backend), 'the four directions in one kernel')
        if snake.route == TRITON:
            return BlockPlan(NO_KERNEL, snake)
        cross = _choice(cross_scan.kernel_misfit(f.device, f.exporting), 'CUDA')
        ops = (('cross_scan', cross), )
        red = f.reducer
        if red is not None and red.align_from is not None and i >= red.align_from:
            ops += (('aligned_inputs', _choice(plain_aligned.kernel_misfit(
                f.device, f.dtype, grad, f.exporting), 'inference')), )
        return BlockPlan(NO_KERNEL, snake, ops)
    return plan_family(model, x, fused, model.reduction_grid(H, W), block)
