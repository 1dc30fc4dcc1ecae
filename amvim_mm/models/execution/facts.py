"""The plain facts a plan is made from (read once at the start of a forward), and the rules
every family shares: which blocks record autograd, the compiled CPU kernels' conditions, and
the route of a token-reduction step."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, FrozenSet, Optional, Tuple

import torch

from amvim_mm import runtime
from amvim_mm.ops import cpu_ops
from amvim_mm.ops.fused_mixer import autocast_dtype
from amvim_mm.ops.token_merge import extra_kernels_enabled
from amvim_mm.errors import ConfigError
from .plan import CPU, NO_KERNEL, TORCH, TRITON, BlockPlan, ExecutionPlan, StepPlan

__all__ = ['PlannedBlock', 'MixerFacts', 'BlockFacts', 'ReducerFacts', 'ForwardFacts', 'reducer_facts',
           'grads', 'cpu_fp32', 'plan_step', 'plan_steps', 'plan_family', 'forward_facts',
           'image_size']


@dataclass(frozen=True)
class MixerFacts:
    """What the Vim planner needs of the mixers (the first block's: a backbone builds every
    mixer from one configuration)."""
    fused: Optional[bool]          # the mixer's own ``fused`` argument (None: automatic)
    supports_fused: bool           # the fused kernels compute its merge of the paths
    scan_backend: Optional[str]    # the mixer's ``scan_backend`` argument
    d_state: int
    d_inner: int
    num_paths: int


@dataclass(frozen=True)
class BlockFacts:
    """What a planner needs of one block (any family)."""
    norm_kernel: bool = False      # its norm is the plain RMSNorm and no hook watches it
    stochastic: bool = False       # stochastic depth in effect (training, drop_prob > 0)
    norm_grad: bool = False        # the norm weight requires grad
    in_proj_grad: bool = False     # the mixer's in_proj weight requires grad
    params_grad: bool = False      # some parameter of the block requires grad
    own_metric: bool = False       # it has its own ``merge_metric`` (ToMe's input on PyTorch)


@dataclass(frozen=True)
class ReducerFacts:
    """What a planner needs of the token reducer, for one grid (:func:`reducer_facts`)."""
    removals: Tuple[int, ...]      # the schedule's count before each block
    steps: FrozenSet[int]          # the blocks before which a step runs
    importance: FrozenSet[int]     # the blocks whose mixer scores the tokens (ToP importance)
    align_from: Optional[int]      # the first block whose scan is aligned (ToP), None: none
    plain_merge: bool              # size-weighted merges only (the compiled CPU merge)
    folds: bool                    # at inference its steps fold the streams (fp32) into one
    kernels: FrozenSet[str]        # the reducer's own step kernels ('triton', 'cpu')
    block_metric: bool             # it matches on the block's normalised input


@dataclass(frozen=True)
class ForwardFacts:
    """The plain facts one forward's plan is made from (every family; the Vim-only ones are
    left at their defaults by the others)."""
    device: str                          # the input's device type
    dtype: torch.dtype                   # the parameters' dtype
    autocast: Optional[torch.dtype]      # the autocast dtype on the device (None: off)
    grad_mode: bool                      # torch.is_grad_enabled()
    input_grad: bool                     # the input (images, or a call's hidden) requires grad
    training: bool
    batch: int
    tokens: int                          # the sequence length (patches and class token)
    tracing: bool                        # a trace or compile records (cpu_ops.tracing)
    reduction_kernels: bool              # AMVIM_FUSED_REDUCTION_KERNELS
    mixer: Optional[MixerFacts]
    blocks: Tuple[BlockFacts, ...]
    reducer: Optional[ReducerFacts] = None
    embed_grad: bool = False             # an embedding parameter requires grad
    embed_kernel: bool = False           # the patch embedding has the kernel's shape
    residual_grad: bool = False          # a call's residual requires grad
    forced: Optional[bool] = None        # a caller's Triton decision (Vim family)
    exporting: bool = False              # an export records (no Triton kernel, no data branch)
    recording: bool = False              # a near-tie recorder is on (margins.recording)


class PlannedBlock:
    """Mixin of every family's block: :meth:`block_facts`, what the planner reads of it (the
    Vim block overrides it with the facts its kernels need)."""

    def block_facts(self, training: bool) -> BlockFacts:
        """The block's facts: whether its norm weight and its parameters record gradients,
        stochastic depth in effect, and whether it has its own ToMe metric
        (``merge_metric``: the reducer then matches on it, in PyTorch)."""
        grad = torch.is_grad_enabled()
        norm = getattr(self, 'norm', None)
        params = grad and any(p.requires_grad for p in self.parameters())
        drop = getattr(self, 'drop_path', None)
        return BlockFacts(norm_grad=grad and norm is not None and norm.weight.requires_grad,
                          in_proj_grad=params, params_grad=params,
                          stochastic=training and drop is not None and drop.drop_prob > 0,
                          own_metric=hasattr(self, 'merge_metric'))


def forward_facts(x: torch.Tensor, dtype: torch.dtype, training: bool, tokens: int,
                  blocks: Tuple[BlockFacts, ...], reducer: Optional[ReducerFacts] = None,
                  **kw) -> ForwardFacts:
    """The facts of a forward (or of one call) on ``x`` read now: device, autocast, grad
    mode, trace / export state and the switches; ``kw``: the family's own facts."""
    device = x.device.type if isinstance(x, torch.Tensor) else 'cpu'
    grad = torch.is_grad_enabled()
    kw.setdefault('input_grad', grad and isinstance(x, torch.Tensor) and x.requires_grad)
    kw.setdefault('mixer', None)
    return ForwardFacts(device=device, dtype=dtype, autocast=autocast_dtype(device),
                        grad_mode=grad, training=training,
                        batch=runtime.static_int(x.shape[0])
                        if isinstance(x, torch.Tensor) and x.dim() else 0,
                        tokens=tokens, tracing=cpu_ops.tracing(),
                        reduction_kernels=extra_kernels_enabled(), blocks=blocks,
                        reducer=reducer, exporting=runtime.exporting()
                        or torch.jit.is_tracing() or torch.jit.is_scripting(), **kw)


def reducer_facts(reducer, num_patches: int, depth: int) -> Optional[ReducerFacts]:
    """The reducer's facts for ``num_patches`` patches and ``depth`` blocks (None without a
    reducer or when its schedule removes nothing). A schedule that does not fit raises here
    (:class:`~amvim_mm.errors.ConfigError`, naming the schedule)."""
    if reducer is None:
        return None
    removals = tuple(reducer.removals(num_patches, depth))
    steps = {i for i, k in enumerate(removals) if k}
    if reducer.dynamic:
        steps |= set(reducer.decision_blocks(num_patches, depth))
    if not steps:
        return None
    importance = frozenset(i for i in range(depth) if reducer.needs_importance
                           and i + 1 in steps)
    return ReducerFacts(
        removals=removals, steps=frozenset(steps), importance=importance,
        align_from=min(steps) if reducer.align is not None else None,
        plain_merge=bool(reducer.merges and not reducer.freeze_sources and not reducer.prunes),
        folds=bool(reducer.merges and not reducer.freeze_sources and not reducer.dynamic),
        kernels=frozenset(reducer.step_kernels), block_metric=bool(reducer.block_metric))


def grads(f: ForwardFacts) -> Tuple[Tuple[bool, bool, bool], ...]:
    """Per block: whether autograd records (its input stream, its add + norm, its mixer),
    from grad mode and the requires-grad flags along the forward."""
    if not f.grad_mode:
        return ((False, False, False), ) * len(f.blocks)
    up, out = f.input_grad or f.embed_grad or f.residual_grad, []
    for b in f.blocks:
        add = up or b.norm_grad
        out.append((up, add, add or b.in_proj_grad))
        up = up or b.params_grad
    return tuple(out)


def cpu_fp32(f: ForwardFacts) -> Optional[str]:
    """Why the compiled CPU kernels cannot take this forward (None: they can)."""
    if f.device != 'cpu':
        return 'not a CPU tensor'
    if f.dtype != torch.float32 or f.autocast is not None:
        return 'they compute in float32 (no CPU autocast)'
    if f.tracing:
        return 'a trace or compile is recording'
    return None


def plan_step(f: ForwardFacts, i: int, fused: bool, grad: Tuple[bool, bool, bool],
              block: BlockFacts) -> StepPlan:
    """The route of the reduction step before block ``i`` of the reducing stage (every
    family; ``fused``: the forward runs the Vim family's Triton add + RMSNorm, into which the
    merge is planned; ``grad``: :func:`grads` of that block, ``block`` its facts). A near-tie
    recorder (``f.recording``) takes the PyTorch selection, which records; the merge keeps its
    route."""
    step = replace(_step(f, i, fused, grad, block), exporting=f.exporting)
    return replace(step, match=TORCH, edges=TORCH, record=True) if f.recording else step


def _step(f: ForwardFacts, i: int, fused: bool, grad: Tuple[bool, bool, bool],
          block: BlockFacts) -> StepPlan:
    red = f.reducer
    if f.training:
        return StepPlan(i, TORCH, TORCH, False, 'training keeps both streams')
    if fused and not f.grad_mode:
        match = TRITON if TRITON in red.kernels and f.reduction_kernels else TORCH
        # every reducer's step is planned into the next add + RMSNorm (token_merge.plan_merge)
        return StepPlan(i, match, TRITON, True, 'Triton inference')
    up, add, _ = grad
    cpu = cpu_fp32(f) is None and cpu_ops.status()[0]
    own = red.block_metric and block.own_metric
    if CPU in red.kernels and cpu and f.reduction_kernels and not add and not own:
        return StepPlan(i, CPU, CPU, True, 'CPU inference: the whole step compiled')
    merge = CPU if red.plain_merge and cpu and not up else TORCH
    edges = CPU if cpu and f.reduction_kernels and not add else TORCH
    return StepPlan(i, TORCH, merge, True, 'inference', edges=edges)


def plan_steps(f: ForwardFacts, fused: bool, offset: int = 0) -> Tuple[StepPlan, ...]:
    """The routes of every reduction step of ``f.reducer`` (none without one); ``offset``: the
    index of the reducing stage's first block among all blocks."""
    if f.reducer is None:
        return ()
    g, last = grads(f), len(f.blocks) - 1
    return tuple(plan_step(f, i, fused, g[min(offset + i, last)],
                           f.blocks[min(offset + i, last)]) for i in sorted(f.reducer.steps))


def image_size(x) -> Tuple[int, int]:
    """(H, W) of an image batch as Python ints (also under a trace, where sizes are
    tensors), (0, 0) for a malformed input (the input check names the problem)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return 0, 0
    return runtime.static_int(x.shape[-2]), runtime.static_int(x.shape[-1])


def plan_family(model, x: torch.Tensor, fused: Optional[bool], grid: Tuple[int, int],
                block_rule: Callable[[ForwardFacts, int, bool], BlockPlan]) -> ExecutionPlan:
    """The plan of a family without the Vim family's fused forward (PlainMamba, VMamba, ViL):
    the embedding in PyTorch, block ``i``'s routes from ``block_rule(facts, i, grad)``
    (``grad``: autograd records through its mixer), the steps from :func:`plan_step`.
    ``grid``: the reducing stage's token grid for ``x``; ``fused=False``: a caller's
    decision against every Triton kernel (the masked training forward)."""
    stages = model.stages()
    s = model.reduction_stage_index()
    offset = sum(len(b) for b in stages[:s])
    blocks = [b for stage in stages for b in stage]
    training = model.training
    red = None
    if model.token_reducer is not None:
        try:
            red = reducer_facts(model.token_reducer, grid[0] * grid[1], len(stages[s]))
        except ConfigError:     # reported by the reduction session, after the input check
            red = None
    for b in blocks:
        if not isinstance(b, PlannedBlock):
            raise ConfigError(f'{type(b).__name__} is a block of {type(model).__name__} but no '
                              'PlannedBlock (amvim_mm.models.execution): it must report its '
                              'facts to the execution plan')
    dtype = next(model.parameters()).dtype
    # the stream records from the start when any parameter does (embedding, downsamples)
    stem_grad = torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
    f = forward_facts(x, dtype, training, grid[0] * grid[1],
                      tuple(b.block_facts(training) for b in blocks), red, forced=fused,
                      recording=model.near_tie_recording(), embed_grad=stem_grad)
    plans = tuple(block_rule(f, i, g[2]) for i, g in enumerate(grads(f)))
    return ExecutionPlan(type(model).__name__, False, 'no fused Triton forward in this family',
                         NO_KERNEL, plans, plan_steps(f, False, offset), f)
