"""The skeleton every backbone of this project runs its forward on (Vim family, VMamba,
PlainMamba, and the next family).

One forward::

    forward(x)      switches pinned; a CUDA-graph replay when asked for and safe (graphs.py)
    _forward(x)     dynamic reducer and a batch: one image at a time (ReducibleBackbone);
                    the input check (shape, dtype, finite values; input_check.py);
                    a learned reducer in training: the masked forward, else the reduced one
    run_stages      embed, then per stage: enter_stage -> the block loop -> leave_stage
    run_blocks      ReductionSession.before_block -> call_block, per block (the stage that
                    holds the reducer runs its schedule, the others run plain)

and one :class:`ForwardRecord` of what the forward leaves behind, the same for every family.

A family implements the hooks: :meth:`embed` (images -> first stage's input and context),
:meth:`stages` (blocks per stage; default one stage of ``self.layers``),
:meth:`reduction_stage_index`, :meth:`enter_stage` / :meth:`leave_stage` (a hierarchical
family reshapes and downsamples there), :meth:`call_block` / :meth:`call_block_masked` and
:meth:`block_output` (the requested output of a block). A family that cannot be captured in a
CUDA graph says why in :meth:`graph_misfit`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from ..execution import NO_KERNEL, BlockPlan, ExecutionPlan, image_size, plan_family
from ..layout.scan_context import ScanContext
from ..reduction import ReducibleBackbone, ReductionSession
from .checkpoint_guard import CheckpointGuard
from .graphs import InferenceGraphs, graphs_requested
from .input_check import ImageInputCheck

__all__ = ['ForwardRecord', 'MambaBackbone']

#: ``emit(i, hidden, residual, ctx, keep)`` after block ``i`` (numbered over all stages)
Emit = Callable[[int, torch.Tensor, Optional[torch.Tensor], ScanContext,
                 Optional[torch.Tensor]], None]


@dataclasses.dataclass
class ForwardRecord:
    """What the last forward leaves on the backbone (``backbone.last_record``).

    Attributes:
        token_counts: the sequence length each block saw (all stages; a batch run one image
            at a time: the per-block mean over the images).
        context: the :class:`ScanContext` after the last block of the stage a reducer acts in
            (survivors, sources, grid), with or without a reducer (the unreduced sequence's
            context then).
        keep_mask: a learned reducer's last (B, L) keep mask (masked training forward), or None.
        final_stream: the stream after the last block (B, L, D; Vim family: ``residual +
            hidden`` before ``norm_f``), kept only when ``record_final_stream`` is set.
    """

    token_counts: List[float] = dataclasses.field(default_factory=list)
    context: Optional[ScanContext] = None
    keep_mask: Optional[torch.Tensor] = None
    final_stream: Optional[torch.Tensor] = None


class MambaBackbone(ImageInputCheck, CheckpointGuard, ReducibleBackbone, BaseModule):
    """Base of the backbones: the forward skeleton (see the module docstring).

    A subclass calls :meth:`init_forward` in its ``__init__`` (the ``cuda_graph`` argument)
    and implements the hooks; everything else (graphs, the input check, the reduction
    session, the masked training forward, per-image runs, the record) is here.
    """

    #: keep the last forward's final stream in ``last_record.final_stream`` (for token
    #: distillation; see ``ReducerFineTuner``)
    record_final_stream = False
    #: the family's :meth:`embed` checks the images itself (the skeleton then does not)
    embed_checks_images = False
    #: the FLOPs conventions the family's ``flops`` counts in (name -> what it counts; see
    #: :func:`amvim_mm.analysis.flops.backbone_flops`) and the one its tools report by default
    flops_conventions: dict = {}
    default_flops_convention = 'mamba'

    # ----------------------------------------------------------------- set-up
    def last_featmap(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output as a (B, D, h, w) map, whatever ``out_type`` and
        ``out_indices`` say (for analyses such as the effective receptive field). Families
        with stages (VMamba) give their last stage's map instead."""
        saved = self.out_type, self.out_indices
        self.out_type, self.out_indices = 'featmap', [self.num_layers - 1]
        try:
            return self(x)[-1]
        finally:
            self.out_type, self.out_indices = saved

    def init_forward(self, cuda_graph: Optional[bool]) -> None:
        """Validate ``cuda_graph`` (True, False or None: the ``AMVIM_CUDA_GRAPH`` switch) and
        start the graphs and the record."""
        if cuda_graph is not None and not isinstance(cuda_graph, bool):
            raise ConfigError(f'{type(self).__name__}: cuda_graph must be True, False or None, '
                              f'got {cuda_graph!r}')
        self.cuda_graph = cuda_graph
        self._graphs = InferenceGraphs()
        self.last_record = ForwardRecord()

    def finish_init(self, token_reduction, key_hook: Optional[Callable] = None) -> None:
        """The end of a family's ``__init__`` once its modules exist: a load pre-hook for
        checkpoint keys (``key_hook``: official names, a position-embedding resize), the guard
        against whole-model files, the family's own weight init, frozen stages, and the token
        reducer (validated against ``img_size`` now)."""
        if key_hook is not None:
            self._register_load_state_dict_pre_hook(key_hook)
        self.guard_whole_model_loads()
        self.reset_weights()
        self._freeze_stages()
        self.set_token_reduction(token_reduction)

    # ----------------------------------------------------------------- the record
    @property
    def token_counts(self) -> List[float]:
        """The sequence length each block of the last forward saw."""
        return self.last_record.token_counts

    @property
    def last_context(self) -> Optional[ScanContext]:
        """The last forward's context of the reduction stage (see :class:`ForwardRecord`)."""
        return self.last_record.context

    @property
    def keep_mask(self) -> Optional[torch.Tensor]:
        """The last masked training forward's (B, L) keep mask."""
        return self.last_record.keep_mask

    @property
    def final_stream(self) -> Optional[torch.Tensor]:
        """The last forward's final stream (with ``record_final_stream``)."""
        return self.last_record.final_stream

    # ----------------------------------------------------------------- hooks
    def execution_plan(self, x: torch.Tensor, fused: Optional[bool] = None) -> ExecutionPlan:
        """Which code runs in a forward on images ``x``, decided once (the family's rules in
        :mod:`amvim_mm.models.execution`): the embedding gets the plan, block ``i``
        ``plan.block(i)``, the reduction step before block ``i`` ``plan.step(i)``.
        ``fused``: a caller's decision for (True) or against (False) the Triton kernels;
        None: automatic. Default: a family without kernels of its own (PyTorch everywhere,
        the reduction steps on the shared rule), on :meth:`reduction_grid`'s grid."""
        return plan_family(self, x, fused, self.reduction_grid(*image_size(x)),
                           lambda f, i, grad: BlockPlan(NO_KERNEL, NO_KERNEL))

    def reduction_grid(self, H: int, W: int) -> Tuple[int, int]:
        """The token grid a reducer acts on for an H x W image (the planner reads the
        reducer's schedule on it)."""
        raise NotImplementedError(f'{type(self).__name__} must implement reduction_grid(H, W) '
                                  '(the token grid of the reducing stage)')

    def embed(self, x: torch.Tensor, plan) -> Tuple[torch.Tensor, Optional[ScanContext]]:
        """Images -> the first stage's input and its context."""
        raise NotImplementedError

    def stages(self) -> Sequence[Sequence[nn.Module]]:
        """The blocks of each stage (default: one stage, ``self.layers``)."""
        return (self.layers, )

    def reduction_stage_index(self) -> int:
        """The stage a token reducer acts in."""
        return 0

    def enter_stage(self, s: int, state, ctx: Optional[ScanContext]
                    ) -> Tuple[torch.Tensor, ScanContext]:
        """Stage ``s``'s (B, L, D) tokens and context from the previous stage's output."""
        return state, ctx

    def leave_stage(self, s: int, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                    ctx: ScanContext, outs: list):
        """Stage ``s``'s output for the next stage (a hierarchical family restores its grid,
        appends the stage's output to ``outs`` and downsamples here)."""
        return hidden

    def call_block(self, block: nn.Module, hidden: torch.Tensor,
                   residual: Optional[torch.Tensor], ctx: ScanContext, merge,
                   route: BlockPlan) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One block of the (reduced) forward on its routes -> (hidden, residual)."""
        return block(hidden, ctx, route=route), None

    def call_block_masked(self, block: nn.Module, hidden: torch.Tensor,
                          residual: Optional[torch.Tensor], ctx: ScanContext,
                          keep: Optional[torch.Tensor]
                          ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One block of a learned reducer's masked training forward -> (hidden, residual)."""
        return block(hidden, ctx, keep=keep), None

    def is_output_block(self, i: int) -> bool:
        """Whether block ``i`` (numbered over all stages) gives an output."""
        return i in self.out_indices

    def block_output(self, i: int, hidden: torch.Tensor, residual: Optional[torch.Tensor],
                     ctx: ScanContext, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Block ``i``'s requested output (``keep``: the masked forward's mask)."""
        raise NotImplementedError

    def restores_grid(self) -> bool:
        """Whether this forward's outputs may give the grid back from a reduced sequence
        (:func:`~amvim_mm.models.reduction.restore_grid`): pruned patches then keep their last
        features. A family whose outputs are tokens of the sequence says False."""
        return True

    def graph_misfit(self) -> Optional[str]:
        """Why this backbone's forward cannot be captured in a CUDA graph, or None
        (:meth:`InferenceGraphs.why_eager` asks). Every forward of the shared skeleton can;
        a family overrides this to say why not."""
        return None

    # ----------------------------------------------------------------- training helpers
    def frozen_parts(self) -> list:
        """What ``frozen_stages`` freezes: modules (kept in eval mode, no gradients) and
        parameters (no gradients). None by default; the families list theirs."""
        return []

    def _freeze_stages(self) -> None:
        for part in self.frozen_parts():
            if isinstance(part, nn.Parameter):
                part.requires_grad = False
                continue
            part.eval()
            for p in part.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        return self

    def plain_layer_depth(self, param_name: str, prefix: str, embeddings: Tuple[str, ...],
                          blocks: str) -> Tuple[int, int]:
        """``get_layer_depth`` of a plain stack (layer-wise learning-rate decay):
        ``(depth, num_layers + 2)`` with the parameters under ``embeddings`` at 0, block ``i``
        of ``blocks`` (e.g. ``'layers.'``) at ``i + 1`` and everything after (norms) last."""
        n = self.num_layers + 2
        if not param_name.startswith(prefix):
            return n - 1, n
        name = param_name[len(prefix):]
        if name.startswith(embeddings):
            return 0, n
        if name.startswith(blocks):
            return int(name[len(blocks):].split('.')[0]) + 1, n
        return n - 1, n

    # ----------------------------------------------------------------- forward
    def reset_cuda_graphs(self) -> None:
        """Drop the captured inference graphs (``cuda_graph=True``) and their memory. Loads,
        optimizer steps and in-place edits under ``torch.no_grad()`` are noticed by
        themselves (parameter versions); an edit through ``.data`` is not: call this after
        one."""
        self._graphs.clear()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        with runtime.pinned():      # the switches read once per forward, not at every call
            if graphs_requested(self.cuda_graph):
                return self._graphs.run(self, x, self._forward, check=self.check_images)
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.runs_per_image(x):
            return self.forward_per_image(x)
        if not self.embed_checks_images:
            self.check_images(x)
        red = self.token_reducer
        masked = self.training and red is not None and red.learned
        outs, record, _ = self.run_stages(x, masked)
        self.last_record = record
        return tuple(outs)

    def run_stages(self, x: torch.Tensor, masked: bool
                   ) -> Tuple[list, ForwardRecord, torch.Tensor]:
        """Embed and run every stage -> (outputs, record, the last stage's output)."""
        # the masked training forward runs no Triton kernel (PyTorch's autograd throughout)
        plan = self.execution_plan(x, fused=False if masked else None)
        state, ctx = self.embed(x, plan)
        outs: list = []
        counts: List[int] = []
        record = ForwardRecord(token_counts=counts)
        red_stage = self.reduction_stage_index()
        stages = self.stages()
        start = 0

        def emit(i, hidden, residual, ctx, keep):
            if self.is_output_block(i):
                outs.append(self.block_output(i, hidden, residual, ctx, keep))

        for s, blocks in enumerate(stages):
            hidden, ctx = self.enter_stage(s, state, ctx)
            reducer = self.token_reducer if s == red_stage else None
            at = _offset(emit, start)
            if masked and reducer is not None:
                hidden, residual, record.keep_mask = self.run_blocks_masked(blocks, hidden, ctx,
                                                                            at)
                stage_counts = [hidden.shape[1]] * len(blocks)
            else:
                hidden, residual, ctx, stage_counts = self.run_blocks(
                    blocks, hidden, ctx, reducer, plan, at, start)
                if reducer is not None and reducer.dynamic and not self.training:
                    reducer.observe(stage_counts)     # per-image counts (FLOPs are means)
            counts.extend(stage_counts)
            if s == red_stage:
                record.context = ctx
            if self.record_final_stream and s == len(stages) - 1:
                record.final_stream = hidden if residual is None else residual + hidden
            state = self.leave_stage(s, hidden, residual, ctx, outs)
            start += len(blocks)
        return outs, record, state

    def run_blocks(self, blocks: Sequence[nn.Module], hidden: torch.Tensor, ctx: ScanContext,
                   reducer, plan: ExecutionPlan, emit: Emit, start: int = 0):
        """The block loop of one stage with its :class:`ReductionSession` -> (hidden,
        residual, the context after the last step, the tokens each block saw); ``start``:
        the stage's first block among all blocks (block ``i`` runs ``plan.block(start + i)``)."""
        session = ReductionSession(reducer, ctx, hidden, len(blocks), self.training,
                                   keep_frozen=self.restores_grid())
        residual, counts = None, []
        for i, layer in enumerate(blocks):
            hidden, residual, merge = session.before_block(i, layer, hidden, residual, plan)
            counts.append(hidden.shape[1] if merge is None else merge.rows.shape[1])
            hidden, residual = self.call_block(layer, hidden, residual, session.ctx, merge,
                                               plan.blocks[start + i])
            emit(i, hidden, residual, session.ctx, None)
        return hidden, residual, session.ctx, counts

    def run_blocks_masked(self, blocks: Sequence[nn.Module], hidden: torch.Tensor,
                          ctx: ScanContext, emit: Emit):
        """A learned reducer's training forward over one stage: the full sequence throughout,
        a keep mask from the reducer's decisions, every block after the first decision on its
        masked forward (see :mod:`amvim_mm.models.reduction.learned`); a dropped token's
        stream is its value when it was dropped (what inference's dense restore gives it).
        Returns (hidden, residual, the last keep mask)."""
        red = self.begin_masked_training(ctx, hidden, len(blocks))
        residual, keep = None, None
        for i, layer in enumerate(blocks):
            stream = hidden if residual is None else residual + hidden
            new = red.decide(i, stream, ctx, layer)
            if new is not None:
                keep = new.keep
                if new.mix is not None:      # in-place merges, both streams
                    hidden = new.mix(hidden)
                    residual = None if residual is None else new.mix(residual)
            hidden, residual = self.call_block_masked(layer, hidden, residual, ctx, keep)
            emit(i, hidden, residual, ctx, keep)
        return hidden, residual, keep


def _offset(emit: Emit, start: int) -> Emit:
    """``emit`` with the stage's block index turned into the index over all stages."""
    if start == 0:
        return emit
    return lambda i, *rest: emit(start + i, *rest)
