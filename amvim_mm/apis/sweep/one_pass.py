"""One pass over the test data for all of a model's pending evaluations (the sweep's default).

Cell by cell, every (method, ratio, seed) runs the config's test loop again: the images are read,
decoded and preprocessed once per cell. Here the test dataloader is iterated once; each batch is
preprocessed once (the model's ``data_preprocessor``) and every evaluation runs the model's
``predict`` on it with its own reducer, feeding its own evaluator (one per evaluation, built from
the config's ``test_evaluator``). The numbers are those of cell-by-cell evaluation: the same
preprocessed tensors, the same forward per evaluation, each metric accumulating its own results
(bitwise equal on the CPU, ``tests/test_one_pass.py``; on a GPU to the rounding of the kernels
of batches that differ in nothing else).

What the libraries' ``TestLoop`` does around the iterations is kept: the model in eval mode,
``torch.no_grad()``, the precision of :class:`~amvim_mm.engine.loops.AmpTestLoop` inside each
forward, the hooks ``before_run`` / ``before_test`` / ``before_test_epoch`` before the pass and
``after_test_epoch`` / ``after_test`` / ``after_run`` after it (e.g. an ``EMAHook`` swaps its
weights in), the dataset's meta on every evaluator, and each evaluator's ``evaluate(len(dataset))``
(which in a distributed run gathers the ranks' results on rank 0). Each evaluation's reducer is
built once and swapped in per batch, and the backbone's CUDA-graph cache holds every
evaluation's graph for the pass (:mod:`~amvim_mm.models.skeleton.graphs` keys a graph by the
reducer object: a reducer rebuilt per batch, or a cache smaller than the evaluations, would
capture again and again). The per-iteration hooks
(logging, visualisation) are not called: their only sweep-relevant job, telling a random
reducer the images of the batch (:class:`~amvim_mm.engine.hooks.ImageIdentityHook`), is done
here for every evaluation.

Not shared: the blocks before the first reduction location. ToMe and random pruning reduce from
block 0 (the AMVim protocol), so their evaluations share nothing beyond the embedding; EViT /
ToP prune after block 9 of 24, where the unreduced prefix could be shared, but their importance
is computed inside the block at the location from that block's own pass (and ToP's alignment
reads the prefix's step sizes), so a shared prefix needs a resumable forward of every family:
not built (each evaluation runs its whole backbone).

Memory: what the evaluators keep per image and evaluation (mIoU: the areas per class; Top-1: a
score vector; COCO: the kept detections); the forwards run one at a time. :func:`pass_fits`
estimates it before a pass; a pass that would fill more than :data:`MEMORY_SHARE` of the
available memory (e.g. ImageNet's 50,000 score vectors for each of many evaluations) runs cell
by cell.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from amvim_mm.errors import ConfigError


@dataclass
class Evaluation:
    """One test-loop equivalent: a reducer config (None: no reduction) on the model."""

    reduction: Optional[dict]
    seconds: float = 0.0
    metrics: Dict[str, float] = field(default_factory=dict)
    evaluator: object = None
    recorder: object = None


#: bytes a metric keeps per image and evaluation, per class of the data set (mmseg's IoUMetric:
#: intersection, union, prediction and label areas in float64; mmpretrain's Accuracy: the score
#: vector, fp32) or flat (mmdet's CocoMetric: up to 100 boxes with score and label, plus RLE
#: masks for 'segm')
STATE_BYTES = {'IoUMetric': (4 * 8, 0), 'Accuracy': (4, 64), 'CocoMetric': (0, 100 * 2048)}
#: the share of the machine's available memory a pass may fill with its evaluators' state
MEMORY_SHARE = 0.25


def available_memory() -> int:
    """Bytes of physical memory available now (Linux / macOS sysconf)."""
    import os
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def pass_fits(runner, evaluations: int):
    """(whether ``evaluations`` evaluators of the config's metric fit in their share of the
    available memory (:data:`MEMORY_SHARE`) over the whole test set, why not): the default one
    pass falls back to cell by cell (one evaluator at a time) when they do not."""
    dataset = runner.test_dataloader.dataset
    cfg = runner.cfg.get('test_evaluator') or {}
    metrics = cfg if isinstance(cfg, list) else [cfg]
    classes = len((getattr(dataset, 'metainfo', None) or {}).get('classes', ()) or ()) or 1000
    per_image = 0
    for m in metrics:
        per_class, flat = STATE_BYTES.get(str(m.get('type', '')).split('.')[-1], (0, 4096))
        per_image += per_class * classes + flat
    need = per_image * len(dataset) * evaluations
    budget = int(available_memory() * MEMORY_SHARE)
    if need <= budget:
        return True, ''
    return False, (f'one pass would keep about {need / 2**20:.1f} MiB of metric state '
                   f'({evaluations} evaluations x {len(dataset)} images), more than '
                   f'{MEMORY_SHARE:.0%} of the available {budget / MEMORY_SHARE / 2**20:.1f} MiB')


def _evaluators(runner, evals: Sequence[Evaluation], dataset) -> None:
    """A fresh evaluator of the config's ``test_evaluator`` and its recorder per evaluation."""
    import copy

    from amvim_mm.analysis import stats as S
    cfg = runner.cfg.get('test_evaluator')
    if cfg is None:
        raise ConfigError('the config has no test_evaluator: nothing to evaluate with')
    for ev in evals:
        ev.evaluator = runner.build_evaluator(copy.deepcopy(cfg))
        if hasattr(dataset, 'metainfo'):
            ev.evaluator.dataset_meta = dataset.metainfo
        recorders = [S.MetricRecorder(m) for m in ev.evaluator.metrics
                     if type(m).__name__ in S.KINDS]
        if len(recorders) != 1:
            raise ConfigError(f'expected one test metric of {", ".join(S.KINDS)}, found '
                              f'{len(recorders)}')
        ev.recorder = recorders[0]


def _announce_images(backbone, data_batch) -> None:
    from amvim_mm.engine.hooks import image_keys
    reducer = getattr(backbone, 'token_reducer', None)
    if hasattr(reducer, 'set_image_keys'):
        reducer.set_image_keys(image_keys(data_batch))


def run_one_pass(runner, backbone, evals: Sequence[Evaluation], precision: str = 'fp32',
                 progress=None) -> None:
    """Evaluate every ``evals`` entry in one pass over ``runner``'s test data; fills each
    entry's ``metrics`` (the library's, on every rank), ``seconds`` (its forwards and metric
    updates) and ``recorder`` (per-image statistics on rank 0). ``progress``: a callable
    given the fraction done after each batch."""
    import torch

    from amvim_mm.engine.loops import precision_autocast
    loop = runner.test_loop          # builds the dataloader (sharded in a distributed run)
    loader, model = loop.dataloader, runner.model
    _evaluators(runner, evals, loader.dataset)
    reducers = []
    for ev in evals:                 # built and validated once: a CUDA graph per evaluation
        backbone.set_token_reduction(ev.reduction)
        reducers.append(backbone.token_reducer)
    for hook in ('before_run', 'before_test', 'before_test_epoch'):
        runner.call_hook(hook)
    model.eval()
    n = len(loader)
    graphs = getattr(backbone, '_graphs', None)
    kept = getattr(graphs, 'max_graphs', None)
    if kept is not None:             # every evaluation's graphs stay captured through the pass
        graphs.max_graphs = max(kept, 4 * len(evals))
    try:
        with torch.no_grad():
            for i, data_batch in enumerate(loader):
                data = model.data_preprocessor(data_batch, False)
                for ev, reducer in zip(evals, reducers, strict=True):
                    t0 = time.perf_counter()
                    backbone.swap_token_reducer(reducer)
                    _announce_images(backbone, data_batch)
                    with precision_autocast(model, precision):
                        outputs = model._run_forward(_fresh(data), mode='predict')
                    ev.evaluator.process(data_samples=outputs, data_batch=data_batch)
                    ev.seconds += time.perf_counter() - t0
                if progress is not None:
                    progress((i + 1) / max(n, 1))
    finally:
        backbone.set_token_reduction(None)
        if kept is not None:
            graphs.max_graphs = kept
    for ev in evals:
        t0 = time.perf_counter()
        ev.metrics = ev.evaluator.evaluate(len(loader.dataset))
        ev.seconds += time.perf_counter() - t0
    runner.call_hook('after_test_epoch', metrics=evals[0].metrics if evals else {})
    for hook in ('after_test', 'after_run'):
        runner.call_hook(hook)


def _fresh(data):
    """The preprocessed batch for one evaluation: the same input tensors, the data samples as
    shallow copies (``predict`` writes its predictions into them; the metric reads them before
    the next evaluation, but no evaluation sees another's fields)."""
    if not isinstance(data, dict) or 'data_samples' not in data:
        return data
    samples = data['data_samples']
    if isinstance(samples, (list, tuple)):
        # mmengine's BaseDataElement.new(): the same metainfo and fields (tensors shared)
        samples = [s.new() for s in samples]
    return dict(data, data_samples=samples)
