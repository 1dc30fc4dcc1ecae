"""Cached index tensors (scan ranks, path permutations) that stay plain constants under a trace.

The layouts cache their index tensors per grid (``functools.lru_cache``). Built for the first
time inside a trace, such a tensor would be the tracer's: under ``torch.export`` (and so
``torch.onnx.export(..., dynamo=True)``) a fake tensor without values (the checks on it,
``torch.equal``, cannot run, and the cache would keep it after the export), under the
TorchScript exporter a value of the recorded graph. :func:`constant_cache` builds them with
every tracer suspended, so each is a real tensor whatever records the forward: ``torch.export``
lifts it as a constant, the TorchScript trace reads it as one, an eager forward reuses it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch

__all__ = ['constant_cache', 'outside_trace']


@contextlib.contextmanager
def outside_trace() -> Iterator[None]:
    """Run the block eagerly with real tensors: the dispatch modes of a ``torch.export`` trace
    (fake tensors, the proxy recording) and a ``torch.jit`` trace suspended."""
    from torch.utils._python_dispatch import _disable_current_modes
    state = torch._C._get_tracing_state()
    if state is not None:
        torch._C._set_tracing_state(None)
    try:
        with _disable_current_modes():
            yield
    finally:
        if state is not None:
            torch._C._set_tracing_state(state)


def constant_cache(maxsize: int) -> Callable[[Callable], Callable]:
    """``functools.lru_cache(maxsize)`` whose misses are computed :func:`outside_trace` (the
    function must build its result from its hashable arguments alone)."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def build(*args):
            with outside_trace():
                return fn(*args)
        return functools.lru_cache(maxsize=maxsize)(build)
    return wrap
