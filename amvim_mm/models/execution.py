"""Which code runs in one forward of a Vim-family backbone, decided once: the execution plan.

A forward has four parts that have more than one implementation:

* the **embedding** (patch GEMM, class token, position embedding): one Triton kernel
  (:mod:`amvim_mm.ops.fused_embed`) or PyTorch;
* each block's **add + RMSNorm**: one Triton kernel (inference, a reduction step's merges and
  prunes inside its pass),
  the trainable Triton Function, one compiled CPU call (:func:`~amvim_mm.ops.cpu_ops.add_rmsnorm`)
  or PyTorch;
* each block's **mixer**: the fused Triton mixer (inference or trainable), the fused CPU mixer
  (:mod:`amvim_mm.ops.cpu_mixer`) or the unfused PyTorch mixer (whose selective scan still
  picks its backend, :mod:`amvim_mm.ops.backends`);
* each **token-reduction step**: how the tokens are matched (ToMe's Triton matching kernel,
  the whole step compiled for the CPU, or the reducer's ``select``), how they are merged
  (planned into the next Triton add + RMSNorm, compiled, or PyTorch ops) and whether the two
  streams are folded into one (inference).

:func:`plan_forward` decides all of them from :class:`ForwardFacts`, plain values read once
at the start of the forward (device, dtypes, autocast, grad recording, training, shape, the
switches of :mod:`amvim_mm.runtime`, the layers' and the reducer's declared properties), and
returns a frozen :class:`ExecutionPlan` that says, for every part, the route (``'triton'``,
``'triton-train'``, ``'cpu'``, ``'torch'``) and why. The embedding, the blocks, the mixers and
the reduction session only read it. Kernel availability is asked here too (probed lazily and
cached by :mod:`amvim_mm.ops`), and the ops' ``*_misfit`` functions stay the reference for
what a kernel takes. A block or mixer called without a plan (tests, tools) gets one made for
that call by the same function (:meth:`ForwardFacts.for_call`).

A new kernel is one more route value here, and one more branch in the module that runs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, NamedTuple, Optional, Tuple

import torch

from amvim_mm.errors import BackendUnavailableError
from amvim_mm.ops import cpu_ops
from amvim_mm.ops.backends import log_choice_once, mamba_selective_scan, requested_backend
from amvim_mm.ops.fused_mixer import autocast_dtype, fused_mixer_available, fused_requested
from amvim_mm.ops.fused_mixer_autograd import auto_prefers_fused_training
from amvim_mm.ops.scan_choice import auto_prefers_fused
from amvim_mm.ops.token_merge import extra_kernels_enabled

__all__ = ['TRITON', 'TRITON_TRAIN', 'CPU', 'TORCH', 'ROUTES', 'Choice', 'MixerFacts',
           'BlockFacts', 'ReducerFacts', 'ForwardFacts', 'StepPlan', 'BlockPlan',
           'ExecutionPlan', 'plan_forward', 'reducer_facts', 'as_plan']

TRITON, TRITON_TRAIN, CPU, TORCH = 'triton', 'triton-train', 'cpu', 'torch'
ROUTES = (TRITON, TRITON_TRAIN, CPU, TORCH)
_HALF = (torch.float16, torch.bfloat16)


class Choice(NamedTuple):
    """One part's route and the reason for it (a few words)."""
    route: str
    why: str


@dataclass(frozen=True)
class MixerFacts:
    """What the planner needs of the mixers (the first block's: a backbone builds every mixer
    from one configuration)."""
    fused: Optional[bool]          # the mixer's own ``fused`` argument (None: automatic)
    supports_fused: bool           # the fused kernels compute its merge of the paths
    scan_backend: Optional[str]    # the mixer's ``scan_backend`` argument
    d_state: int
    d_inner: int
    num_paths: int


@dataclass(frozen=True)
class BlockFacts:
    """What the planner needs of one block."""
    norm_kernel: bool = False      # its norm is the plain RMSNorm and no hook watches it
    stochastic: bool = False       # stochastic depth in effect (training, drop_prob > 0)
    norm_grad: bool = False        # the norm weight requires grad
    in_proj_grad: bool = False     # the mixer's in_proj weight requires grad
    params_grad: bool = False      # some parameter of the block requires grad
    own_metric: bool = False       # it has its own ``merge_metric`` (ToMe's input on PyTorch)


@dataclass(frozen=True)
class ReducerFacts:
    """What the planner needs of the token reducer, for one grid (:func:`reducer_facts`)."""
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
    """The plain facts one forward's plan is made from."""
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
    forced: Optional[bool] = None        # a caller's Triton decision (fused=True / False)

    @classmethod
    def for_call(cls, hidden: torch.Tensor, mixer: Optional[MixerFacts], block: BlockFacts,
                 training: bool, forced: Optional[bool] = None, ctx=None,
                 residual: Optional[torch.Tensor] = None, tokens: Optional[int] = None
                 ) -> 'ForwardFacts':
        """The facts of one block or mixer call on ``hidden`` (B, L, D) without a forward's
        plan; ``ctx``: the call's scan context (its ToP flags force the PyTorch mixer)."""
        red = None
        if ctx is not None and (ctx.want_importance or (ctx.align is not None and ctx.reduced)):
            red = ReducerFacts((0, ), frozenset(), frozenset({0}) if ctx.want_importance
                               else frozenset(), 0 if ctx.align is not None and ctx.reduced
                               else None, False, False, frozenset(), False)
        grad = torch.is_grad_enabled()
        return cls(device=hidden.device.type, dtype=hidden.dtype,
                   autocast=autocast_dtype(hidden.device.type), grad_mode=grad,
                   input_grad=grad and hidden.requires_grad, training=training,
                   batch=hidden.shape[0] if hidden.dim() else 0,
                   tokens=tokens if tokens is not None else
                   (hidden.shape[1] if hidden.dim() > 1 else 0),
                   tracing=cpu_ops.tracing(), reduction_kernels=extra_kernels_enabled(),
                   mixer=mixer, blocks=(block, ), reducer=red,
                   residual_grad=grad and residual is not None and residual.requires_grad,
                   forced=forced)


@dataclass(frozen=True)
class StepPlan:
    """One token-reduction step (before block ``block``).

    ``match``: ``'triton'`` (the reducer's matching kernel, which plans the merge in the same
    launch; beyond ToMe's ``MAX_MATCH_ROWS`` rows it matches in blocks), ``'cpu'`` (the whole
    step in one compiled call) or ``'torch'`` (the reducer's ``select``); ``merge``:
    ``'triton'`` (planned, applied inside the next block's Triton add + RMSNorm), ``'cpu'``
    (compiled) or ``'torch'``; ``fold``: the two streams are merged as one (inference)."""
    block: int
    match: str
    merge: str
    fold: bool
    why: str


class BlockPlan(NamedTuple):
    add_norm: Choice
    mixer: Choice


@dataclass(frozen=True)
class ExecutionPlan:
    """What runs in one forward (see the module docstring). ``fused``: the forward's Triton
    decision (the value the backbone used to pass as ``fused=``; ``bool(plan)`` is it)."""
    fused: bool
    fused_why: str
    embed: Choice
    blocks: Tuple[BlockPlan, ...]
    steps: Tuple[StepPlan, ...]
    facts: ForwardFacts

    def block(self, i: Optional[int]) -> BlockPlan:
        """Block ``i``'s routes (a plan made for one call answers for any block)."""
        return self.blocks[0] if i is None or len(self.blocks) == 1 else self.blocks[i]

    def step(self, i: int) -> Optional[StepPlan]:
        """The plan of the reduction step before block ``i`` (None: no step there)."""
        return next((s for s in self.steps if s.block == i), None)

    def __bool__(self) -> bool:
        return self.fused

    def describe(self) -> str:
        """One line per part: route and reason (for logs and docs)."""
        lines = [f'triton: {self.fused} ({self.fused_why})',
                 f'embed: {self.embed.route} ({self.embed.why})']
        for i, b in enumerate(self.blocks):
            lines.append(f'block {i}: add+norm {b.add_norm.route} ({b.add_norm.why}), '
                         f'mixer {b.mixer.route} ({b.mixer.why})')
        lines += [f'step before block {s.block}: match {s.match}, merge {s.merge}, '
                  f'fold {s.fold} ({s.why})' for s in self.steps]
        return '\n'.join(lines)


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


def _grads(f: ForwardFacts) -> Tuple[Tuple[bool, bool, bool], ...]:
    """Per block: whether autograd records (its input stream, its add + RMSNorm, its mixer),
    from grad mode and the requires-grad flags along the forward."""
    if not f.grad_mode:
        return ((False, False, False), ) * len(f.blocks)
    up, out = f.input_grad or f.embed_grad or f.residual_grad, []
    for b in f.blocks:
        add = up or b.norm_grad
        out.append((up, add, add or b.in_proj_grad))
        up = up or b.params_grad
    return tuple(out)


def _fused_setting(f: ForwardFacts) -> Tuple[Optional[bool], str]:
    """The fused switch (the mixer's argument > AMVIM_FUSED_MIXER) and how it was set."""
    setting = fused_requested(f.mixer.fused)
    src = f'fused={f.mixer.fused}' if f.mixer.fused is not None else \
        f'AMVIM_FUSED_MIXER={int(bool(setting))}'
    return setting, src


def _automatic(f: ForwardFacts, training: bool) -> Choice:
    """The automatic Triton decision (``fused=None``): CUDA, the automatic scan backend, a
    power-of-two state, the measured choices (training: 16-bit autocast and enough tokens;
    inference: the scan table does not name the mamba-ssm kernels) and Triton usable."""
    m = f.mixer
    if f.device != 'cuda':
        return Choice(TORCH, 'not CUDA')
    if requested_backend(m.scan_backend) != 'auto':
        return Choice(TORCH, 'a scan backend was requested')
    if m.d_state & (m.d_state - 1):
        return Choice(TORCH, 'd_state is not a power of two')
    if training and not auto_prefers_fused_training(f.tokens, f.autocast):
        return Choice(TORCH, 'training below the fused minimum (length, 16-bit autocast)')
    if not training and not auto_prefers_fused(f.batch, m.d_inner,
                                               mamba_selective_scan()[0] is not None,
                                               f.tokens, m.num_paths):
        return Choice(TORCH, 'the scan table prefers the mamba-ssm kernels')
    ok, reason = fused_mixer_available('cuda')
    if not ok:
        return Choice(TORCH, reason)
    log_choice_once('mixer' + ' training' * training, 'fused triton',
                    'training' if training else 'inference')
    return Choice(TRITON, 'automatic')


def _triton_decision(f: ForwardFacts) -> Choice:
    """Whether this forward runs the Triton kernels (the old ``fused`` flag)."""
    if f.forced is not None:
        return Choice(TRITON if f.forced else TORCH, f'fused={f.forced} by the caller')
    if f.mixer is None:
        return Choice(TORCH, 'no mixer')
    setting, src = _fused_setting(f)
    if setting is False:
        return Choice(TORCH, src)
    if not f.mixer.supports_fused:
        return Choice(TORCH, 'the mixer merges its paths otherwise')
    if setting is None:
        training = f.grad_mode and (f.input_grad or (bool(f.blocks)
                                                     and f.blocks[0].in_proj_grad))
        return _automatic(f, training)
    ok, reason = fused_mixer_available(f.device)
    if not ok:
        raise BackendUnavailableError(f'the fused mixer was requested (fused=True or '
                                      f'AMVIM_FUSED_MIXER=1) but is not usable: {reason}')
    return Choice(TRITON, src)


def _cpu_fp32(f: ForwardFacts) -> Optional[str]:
    """Why the compiled CPU kernels cannot take this forward (None: they can)."""
    if f.device != 'cpu':
        return 'not a CPU tensor'
    if f.dtype != torch.float32 or f.autocast is not None:
        return 'they compute in float32 (no CPU autocast)'
    if f.tracing:
        return 'a trace or compile is recording'
    return None


def _stream_fp32(f: ForwardFacts, i: int) -> bool:
    """Whether block ``i``'s input stream is float32: with float32 parameters always outside
    autocast; under autocast only the embedding's output (block 0, promoted by the fp32
    position embedding) and a folded merge's are, the mixers' outputs are 16-bit."""
    if f.dtype != torch.float32:
        return False
    red = f.reducer
    return f.autocast is None or i == 0 or (red is not None and red.folds and not f.training
                                            and i in red.steps)


def _embed(f: ForwardFacts, fused: bool) -> Choice:
    if not fused:
        return Choice(TORCH, 'no Triton in this forward')
    if not f.embed_kernel:
        return Choice(TORCH, 'the patch is not the kernel\'s (stride = size, 2^k >= 4)')
    if f.device == 'cuda' and f.autocast not in _HALF:
        return Choice(TORCH, 'float32 on CUDA: cuBLAS')
    if f.grad_mode and (f.input_grad or f.embed_grad):
        return Choice(TRITON_TRAIN, 'grad recorded')
    return Choice(TRITON, 'inference')


def _add_norm(f: ForwardFacts, i: int, fused: bool, grad: bool) -> Choice:
    b = f.blocks[i]
    if fused and grad:
        return Choice(TRITON_TRAIN, 'grad recorded')
    if fused and not b.stochastic:
        return Choice(TRITON, 'inference')
    if b.stochastic:
        return Choice(TORCH, 'stochastic depth')
    why = ('not a CPU tensor' if f.device != 'cpu' else None) or \
        ('it computes in float32' if not _stream_fp32(f, i) else None) or \
        ('a trace or compile is recording' if f.tracing else None) or \
        ('a hook or another norm' if not b.norm_kernel else None) or \
        ('grad recorded' if grad else None) or cpu_ops.status()[1]
    return Choice(CPU, 'CPU inference') if why == 'ok' else Choice(TORCH, why)


def _top_work(f: ForwardFacts, i: int) -> Optional[str]:
    """What ToP asks of block ``i``'s mixer: its importance scores, or its scan aligned over
    the pruned positions (None: nothing). The inference routes (Triton, compiled CPU) do both;
    the training route (grad recorded) leaves them to the PyTorch mixer."""
    red = f.reducer
    if red is not None and i in red.importance:
        return 'ToP importance'
    if red is not None and red.align_from is not None and i >= red.align_from:
        return 'hidden-state alignment'
    return None


def _mixer(f: ForwardFacts, i: int, fused: bool, grad: bool) -> Choice:
    top = _top_work(f, i)
    if fused:
        if grad:
            return Choice(TORCH, f'{top} under autograd') if top else \
                Choice(TRITON_TRAIN, 'grad recorded')
        return Choice(TRITON, f'inference with {top}' if top else 'inference')
    m = f.mixer
    if m is None:
        return Choice(TORCH, 'no mixer')
    if f.device != 'cpu' or not m.supports_fused:
        return Choice(TORCH, 'not a CPU tensor' if f.device != 'cpu' else
                      'the mixer merges its paths otherwise')
    setting, src = _fused_setting(f)
    if setting is False:
        return Choice(TORCH, src)
    if requested_backend(m.scan_backend) not in ('auto', 'cpu'):
        return Choice(TORCH, 'a scan backend was requested')
    why = ('grad recorded' if grad else None) or _cpu_fp32(f) or cpu_ops.available()[1]
    if why != 'ok':
        return Choice(TORCH, why)
    log_choice_once('mixer', 'fused cpu', 'inference')
    return Choice(CPU, f'CPU inference with {top}' if top else 'CPU inference')


def _step(f: ForwardFacts, i: int, fused: bool, grads: Tuple[bool, bool, bool]) -> StepPlan:
    red = f.reducer
    if f.training:
        return StepPlan(i, TORCH, TORCH, False, 'training keeps both streams')
    if fused and not f.grad_mode:
        match = TRITON if TRITON in red.kernels and f.reduction_kernels else TORCH
        # every reducer's step is planned into the next add + RMSNorm (token_merge.plan_merge)
        return StepPlan(i, match, TRITON, True, 'Triton inference')
    up, add, _ = grads
    cpu = _cpu_fp32(f) is None and cpu_ops.status()[0]
    own = red.block_metric and f.blocks[min(i, len(f.blocks) - 1)].own_metric
    if CPU in red.kernels and cpu and f.reduction_kernels and not add and not own:
        return StepPlan(i, CPU, CPU, True, 'CPU inference: the whole step compiled')
    merge = CPU if red.plain_merge and cpu and not up else TORCH
    return StepPlan(i, TORCH, merge, True, 'inference')


def plan_forward(f: ForwardFacts) -> ExecutionPlan:
    """The plan of one forward (or one call) from its facts. Raises
    :class:`~amvim_mm.errors.BackendUnavailableError` when the fused kernels were requested
    (``fused=True`` or ``AMVIM_FUSED_MIXER=1``) and are not usable."""
    decision = _triton_decision(f)
    fused = decision.route == TRITON
    grads = _grads(f)
    blocks = tuple(BlockPlan(_add_norm(f, i, fused, g[1]), _mixer(f, i, fused, g[2]))
                   for i, g in enumerate(grads))
    steps = () if f.reducer is None else tuple(
        _step(f, i, fused, grads[min(i, len(grads) - 1)]) for i in sorted(f.reducer.steps))
    return ExecutionPlan(fused, decision.why, _embed(f, fused), blocks, steps, f)


def as_plan(fused, make) -> ExecutionPlan:
    """``fused`` when it is a plan, else ``make(fused)`` (a bool or None: a plan made for
    the call, with ``fused`` as the caller's Triton decision)."""
    return fused if isinstance(fused, ExecutionPlan) else make(fused)
