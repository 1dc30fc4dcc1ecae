"""What happens between the blocks of one forward when a token reducer is on.

:class:`ReductionSession` owns the token-reduction state of a forward: it resolves the
reducer's schedule for the input's grid, gives the context its per-sample bookkeeping, and
before each block runs the step the schedule asks for: the reducer picks the tokens
(:meth:`~.reducers.TokenReducer.step`), then either the fused inference path plans the merge
for the block's fused add + RMSNorm (:func:`~.state.plan_merge_step`) or both streams are
reduced with PyTorch ops (:func:`~.state.reduce_tokens`). Without a reducer (or with a schedule
that removes nothing) it hands everything through unchanged.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from amvim_mm.errors import ConfigError
from amvim_mm.ops.token_merge import MergePlan
from ..layout.scan_context import ScanContext
from .reducers import TokenReducer
from .state import (Streams, append_fused_slot, can_plan_merge, folded_successor,
                    init_reduction_state, plan_merge_step, reduce_tokens)


class ReductionSession:
    """The token reduction of one forward of a Vim-family backbone.

    Args:
        reducer: the backbone's reducer, or None.
        ctx: the context of the embedded (unreduced) sequence.
        hidden: the embedded tokens (B, L, D) (batch size and device).
        depth: the number of blocks.
        training: the backbone's mode (training keeps both streams; inference folds them).
    """

    def __init__(self, reducer: Optional[TokenReducer], ctx: ScanContext, hidden: torch.Tensor,
                 depth: int, training: bool) -> None:
        self.reducer = reducer
        self.training = training
        self.removals = None
        #: the blocks before which a step runs (a schedule's, or a dynamic reducer's decision
        #: blocks: its counts depend on the image, so it runs one image at a time)
        self.steps = frozenset()
        if reducer is not None:
            M = ctx.grid[0] * ctx.grid[1]
            removals = reducer.removals(M, depth)
            steps = {i for i, k in enumerate(removals) if k}
            if reducer.dynamic:
                if hidden.shape[0] != 1:
                    raise ConfigError(f'{type(reducer).__name__} removes a number of tokens that '
                                      'depends on the image: run it one image at a time')
                steps |= set(reducer.decision_blocks(M, depth))
            if steps:
                self.removals, self.steps = removals, frozenset(steps)
                ctx = init_reduction_state(ctx, hidden.shape[0], hidden.device)
        #: the context of the current sequence (after the last step)
        self.ctx = ctx

    def before_block(self, i: int, layer, hidden: torch.Tensor,
                     residual: Optional[torch.Tensor], fused: Optional[bool] = None
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[MergePlan]]:
        """Run the reduction step scheduled before block ``i`` (if any).

        ``fused``: the forward's fused-path decision (None: ask the block's mixer). Returns the
        streams for the block and, on the fused inference path, the merge plan the block
        applies inside its fused add + RMSNorm (the streams are then unchanged).
        """
        if self.removals is None:
            return hidden, residual, None
        reducer, ctx, merge = self.reducer, self.ctx, None
        if i in self.steps:
            if reducer.freeze_sources:
                hidden, residual, ctx = append_fused_slot(ctx, hidden, residual)
            # inference on the fused path: Triton kernels for the reduction step too
            if fused is None:
                fused = layer.mixer.use_fused(hidden, None)
            ctx.fused_ok = not self.training and fused and not torch.is_grad_enabled()
            ctx.fold_ok = not self.training
            streams = Streams(hidden, residual)
            # k: the schedule's count (0 for a dynamic reducer, whose step decides it)
            sel = reducer.step(i, self.removals[i], streams, ctx, layer)
            if sel is not None and sel.removed.shape[1]:
                if sel.reduced is not None:
                    # applied by the step itself (CPU inference): the streams folded into hidden
                    hidden, residual = sel.reduced[0], None
                    ctx = folded_successor(ctx, sel.removed.shape[1], *sel.reduced[1:],
                                           step='cpu-step')
                else:
                    self._check(reducer, sel)
                    if ctx.fused_ok and can_plan_merge(ctx, reducer, sel.weight):
                        merge, ctx = plan_merge_step(ctx, sel.removed, sel.dst, sel.plan)
                    else:
                        hidden, residual, ctx = reduce_tokens(
                            ctx, hidden, residual, sel.removed, sel.dst, sel.weight,
                            reducer.freeze_sources, reducer.merges, fold=not self.training,
                            stream=streams.total(), prunes=reducer.prunes)
                ctx.align = reducer.align
        # only the block right before a step scores the tokens (the others keep the fused path)
        ctx.want_importance = reducer.needs_importance and i + 1 in self.steps
        self.ctx = ctx
        return hidden, residual, merge

    @staticmethod
    def _check(reducer: TokenReducer, sel) -> None:
        """A merging reducer that did not declare ``prunes`` must not prune: the dense restore
        would have no feature for those patches. Checked where it costs no device sync (CPU)."""
        if reducer.merges and not reducer.freeze_sources and not reducer.prunes \
                and not sel.dst.is_cuda and bool((sel.dst < 0).any()):
            raise ConfigError(f'{type(reducer).__name__} merges tokens (merges=True) but pruned '
                              'some (dst = -1); set prunes = True on the reducer class')
