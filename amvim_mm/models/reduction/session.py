"""What happens between the blocks of one forward when a token reducer is on.

:class:`ReductionSession` owns the token-reduction state of a forward: it resolves the
reducer's schedule for the input's grid, gives the context its per-sample bookkeeping, and
before each block runs the step the schedule asks for: the reducer picks the tokens
(:meth:`~.reducers.TokenReducer.step`), then, on the routes of the forward's execution plan
(:class:`~amvim_mm.models.execution.StepPlan`), either the merge is planned for the block's
Triton add + RMSNorm (:func:`~.state.plan_merge_step`) or both streams are reduced
(:func:`~.state.reduce_tokens`). Without a reducer (or with a schedule that removes nothing)
it hands everything through unchanged.
"""
from __future__ import annotations

from typing import FrozenSet, Optional, Tuple

import torch

from amvim_mm.errors import ConfigError
from amvim_mm.ops.token_merge import MergePlan
from ..execution import CPU, TRITON, ExecutionPlan, StepPlan, reducer_facts
from ..layout.scan_context import ScanContext
from .reducers import TokenReducer
from .state import (Streams, append_fused_slot, folded_successor, init_reduction_state,
                    plan_merge_step, reduce_tokens)


class ReductionSession:
    """The token reduction of one forward of a Vim-family backbone.

    Args:
        reducer: the backbone's reducer, or None.
        ctx: the context of the embedded (unreduced) sequence.
        hidden: the embedded tokens (B, L, D) (batch size and device).
        depth: the number of blocks.
        training: the backbone's mode (training keeps both streams; inference folds them).
        keep_frozen: pruned patches keep their last features for the dense restore (outputs
            on the grid); False when every output is a token of the sequence (the class
            token): a planned pruning step then writes none.
    """

    def __init__(self, reducer: Optional[TokenReducer], ctx: ScanContext, hidden: torch.Tensor,
                 depth: int, training: bool, keep_frozen: bool = True) -> None:
        self.reducer = reducer
        self.training = training
        self.keep_frozen = keep_frozen
        #: the reducer's facts for this grid (:func:`~amvim_mm.models.execution.reducer_facts`:
        #: the schedule, the blocks before which a step runs, the blocks that score tokens);
        #: None when nothing is removed
        self.facts = reducer_facts(reducer, ctx.grid[0] * ctx.grid[1], depth)
        if reducer is not None and reducer.dynamic and hidden.shape[0] != 1:
            raise ConfigError(f'{type(reducer).__name__} removes a number of tokens that '
                              'depends on the image: run it one image at a time')
        if self.facts is not None:
            ctx = init_reduction_state(ctx, hidden.shape[0], hidden.device)
        #: the context of the current sequence (after the last step)
        self.ctx = ctx

    @property
    def steps(self) -> FrozenSet[int]:
        """The blocks before which a step runs (a schedule's, or a dynamic reducer's decision
        blocks: its counts depend on the image, so it runs one image at a time)."""
        return frozenset() if self.facts is None else self.facts.steps

    @property
    def removals(self) -> Optional[Tuple[int, ...]]:
        """The schedule's count before each block (None when nothing is removed)."""
        return None if self.facts is None else self.facts.removals

    def before_block(self, i: int, layer, hidden: torch.Tensor,
                     residual: Optional[torch.Tensor], plan: ExecutionPlan
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[MergePlan]]:
        """Run the reduction step scheduled before block ``i`` (if any) on the route the
        forward's :class:`~amvim_mm.models.execution.ExecutionPlan` gives it
        (``plan.step(i)``). Returns the streams for the block and, where the plan merges
        inside the next Triton add + RMSNorm, the merge plan the block applies (the streams
        are then unchanged)."""
        if self.facts is None:
            return hidden, residual, None
        ctx, merge = self.ctx, None
        if i in self.facts.steps:
            step = plan.step_at.get(i)
            if step is None:
                raise ConfigError(f'the execution plan has no route for the reduction step '
                                  f'before block {i} (a plan made for another input?)')
            hidden, residual, ctx, merge = self._run_step(i, step, layer, hidden, residual)
        # only the block right before a step scores the tokens (the others keep their route)
        ctx.want_importance = i in self.facts.importance
        self.ctx = ctx
        return hidden, residual, merge

    def _run_step(self, i: int, step: StepPlan, layer, hidden: torch.Tensor,
                  residual: Optional[torch.Tensor]):
        """The step itself: the reducer's selection, then the merge on the plan's route."""
        reducer, ctx, merge = self.reducer, self.ctx, None
        if reducer.freeze_sources:
            hidden, residual, ctx = append_fused_slot(ctx, hidden, residual)
        streams = Streams(hidden, residual, [])     # the sum formed once, for select and merge
        # k: the schedule's count (0 for a dynamic reducer, whose step decides it)
        sel = reducer.step(i, self.facts.removals[i], streams, ctx, layer, step)
        if sel is None or not sel.removed.shape[1]:
            return hidden, residual, ctx, None
        if sel.reduced is not None:
            # applied by the step itself (CPU inference): the streams folded into hidden
            hidden, residual = sel.reduced[0], None
            ctx = folded_successor(ctx, sel.removed.shape[1], *sel.reduced[1:],
                                   step='cpu-step')
        else:
            self._check(reducer, sel, step)
            if step.merge == TRITON:
                frozen = reducer.drops_patches and self.keep_frozen
                merge, ctx = plan_merge_step(ctx, sel.removed, sel.dst, sel.plan,
                                             stream=streams.total() if frozen else None,
                                             weight=sel.weight,
                                             freeze_sources=reducer.freeze_sources)
            else:
                hidden, residual, ctx = reduce_tokens(
                    ctx, hidden, residual, sel.removed, sel.dst, sel.weight,
                    reducer.freeze_sources, reducer.merges, fold=step.fold,
                    stream=streams, prunes=reducer.prunes, kernel=step.merge == CPU)
        ctx.align = reducer.align
        return hidden, residual, ctx, merge

    @staticmethod
    def _check(reducer: TokenReducer, sel, step: StepPlan) -> None:
        """A merging reducer that did not declare ``prunes`` must not prune: the dense restore
        would have no feature for those patches. Checked where it costs no device sync (CPU),
        not in an export (a data-dependent branch has no place in the graph)."""
        if reducer.merges and not reducer.freeze_sources and not reducer.prunes \
                and not sel.dst.is_cuda and not step.exporting \
                and bool((sel.dst < 0).any()):
            raise ConfigError(f'{type(reducer).__name__} merges tokens (merges=True) but pruned '
                              'some (dst = -1); set prunes = True on the reducer class')
