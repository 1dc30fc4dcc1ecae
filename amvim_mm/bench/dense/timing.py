"""Timing one row of the dense suite: warm-up under the path probe, timed repeats, peak
memory."""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn as nn

from .probe import PathProbe


def autocast_for(device: str, dtype: str):
    return torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == 'bf16')


def sync(device: str) -> None:
    if device == 'cuda':
        torch.cuda.synchronize()


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors``."""
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def prepare_step(step: Callable[[], object], probe_model: nn.Module, *, device: str,
                 warmup: int, own_bytes: int = 0, graph: bool = False
                 ) -> Tuple[Callable[[], object], Dict[str, object]]:
    """Warm ``step`` up (the first call under :class:`PathProbe`) and return (the call to
    time, its fields: peak memory and the path).

    ``graph``: after the probed eager call, ``step`` is captured in one CUDA graph (after
    ``warmup - 1`` more eager calls on a side stream, at least one) and the call to time is its
    replay; the graph's memory pool counts in the peak.

    ``peak_mib``: ``torch.cuda.max_memory_allocated`` after a reset before the first call,
    less what was resident then but is not this row's (other models kept for later rows):
    the row's weights, inputs (``own_bytes`` of the resident memory), optimizer state and
    activations. ``device_peak_mib``: the raw maximum. Both are read after the warm-up, whose
    calls allocate what the timed ones do."""
    sync(device)
    others = 0
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        others = torch.cuda.memory_allocated() - own_bytes
    with PathProbe(probe_model) as probe:
        step()
    call = step
    if graph:
        from amvim_mm.bench.measure import capture_cuda_graph
        captured, _ = capture_cuda_graph(step, warmup=max(warmup - 1, 1))
        call = captured.replay
        call()
    else:
        for _ in range(warmup - 1):
            step()
    sync(device)
    out: Dict[str, object] = dict(peak_mib=None, device_peak_mib=None)
    if device == 'cuda':
        peak = torch.cuda.max_memory_allocated()
        out['peak_mib'] = round((peak - others) / 2**20, 1)
        out['device_peak_mib'] = round(peak / 2**20, 1)
    out.update(probe.summary())
    return call, out


def summarize(times: List[float], batch: int) -> Dict[str, object]:
    """Images/s and ms per call (medians of ``times``, seconds per call) and their spread."""
    med = statistics.median(times)
    return dict(img_per_s=round(batch / med, 2), ms_per_iter=round(med * 1e3, 3),
                spread_pct=round(100 * (max(times) - min(times)) / med, 2),
                times_ms=[round(t * 1e3, 3) for t in times])
