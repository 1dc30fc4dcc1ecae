"""One Vim block: residual add + RMSNorm + mixer, each on the route the forward's execution plan
names (:mod:`amvim_mm.models.execution`)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from amvim_mm.errors import ConfigError
from amvim_mm.ops import cpu_ops
from amvim_mm.ops.fused_add_rmsnorm import fused_add_rmsnorm_train
from amvim_mm.ops.fused_mixer import fused_add_rmsnorm
from amvim_mm.ops.token_merge import MergePlan, apply_merge_plan
from ..execution import (CPU, TRITON, TRITON_TRAIN, BlockFacts, BlockPlan, PlannedBlock,
                         call_facts, plan_vim)
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import normalize_order
from ..skeleton.drop import DropPath
from .norm import RMSNorm


class VimBlock(PlannedBlock, nn.Module):
    """``residual = residual + drop_path(h); h = mixer(norm(residual))`` with an fp32 residual."""

    def __init__(self, mixer: nn.Module, embed_dims: int, paths: Sequence,
                 drop_path: float = 0., norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = RMSNorm(embed_dims, eps=norm_eps)
        self.mixer = mixer
        self.drop_path = DropPath(drop_path)
        self.path_keys = tuple(normalize_order(p) for p in paths)   # validated once
        if len(self.path_keys) != getattr(mixer, 'num_paths', len(self.path_keys)):
            raise ConfigError(f'{type(mixer).__name__} has {mixer.num_paths} paths, but the block '
                              f'got {len(self.path_keys)} scan orders')
        self.paths = tuple(dict(k) for k in self.path_keys)

    def block_facts(self, training: bool) -> BlockFacts:
        """What the execution plan needs of this block (:mod:`amvim_mm.models.execution`)."""
        norm, grad = self.norm, torch.is_grad_enabled()
        return BlockFacts(
            norm_kernel=type(norm) is RMSNorm and not (
                norm._forward_hooks or norm._forward_pre_hooks
                or nn.modules.module._global_forward_hooks
                or nn.modules.module._global_forward_pre_hooks),
            stochastic=training and self.drop_path.drop_prob > 0,
            norm_grad=grad and norm.weight.requires_grad,
            in_proj_grad=grad and self.mixer.in_proj.weight.requires_grad,
            params_grad=grad and any(p.requires_grad for p in self.parameters()),
            own_metric=hasattr(self, 'merge_metric'))

    def call_route(self, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                   ctx: ScanContext) -> BlockPlan:
        """This block's routes for a call outside a forward (tests, tools): the same rules
        as a forward's plan (:func:`~amvim_mm.models.execution.plan_vim`) on the call's facts
        and the mixer's own ``fused`` argument."""
        return plan_vim(call_facts(hidden, self.mixer.mixer_facts(),
                                   self.block_facts(self.training), self.training, ctx=ctx,
                                   residual=residual)).block(0)

    def forward(self, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                ctx: ScanContext, merge: Optional[MergePlan] = None,
                route: Optional[BlockPlan] = None, keep: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``merge``: a ToMe step planned for this block
        (:func:`~amvim_mm.models.reduction.state.plan_merge_step`): the streams come in at the
        old length and the merge happens in the Triton add + RMSNorm (the other routes apply
        it in PyTorch first). ``route``: this block's part of the forward's
        :class:`~amvim_mm.models.execution.ExecutionPlan` (None: :meth:`call_route`).
        ``keep``: a learned reducer's (B, L) keep mask (training): the mixer's masked forward
        (``forward_masked``) on the full sequence."""
        if keep is not None:
            residual = hidden if residual is None else residual + self.drop_path(hidden)
            normed = self.norm(residual.to(self.norm.weight.dtype))
            return self.mixer.forward_masked(normed, ctx, self.path_keys, keep), \
                residual.float()
        route = route if route is not None else self.call_route(hidden, residual, ctx)
        add_norm = route.add_norm.route
        if add_norm == TRITON:       # the merge, if any, inside the kernel's pass
            normed, residual = fused_add_rmsnorm(hidden, residual, self.norm.weight,
                                                 self.norm.eps, merge=merge)
            return self.mixer(normed, ctx, self.path_keys, route=route.mixer), residual
        if merge is not None:     # no stochastic depth on a merged stream
            hidden, residual = apply_merge_plan(hidden, residual, merge), None
        if add_norm == TRITON_TRAIN:     # Triton forward and backward, stochastic depth a factor
            scale = None if residual is None else self.drop_path.scale(hidden)
            normed, residual = fused_add_rmsnorm_train(hidden, residual, self.norm.weight,
                                                       self.norm.eps, scale=scale)
        elif add_norm == CPU:
            normed, residual = cpu_ops.add_rmsnorm(hidden, residual, self.norm.weight,
                                                   self.norm.eps)
        else:
            residual = hidden if residual is None else residual + self.drop_path(hidden)
            normed = self.norm(residual.to(self.norm.weight.dtype))
            residual = residual.float()
        return self.mixer(normed, ctx, self.path_keys, route=route.mixer), residual
