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

:func:`plan_vim` decides all of them from :class:`~.facts.ForwardFacts`, plain values read
once at the start of the forward (device, dtypes, autocast, grad recording, training, shape,
the switches of :mod:`amvim_mm.runtime`, the layers' and the reducer's declared properties),
and returns a frozen :class:`~.plan.ExecutionPlan` that says, for every part, the route and
why (the step routes are every family's rule, :func:`~.facts.plan_step`). The embedding, the
blocks, the mixers and the reduction session only read it. Kernel availability is asked here
too (probed lazily and cached by :mod:`amvim_mm.ops`), and the ops' ``*_misfit`` functions stay
the reference for what a kernel takes. A block or mixer called outside a forward (tests,
tools) gets a plan made for that call by the same function (:func:`call_facts`).

A new kernel is one more route value here, and one more branch in the module that runs it.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from amvim_mm.errors import BackendUnavailableError
from amvim_mm.ops import cpu_ops
from amvim_mm.ops.backends import log_choice_once, mamba_selective_scan, requested_backend
from amvim_mm.ops.fused_mixer import fused_mixer_available, fused_requested
from amvim_mm.ops.fused_mixer_autograd import auto_prefers_fused_training
from amvim_mm.ops.scan_choice import auto_prefers_fused
from .facts import (BlockFacts, ForwardFacts, MixerFacts, ReducerFacts, cpu_fp32, forward_facts,
                    grads, plan_steps)
from .plan import CPU, TORCH, TRITON, TRITON_TRAIN, BlockPlan, Choice, ExecutionPlan

__all__ = ['plan_vim', 'call_facts']

_HALF = (torch.float16, torch.bfloat16)


def call_facts(hidden: torch.Tensor, mixer: Optional[MixerFacts], block: BlockFacts,
               training: bool, ctx=None, residual: Optional[torch.Tensor] = None,
               tokens: Optional[int] = None) -> ForwardFacts:
    """The facts of one block or mixer call on ``hidden`` (B, L, D) outside a forward (tests,
    tools); ``ctx``: the call's scan context (its ToP flags force the PyTorch mixer under
    autograd)."""
    red = None
    if ctx is not None and (ctx.want_importance or (ctx.align is not None and ctx.reduced)):
        red = ReducerFacts((0, ), frozenset(), frozenset({0}) if ctx.want_importance
                           else frozenset(), 0 if ctx.align is not None and ctx.reduced
                           else None, False, False, frozenset(), False)
    grad = torch.is_grad_enabled()
    return forward_facts(hidden, hidden.dtype, training,
                         tokens if tokens is not None else
                         (hidden.shape[1] if hidden.dim() > 1 else 0), (block, ), red,
                         mixer=mixer,
                         residual_grad=grad and residual is not None and residual.requires_grad)


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
    why = ('grad recorded' if grad else None) or cpu_fp32(f) or cpu_ops.available()[1]
    if why != 'ok':
        return Choice(TORCH, why)
    log_choice_once('mixer', 'fused cpu', 'inference')
    return Choice(CPU, f'CPU inference with {top}' if top else 'CPU inference')


def plan_vim(f: ForwardFacts, family: str = 'Vim') -> ExecutionPlan:
    """The plan of one Vim-family forward (or one call) from its facts. Raises
    :class:`~amvim_mm.errors.BackendUnavailableError` when the fused kernels were requested
    (``fused=True`` or ``AMVIM_FUSED_MIXER=1``) and are not usable."""
    decision = _triton_decision(f)
    fused = decision.route == TRITON
    blocks = tuple(BlockPlan(_add_norm(f, i, fused, g[1]), _mixer(f, i, fused, g[2]))
                   for i, g in enumerate(grads(f)))
    return ExecutionPlan(family, fused, decision.why, _embed(f, fused), blocks,
                         plan_steps(f, fused), f)
