"""The evaluation of one sweep cell: a model (one runner, its checkpoint loaded) with one
method at one ratio, through the config's test loop and the library's metric; the result is a
:class:`~amvim_mm.apis.sweep.rows.SweepRow` with the analytic GFLOPs, the realised ratio and the
per-image statistics written next to ``results.json``.
"""
from __future__ import annotations

import dataclasses
import os
import os.path as osp
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from amvim_mm.apis.dist import broadcast, is_main
from amvim_mm.apis.sweep.methods import LEARNED, SEEDED_METHODS, cell_reducer, method_version
from amvim_mm.apis.sweep.rows import Fingerprint, SweepRow
from amvim_mm.apis.sweep.store import reusable_rows, stats_name, zero_row
from amvim_mm.errors import ConfigError, LookupConfigError

#: the metric of a row, per library (``default_scope``)
PRIMARY_METRICS = {'mmseg': 'mIoU', 'mmdet': 'coco/bbox_mAP', 'mmpretrain': 'accuracy/top1'}


def fine_tuning_label(meta: dict) -> str:
    """``'fine-tuned N epochs'`` / ``'fine-tuned N iterations'`` from a checkpoint's ``meta``
    (mmengine's ``epoch`` / ``iter``; an exported student keeps them), else ``'fine-tuned'``."""
    epoch, it = meta.get('epoch'), meta.get('iter')
    if isinstance(epoch, int) and epoch > 0:
        return f'fine-tuned {epoch} epoch' + ('s' if epoch > 1 else '')
    if isinstance(it, int) and it > 0:
        return f'fine-tuned {it} iterations'
    return 'fine-tuned'


def _image_keys(runner, recorder) -> List[str]:
    """Identities of the evaluated images, in the order of the per-image statistics."""
    if recorder.kind == 'det':
        return [str(i) for i in recorder.metric.img_ids]
    ds = runner.test_dataloader.dataset
    keys = []
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        keys.append(osp.basename(str(info.get('img_path', info.get('img_id', i)))))
    return keys


@dataclass
class ModelCells:
    """What evaluating one model's cells needs (one runner per model)."""

    runner: object
    backbone: object
    learned: object
    recorder: object
    config: str
    ckpt: str
    name: str
    precision: str
    metric_key: str
    seeds: List[int]
    locations: Optional[Sequence[int]]
    flops_convention: str
    measure_speed: bool
    out_dir: str
    results: str
    fingerprint: Fingerprint

    def evaluate(self, method: str, ratio: float, proto: str,
                 done: Dict[tuple, dict]) -> Optional[SweepRow]:
        """Evaluate one (method, ratio) cell through the config's test loop (once per seed),
        or reuse this model's ratio-0 evaluation. The row on rank 0, None on other ranks (a
        distributed run: every rank runs the sharded loops)."""
        reused = self._reuse_zero(method, ratio, proto, done)
        if reused is not None:
            return reused
        ratio, seeds, dynamic = self._plan(method, ratio)
        t0 = time.perf_counter()
        metrics, stats, red = [], [], None
        for seed in seeds:
            red = cell_reducer(self.backbone, method, ratio, self.locations, seed,
                               learned=self.learned)
            self.backbone.set_token_reduction(red)
            try:
                metrics.append(self.runner.test())
            finally:
                self.backbone.set_token_reduction(None)
            stats.append(self.recorder.stats() if is_main() else None)
        return self._row(method, ratio, proto, seeds, metrics, stats, red,
                         time.perf_counter() - t0, dynamic, self.recorder)

    def evaluate_pass(self, cells: Sequence[tuple], done: Dict[tuple, dict],
                      progress=None) -> List[Optional[SweepRow]]:
        """Evaluate ``cells`` ((method, ratio, protocol), no ``learned``) in one pass over the
        test data (:mod:`~amvim_mm.apis.sweep.one_pass`): ratio 0 once for every method, each
        (method, ratio, seed) its own evaluation. Rows in the order of ``cells`` (None on
        ranks other than 0)."""
        from amvim_mm.apis.sweep.one_pass import Evaluation, run_one_pass
        plans, evals, zero = [], [], False
        for method, ratio, proto in cells:
            if method == LEARNED:
                raise ConfigError('the learned method is evaluated cell by cell')
            reused = self._reuse_zero(method, ratio, proto, done)
            if reused is not None or (ratio == 0.0 and zero):
                plans.append((method, ratio, proto, reused))    # None: the pass's ratio-0 row
                continue
            ratio, seeds, _ = self._plan(method, ratio)
            reds = [cell_reducer(self.backbone, method, ratio, self.locations, seed,
                                 learned=self.learned) for seed in seeds]
            idx = list(range(len(evals), len(evals) + len(seeds)))
            evals += [Evaluation(reduction=r) for r in reds]
            plans.append((method, ratio, proto, (seeds, idx, reds[-1])))
            zero = zero or ratio == 0.0
        if evals:
            run_one_pass(self.runner, self.backbone, evals, self.precision, progress)
        rows: List[Optional[SweepRow]] = []
        zero_row = None
        for method, ratio, proto, what in plans:
            if isinstance(what, SweepRow):
                rows.append(what)
            elif what is None:
                rows.append(zero_row and dataclasses.replace(zero_row, method=method,
                                                             protocol=proto))
            else:
                seeds, idx, red = what
                ev = [evals[i] for i in idx]
                row = self._row(method, ratio, proto, seeds, [e.metrics for e in ev],
                                [e.recorder.stats() if is_main() else None for e in ev],
                                red, sum(e.seconds for e in ev), False, ev[0].recorder)
                zero_row = row if ratio == 0.0 else zero_row
                rows.append(row)
        return rows

    def _reuse_zero(self, method: str, ratio: float, proto: str,
                    done: Dict[tuple, dict]) -> Optional[SweepRow]:
        """This model's stored ratio-0 row under ``method`` (None: evaluate it); rank 0
        decides for every rank (it may find a row another sweep wrote meanwhile)."""
        if ratio != 0.0:
            return None
        zero = self._zero(done) if is_main() else None
        if zero is not None and (not self.measure_speed or zero.get('img_per_s')) and \
                zero.get('gflops_convention') == self.flops_convention:
            zero = dataclasses.replace(SweepRow.from_dict(zero), method=method, protocol=proto)
        else:
            zero = None
        return broadcast(zero)

    def _plan(self, method: str, ratio: float):
        """(the ratio to evaluate, its seeds, whether the reducer's counts are per image)."""
        M, depth = self.backbone.reduction_domain()
        dynamic = method == LEARNED and self.learned is not None and self.learned.dynamic
        if dynamic:       # per-image counts (LTMP): the ratio is known after the evaluation
            self.learned.reset_observed()
            ratio = 0.5   # a placeholder > 0 for the seed rule; replaced below
        elif method == LEARNED:
            ratio = round(self.learned.token_plan(M, depth)[2], 6)
        seeds = self.seeds if method in SEEDED_METHODS and ratio > 0 else [0]
        return ratio, seeds, dynamic

    def _row(self, method: str, ratio: float, proto: str, seeds: Sequence[int],
             metrics: Sequence[dict], stats: Sequence, red, dt: float,
             dynamic: bool, recorder=None) -> Optional[SweepRow]:
        """The row of one cell from its evaluations (one per seed): library metrics and
        per-image statistics (``recorder``: the one that recorded them, default the test
        loop's); None on ranks other than 0."""
        import numpy as np
        import torch
        if not is_main():
            return None
        recorder = recorder or self.recorder
        library, exact = [], []
        for seed, out, st in zip(seeds, metrics, stats, strict=True):
            m = self._metric(out, st, recorder.kind, f'{self.name} {method} {ratio} seed {seed}')
            library.append(m[0])
            exact.append(m[1])
        keys = _image_keys(self.runner, recorder)
        flops, red, ratio = self._flops(method, ratio, red, dynamic)
        stats_file = self._write_stats(method, ratio, list(stats), keys)
        row = SweepRow(
            model=self.name, config=self.config, checkpoint=self.ckpt, method=method,
            ratio=ratio, precision=self.precision, protocol=proto, reduction=red,
            realised_ratio=round(flops['realised_ratio'], 4), gflops=round(flops['gflops'], 4),
            gflops_convention=self.flops_convention, metric_name=self.metric_key,
            metric=round(float(np.mean(exact)), 4),
            metric_library=round(float(np.mean(library)), 4), final_tokens=flops['tokens'][-1],
            seconds=round(dt, 2), images=len(keys), stats_file=stats_file,
            checkpoint_sha256=self.fingerprint[0], config_sha256=self.fingerprint[1])
        if method_version(method) > 1:
            row.method_version = method_version(method)
        if len(exact) > 1:
            row.seeds, row.metric_seeds = list(seeds), [round(m, 4) for m in exact]
            row.seed_std = round(float(np.std(exact, ddof=1)), 4)
        if method == LEARNED:
            row.fine_tuned = getattr(self.learned, 'fine_tuned', None) or True
        if self.measure_speed:
            bb = self.backbone
            speed = _speed(self.runner, bb, bb.img_size, self.precision,
                           self.learned if method == LEARNED else red)
            row = dataclasses.replace(row, **speed)
        elif torch.cuda.is_available():
            row.img_per_s_test_loop = round(len(keys) * len(seeds) / dt, 1)
        return row

    def _metric(self, out: dict, st, kind: str, what: str):
        """(the library's metric, the metric recomputed from the per-image statistics: the
        numbers the intervals use, checked against the library's rounded value)."""
        from amvim_mm.analysis import stats as S
        if self.metric_key not in out and kind == 'det' and \
                len(st['det_score']) == 0:
            # mmdet reports nothing when no box passes the score threshold; COCO's AP of an
            # empty detection set is 0
            print(f'prune_eval: {what}: no detections, AP 0', file=sys.stderr, flush=True)
            out = {self.metric_key: 0.0}
        if self.metric_key not in out:
            raise LookupConfigError(f'{self.config}: the test metrics {sorted(out)} have no '
                                    f'{self.metric_key!r}')
        return float(out[self.metric_key]), S.check_against(st, float(out[self.metric_key]),
                                                             what)

    def _flops(self, method: str, ratio: float, red, dynamic: bool):
        """(the analytic FLOPs of the cell, the reducer config to store, the row's ratio: a
        dynamic learned reducer's is the realised one)."""
        from amvim_mm.analysis.flops import backbone_flops
        bb = self.backbone
        if method != LEARNED:
            return (backbone_flops(bb, bb.img_size, red, convention=self.flops_convention),
                    red, ratio)
        bb.set_token_reduction(red)
        try:
            flops = backbone_flops(bb, bb.img_size, 'model', convention=self.flops_convention)
        finally:
            bb.set_token_reduction(None)
        if dynamic:
            ratio = round(flops['realised_ratio'], 6)
        return flops, red.config(), ratio

    def _write_stats(self, method: str, ratio: float, per_seed, keys) -> str:
        """Write the per-image statistics (atomically); their path relative to the out-dir."""
        from amvim_mm.analysis import stats as S
        from amvim_mm.engine.fileio import atomic_write_bytes
        stats_file = stats_name(self.name, method, ratio, self.precision)
        os.makedirs(osp.dirname(osp.join(self.out_dir, stats_file)), exist_ok=True)
        atomic_write_bytes(S.dumps(per_seed, keys), osp.join(self.out_dir, stats_file))
        return stats_file

    def _zero(self, done: Dict[tuple, dict]) -> Optional[dict]:
        zero = zero_row(done, self.name, self.precision)
        if zero is None:   # another sweep into this out-dir may have evaluated it meanwhile
            fresh, _ = reusable_rows(self.results, {self.name: self.fingerprint}, self.out_dir)
            zero = zero_row(fresh, self.name, self.precision)
        return zero


def _speed(runner, backbone, size, precision: str, red: Optional[dict]) -> dict:
    """Throughput on the present device with the cell's reducer on, eager, median of 5
    repeats (the whole model on a CPU: of 3), at the batch of the config's test loader: the backbone alone (random images at
    ``size``) and the whole model through the library's test step (``model.test_step`` on the
    loader's first batch: data preprocessor, backbone, neck, head and the library's
    post-processing, as its test loop runs them; ``img_per_s_model``). The report's ceiling
    comes from these two at ratio 0 (:func:`~.report.ceiling_speedup`)."""
    import torch

    from amvim_mm.bench.measure import measure, measure_call
    from amvim_mm.engine.loops import precision_autocast
    if size[0] != size[1]:
        raise ConfigError(f'--measure-speed needs a square img_size, got {size}')
    cuda = next(backbone.parameters()).is_cuda
    model = runner.model
    data = next(iter(runner.test_dataloader))
    batch = len(data['inputs'])
    backbone.set_token_reduction(red)
    was = model.training
    try:
        model.eval()
        r = measure(backbone, batch, size[0], precision, 'eager', warmup=2,
                    iters=10 if cuda else 3, repeats=5)

        def step():
            with torch.no_grad(), precision_autocast(model, precision):
                return model.test_step(data)
        whole = measure_call(step, batch, 'cuda' if cuda else 'cpu', warmup=2 if cuda else 1,
                             iters=5 if cuda else 1, repeats=5 if cuda else 3)
    finally:
        backbone.set_token_reduction(None)
        model.train(was)
    return dict(img_per_s=r['img_per_s'], speed_batch=batch, speed_spread_pct=r['spread_pct'],
                img_per_s_model=whole['img_per_s'], speed_spread_model_pct=whole['spread_pct'],
                speed_mode='eager',
                speed_device=torch.cuda.get_device_name(0) if cuda else 'cpu')
