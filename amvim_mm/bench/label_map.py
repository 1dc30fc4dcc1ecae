"""Timing mmseg's ``postprocess_result`` against the label-map path
(:mod:`amvim_mm.models.segmentors.label_map`) on random logits: :func:`time_postprocess`.

Both paths get the same (B, C, h, w) logits and fresh data samples with ``ori_shape`` (H, W),
so the rows differ only in the post-processing: mmseg resizes all C classes to H x W and takes
``argmax`` (and keeps the resized logits in every sample); the label map resizes ``chunk``
classes at a time with a running maximum. Before timing, every path's labels are checked to be
identical to mmseg's. Rounds are interleaved (each round times every path, in a rotated order)
so that clock and thermal drift reach all rows alike; CUDA events on a GPU, ``perf_counter`` on
a CPU. Run on the GPU by ``bash tools/gpu/run.sh bench-label-map`` (needs mmseg there: the
segmentation stack of ``tools/gpu/seg_stack.sh``).
"""
from __future__ import annotations

import statistics
from types import SimpleNamespace
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from amvim_mm.errors import ConfigError
from . import measure as B

DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
COLUMNS = ['path', 'chunk', 'ms_median', 'ms_min', 'speedup', 'peak_mib', 'stored_mib']


def _paths(logits: torch.Tensor, out_hw: Tuple[int, int], align_corners: bool,
           chunks: Sequence[int]) -> Dict[str, Tuple[Callable[[], list], object]]:
    """name -> (a call that post-processes the batch into fresh samples, its chunk)."""
    from mmseg.models.segmentors.base import BaseSegmentor
    from mmseg.structures import SegDataSample
    from amvim_mm.models.segmentors.label_map_segmentor import label_map_postprocess
    owner = SimpleNamespace(align_corners=align_corners,
                            decode_head=SimpleNamespace(threshold=0.3))

    def samples():
        return [SegDataSample(metainfo=dict(ori_shape=out_hw, padding_size=[0, 0, 0, 0]))
                for _ in range(logits.shape[0])]

    paths = {'mmseg': (lambda: BaseSegmentor.postprocess_result(owner, logits, samples()),
                       None)}
    for chunk in chunks:
        paths[f'label_map-{chunk}'] = (
            lambda c=chunk: label_map_postprocess(owner, logits, samples(), chunk=c), chunk)
    return paths


def _check_identical(paths: Dict[str, Tuple[Callable[[], list], object]]) -> None:
    ref = [s.pred_sem_seg.data for s in paths['mmseg'][0]()]
    for name, (fn, _) in paths.items():
        got = [s.pred_sem_seg.data for s in fn()]
        bad = sum(int((a != b).sum()) for a, b in zip(got, ref, strict=True))
        if bad:
            raise AssertionError(f'{name}: {bad} labels differ from mmseg postprocess_result')


def _memory(fn: Callable[[], list], device: str) -> Dict[str, float]:
    """Peak memory of one call above what was allocated before it, and the bytes its
    samples keep (``seg_logits``: mmseg's resized logits)."""
    if device != 'cuda':
        out = fn()
        return {'peak_mib': None, 'stored_mib': _stored_mib(out)}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return {'peak_mib': round(peak, 1), 'stored_mib': _stored_mib(out)}


def _stored_mib(samples: list) -> float:
    total = sum(s.seg_logits.data.numel() * s.seg_logits.data.element_size()
                for s in samples if 'seg_logits' in s)
    return round(total / 2 ** 20, 1)


def time_postprocess(*, batch: int = 8, classes: int = 150,
                     in_hw: Tuple[int, int] = (128, 171), out_hw: Tuple[int, int] = (512, 683),
                     device: str = 'cuda', chunks: Sequence[int] = (8, 16, 32, 64),
                     iters: int = 20, rounds: int = 5, warmup: int = 2, dtype: str = 'fp32',
                     align_corners: bool = False, seed: int = 0) -> Dict[str, object]:
    """Milliseconds per batch of mmseg's ``postprocess_result`` and of the label-map path for
    each of ``chunks`` (median and minimum over ``rounds`` interleaved rounds of ``iters``
    calls), after checking that all give mmseg's labels. Returns the settings, the environment
    and one row per path (``speedup``: mmseg's median over the row's; ``peak_mib``: the peak
    memory of one call on CUDA; ``stored_mib``: what the samples keep)."""
    if dtype not in DTYPES:
        raise ConfigError(f'time_postprocess: dtype must be one of {sorted(DTYPES)}, got '
                          f'{dtype!r}')
    if device == 'cuda' and not torch.cuda.is_available():
        raise ConfigError('time_postprocess: device cuda asked for, but CUDA is not available')
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, classes, *in_hw, generator=gen).to(device, DTYPES[dtype])
    out_hw = (int(out_hw[0]), int(out_hw[1]))
    with torch.no_grad():
        paths = _paths(logits, out_hw, align_corners, chunks)
        _check_identical(paths)
        memory = {name: _memory(fn, device) for name, (fn, _) in paths.items()}
        times = _interleaved(paths, device, iters=iters, rounds=rounds, warmup=warmup)
    rows = []
    for name, (_, chunk) in paths.items():
        ms = times[name]
        rows.append(dict(path=name.split('-')[0], chunk=chunk,
                         ms_median=round(statistics.median(ms), 3),
                         ms_min=round(min(ms), 3), ms_rounds=[round(t, 3) for t in ms],
                         **memory[name]))
    for r in rows:
        r['speedup'] = round(rows[0]['ms_median'] / r['ms_median'], 3)
    return dict(batch=batch, classes=classes, in_hw=list(in_hw), out_hw=list(out_hw),
                dtype=dtype, align_corners=align_corners, iters=iters, rounds=rounds,
                device=device, identical=True, env=B.environment(), rows=rows)


def _interleaved(paths: Dict[str, Tuple[Callable[[], list], object]], device: str, *,
                 iters: int, rounds: int, warmup: int) -> Dict[str, List[float]]:
    names = list(paths)
    for name in names:
        for _ in range(warmup):
            paths[name][0]()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(B._timer(paths[name][0], iters, device) * 1e3)
    return times


def format_rows(result: Dict[str, object]) -> str:
    """The rows of :func:`time_postprocess` as a markdown table, with a line of settings."""
    head = (f"batch {result['batch']}, {result['classes']} classes, {result['in_hw']} -> "
            f"{result['out_hw']}, {result['dtype']}, {result['device']} "
            f"({result['env'].get('gpu', result['env'].get('cpu'))}), labels identical")
    return head + '\n\n' + B.table(result['rows'], COLUMNS)
