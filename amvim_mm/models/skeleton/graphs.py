"""CUDA-graph inference for a backbone's forward, on by default (``cuda_graph=None`` follows
``AMVIM_CUDA_GRAPH``, 1 unless set to 0; ``cuda_graph=False`` turns one backbone off).

Why: at the shapes of the dense tasks (a 512 x 512 window at batch 1-8) an eager Vim-T
forward on an H200 is bound by the host: Python, the mixers' decisions and about 120 kernel
launches take many times the GPU work of the fused path (measured in ``benchmarks/runs/``,
see ``benchmarks/README.md``). A user's
mmseg / mmdet pipeline stays eager; this replays the backbone's forward from a CUDA graph
instead, with the same kernels and the same numbers. On by default because the libraries'
test loops call the backbone eagerly, where a token-reduced forward (more launches and host
work per block, less GPU work) was slower than the full one (benchmarks/README.md).

How: :class:`InferenceGraphs` keeps, per key (input shape, dtype, autocast state, the runtime
switches, the mixers' ``fused`` settings, the token reducer's configuration, the outputs'
``out_type`` and ``out_indices``, and every parameter's and buffer's storage and version), one
captured forward. A key is run eagerly the
first time it is seen (that call compiles the kernels and serves as the warm-up), captured the
second time and replayed from then on: the images are copied into the graph's static input,
the outputs are cloned out of its static output (a later replay overwrites those). A weight
loaded or stepped in place changes its version, so the key, so the graph is captured again; at
most ``max_graphs`` graphs are kept (the least recently used one is dropped with its memory).

A forward runs eagerly, as without this, whenever a graph could be wrong or cannot exist
(:meth:`InferenceGraphs.why_eager`): ``torch.jit`` tracing or ``torch.compile`` recording (they
would record a replay instead of the work), CPU tensors, training mode, gradients enabled, a capture
already running (an outer graph, e.g. the benchmarks'), forward hooks on the backbone or any
of its modules (a hook would run only at capture), the final stream being recorded, or a token
reducer that is not on the allow-list :data:`GRAPH_SAFE_REDUCERS` (reducers whose choices are
made on the GPU from the tensors alone with fixed token counts; RandomPrune draws on a CPU
generator, threshold reducers such as LTMP change their counts with the data). A capture
that fails (e.g. an operation that synchronizes with the host) logs one warning and keeps that
key eager. Each replay restores what the eager forward leaves on the backbone (its
``last_record``: the token counts; the context is the captured one, whose tensors the replays
refresh). A backbone whose forward cannot be captured names the reason in its
``graph_misfit()`` (see :class:`~amvim_mm.models.skeleton.base.MambaBackbone`).
"""
from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

from amvim_mm import runtime
from amvim_mm.ops.cpu_ops import tracing

__all__ = ['InferenceGraphs', 'GRAPH_SAFE_REDUCERS', 'graphs_requested', 'reducer_misfit']

#: token reducers whose inference forward is a fixed sequence of GPU kernels with fixed token
#: counts (tested in a replay against the eager forward: tests/models/test_gpu.py); DynamicViT's
#: inference drops a scheduled count of tokens by its predictors' scores (its training forward
#: is not captured: training mode runs eagerly)
GRAPH_SAFE_REDUCERS = ('ToMe', 'EViT', 'ToP', 'DynamicViTReducer')


def _no_cast_cache():
    """The caller's autocast state with autocast's weight-cast cache off, for a capture: with
    the cache on, the warm-up's fp32 -> 16-bit weight casts are cached for the caller's autocast
    region and the captured forward reads those copies instead of casting, so its replays read
    memory freed when that region ends (wrong numbers, or an illegal address once the block
    is returned to the driver). Off, the graph holds the casts."""
    return torch.autocast('cuda', dtype=torch.get_autocast_dtype('cuda'),
                          enabled=torch.is_autocast_enabled('cuda'), cache_enabled=False)


def graphs_requested(setting: Optional[bool]) -> bool:
    """A backbone's ``cuda_graph`` argument, ``None`` deferring to ``AMVIM_CUDA_GRAPH``."""
    return runtime.settings().cuda_graph if setting is None else bool(setting)


def reducer_misfit(reducer) -> Optional[str]:
    """Why a forward with token reducer ``reducer`` cannot be captured, or None (no reducer,
    or one of :data:`GRAPH_SAFE_REDUCERS` that decides once per batch)."""
    if reducer is None:
        return None
    name = type(reducer).__name__
    if name not in GRAPH_SAFE_REDUCERS or reducer.dynamic:
        return f'token reducer {name} is not on the graph allow-list'
    return None


class _Entry:
    """One captured forward: the graph, its static input and output, the side attributes."""

    __slots__ = ('graph', 'x', 'out', 'record')

    def __init__(self, graph, x, out, record) -> None:
        self.graph, self.x, self.out, self.record = graph, x, out, record


def _survey(module: nn.Module) -> Tuple[Optional[str], tuple, tuple]:
    """One walk over ``module``'s modules (the walk costs more than what it reads, so a
    forward takes one): (the type name of the first module with forward hooks or None, the
    ``fused`` settings of the modules that have one, every parameter's and buffer's storage
    and version)."""
    hooked, fused, state = None, [], []
    for m in module.modules():
        if hooked is None and (m._forward_hooks or m._forward_pre_hooks):
            hooked = type(m).__name__
        d = m.__dict__
        if 'fused' in d:
            fused.append(d['fused'])
        for t in d['_parameters'].values():
            if t is not None:
                state.append((t.data_ptr(), t._version))
        for t in d['_buffers'].values():
            if t is not None:
                state.append((t.data_ptr(), t._version))
    return hooked, tuple(fused), tuple(state)


def _clone(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if hasattr(out, '_fields'):        # a named tuple (a TokenGrid): its fields one by one
        return type(out)(*(_clone(o) for o in out))
    if isinstance(out, (tuple, list)):
        return type(out)(_clone(o) for o in out)
    return out


class InferenceGraphs:
    """The captured forwards of one backbone (see the module docstring).

    Args:
        max_graphs: how many keys keep a graph (the least recently used beyond it is dropped).
    """

    def __init__(self, max_graphs: int = 8) -> None:
        if max_graphs < 1:
            raise ValueError(f'max_graphs must be >= 1, got {max_graphs}')
        self.max_graphs = max_graphs
        self.graphs: 'collections.OrderedDict[tuple, _Entry]' = collections.OrderedDict()
        #: keys seen once (captured at the next sighting) and keys whose capture failed
        self.seen: 'collections.OrderedDict[tuple, bool]' = collections.OrderedDict()
        self.failed: Dict[tuple, str] = {}
        #: counters for tests and benchmarks: eager forwards, captures, replays
        self.stats = collections.Counter()

    # ------------------------------------------------------------------ decisions
    @staticmethod
    def why_eager(module: nn.Module, x, survey: Optional[tuple] = None) -> Optional[str]:
        """Why this forward of ``module`` must run eagerly, or None when a graph may serve it
        (``survey``: :func:`_survey` of ``module`` when the caller has it)."""
        if tracing():
            return 'a trace or compile is recording'    # it would record a replay, not the work
        misfit = getattr(module, 'graph_misfit', None)      # the family's own reason, if any
        reason = misfit() if misfit is not None else None
        if reason is not None:
            return reason
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            return 'not a CUDA tensor'
        if module.training:
            return 'training mode'
        if torch.is_grad_enabled():
            return 'gradients enabled'
        if torch.cuda.is_current_stream_capturing():
            return 'a CUDA graph capture is running'
        if getattr(module, 'record_final_stream', False):
            return 'the final stream is recorded'
        reason = reducer_misfit(getattr(module, 'token_reducer', None))
        if reason is not None:
            return reason
        hooked = (survey or _survey(module))[0]
        return None if hooked is None else f'forward hooks on {hooked}'

    @staticmethod
    def key(module: nn.Module, x: torch.Tensor, survey: Optional[tuple] = None) -> tuple:
        """Everything a captured forward depends on besides the images' values."""
        _, fused, state = survey or _survey(module)
        reducer = getattr(module, 'token_reducer', None)
        reduction = None if reducer is None else (id(reducer), repr(reducer), tuple(sorted(
            (k, v) for k, v in vars(reducer).items()
            if isinstance(v, (int, float, str, bool, tuple, type(None))))))
        autocast = (torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda'))
        # what the outputs are (out_type, out_indices), which a user may change between calls
        outputs = (getattr(module, 'out_type', None),
                   tuple(getattr(module, 'out_indices', None) or ()))
        # the weights' part last: a capture drops the graphs made with other weights
        return (tuple(x.shape), x.dtype, x.device, autocast, runtime.settings(), fused,
                reduction, outputs, state)

    # ------------------------------------------------------------------ running
    def run(self, module: nn.Module, x: torch.Tensor, eager: Callable[[torch.Tensor], object],
            check: Optional[Callable[[torch.Tensor], object]] = None):
        """``eager(x)`` or a replay of its captured graph (see the module docstring);
        ``check(x)`` validates the images before a replay (a graph cannot hold the host-side
        checks of the eager forward, e.g. the backbones' NaN test)."""
        survey = _survey(module) if isinstance(x, torch.Tensor) and x.is_cuda else None
        if self.why_eager(module, x, survey) is not None:
            self.stats['eager'] += 1
            return eager(x)
        key = self.key(module, x, survey)
        entry = self.graphs.get(key)
        if entry is None:
            if key in self.failed or key not in self.seen:
                self.seen[key] = True
                while len(self.seen) > 4 * self.max_graphs:
                    self.seen.popitem(last=False)
                self.stats['eager'] += 1
                return eager(x)
            entry = self._capture(module, x, key, eager)
            if entry is None:
                self.stats['eager'] += 1
                return eager(x)
        else:
            self.graphs.move_to_end(key)
            if check is not None:
                check(x)
        entry.x.copy_(x)
        entry.graph.replay()
        self.stats['replay'] += 1
        if entry.record is not None:
            module.last_record = dataclasses.replace(
                entry.record, token_counts=list(entry.record.token_counts))
        return _clone(entry.out)

    def _capture(self, module, x, key, eager) -> Optional[_Entry]:
        static_x = x.clone()
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with _no_cast_cache():
                with torch.cuda.stream(side):
                    eager(static_x)              # warm-up on the capturing stream's side
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    out = eager(static_x)
        except Exception as e:   # noqa: BLE001  (any capture failure: stay eager for this key)
            msg = f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'[:200]
            self.failed[key] = msg
            self.seen.pop(key, None)
            warnings.warn(f'{type(module).__name__}: CUDA-graph capture failed, this input '
                          f'shape runs eagerly ({msg})', RuntimeWarning, stacklevel=4)
            torch.cuda.synchronize()
            return None
        self.stats['capture'] += 1
        self.seen.pop(key, None)
        for old in [k for k in self.graphs if k[-1] != key[-1]]:
            del self.graphs[old]              # made with weights that are gone
        entry = _Entry(graph, static_x, out, getattr(module, 'last_record', None))
        self.graphs[key] = entry
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return entry

    def __deepcopy__(self, memo) -> 'InferenceGraphs':
        # graphs hold the original's memory and pointers: a copied module captures its own
        return InferenceGraphs(self.max_graphs)

    def __getstate__(self) -> dict:
        return dict(max_graphs=self.max_graphs)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state['max_graphs'])

    def clear(self) -> None:
        """Drop every graph (and its memory) and what was seen."""
        self.graphs.clear()
        self.seen.clear()
        self.failed.clear()
