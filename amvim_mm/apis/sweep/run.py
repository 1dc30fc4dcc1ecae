"""A sweep's course: check the arguments, load and fingerprint the configs, find the cells
without a reusable row, evaluate them (here or in worker processes), merging every row into
``results.json``, then the final pass (drops, intervals, verdicts).
"""
from __future__ import annotations

import os.path as osp
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from amvim_mm.apis import dist
from amvim_mm.apis.sweep.cell import PRIMARY_METRICS, ModelCells, fine_tuning_label
from amvim_mm.apis.sweep.methods import (LEARNED, SEEDED_METHODS, check_method, check_ratio,
                                         config_has_learned_reducer, learned_reducer,
                                         method_version)
from amvim_mm.apis.sweep.one_pass import pass_fits
from amvim_mm.apis.sweep.rows import Fingerprint, row_key
from amvim_mm.apis.sweep.store import (config_sha256, file_sha256, load_results,
                                       merge_results, older_rule_rows, prepare_out_dir,
                                       protocol, results_lock, reusable_rows,
                                       stored_fingerprints)
from amvim_mm.apis.sweep.workers import sweep_in_workers
from amvim_mm.errors import ConfigError
from amvim_mm.utils.warning_log import warnings_to_file

PRECISIONS = ('fp32', 'bf16', 'fp16')
#: the libraries' warnings of a sweep, in its out-dir
WARNINGS_LOG = 'prune_eval_warnings.log'
#: what results.json's intervals and verdicts rest on (``meta.statistics``)
STATISTICS = dict(
    rows='percentile bootstrap over the validation images (one draw per data set, shared by '
         'every row: paired); random pruning: the mean over pruning seeds per image, its masks '
         'drawn per image',
    architectures='mean over the training seeds (the checkpoints of a group, at least 2); '
                  'interval t(k - 1) * sqrt(seed variance / k + the image covariance the '
                  'seeds share); one checkpoint: over the images only (checkpoint level)',
    differences='architecture A minus B, paired over images, the image term counted once; '
                'Welch df of the seed terms; no verdict with one trained model on a side; '
                'one Holm family for the AUCs and all cells, each interval at the level of its '
                'verdict; TOST equivalence within the margin; detectable at alpha / family '
                'size (noncentral t)',
    auc='robustness AUC: the mean drop over the kept-token range (trapezoids from no '
        'reduction to the largest ratio; tied kept fractions merged), per method; two '
        'architectures compared over the range both cover',
    docs='docs/statistics.md')
#: a cell: (model index, method, ratio; -1 for the learned reducer's own ratio)
Cell = Tuple[int, str, float]


def model_name(config: str) -> str:
    """A short display name from a config file name (``amvim-t_pyramid_...`` -> ``amvim-t``)."""
    return osp.splitext(osp.basename(config))[0].split('_')[0]


def validate(models: Sequence[Tuple[str, str]], methods: Sequence[str],
             ratios: Sequence[float], names: Optional[Sequence[str]] = None,
             precision: str = 'fp32', seeds: Sequence[int] = (0, )) -> List[str]:
    """Check the sweep's arguments; returns the display names (``names`` or from the configs)."""
    if not models:
        raise ConfigError('give at least one CONFIG CHECKPOINT pair')
    for cfg, ckpt in models:
        if not osp.isfile(cfg):
            raise FileNotFoundError(f'config file not found: {cfg}')
        if not osp.isfile(ckpt):
            raise FileNotFoundError(f'checkpoint not found: {ckpt}')
    for m in methods:
        check_method(m)
    for r in ratios:
        check_ratio(r)
    if precision not in PRECISIONS:
        raise ConfigError(f'unknown precision {precision!r}; choose from {", ".join(PRECISIONS)}')
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f'seeds must be distinct and at least one, got {list(seeds)}')
    names = list(names) if names else [model_name(c) for c, _ in models]
    if len(names) != len(models):
        raise ConfigError(f'{len(names)} names for {len(models)} models')
    if len(set(names)) != len(names):
        raise ConfigError(f'two models share the name {names}; give distinct --names')
    return names


#: the fewest bootstrap replicates of a 95 % percentile interval: one replicate per 2.5 % tail
MIN_REPLICATES = 40


def _check_options(names: Sequence[str], margin, jobs: int, measure_speed: bool,
                   groups: Optional[Sequence[str]], flops_convention: str,
                   launcher: str = 'none', replicates: int = 1000) -> None:
    from amvim_mm.analysis.flops import CONVENTIONS
    if not (isinstance(replicates, int) and replicates >= MIN_REPLICATES):
        raise ConfigError(f'--replicates must be at least {MIN_REPLICATES} (a 95 % interval '
                          f'needs a replicate in each 2.5 % tail), got {replicates!r}')
    if launcher != 'none' and jobs > 1:
        raise ConfigError('--jobs runs worker processes on one machine; with --launcher the '
                          'processes are the launcher\'s: drop --jobs')
    if launcher != 'none' and measure_speed:
        raise ConfigError('--measure-speed times every cell on one device: run it without '
                          '--launcher')
    if margin is not None and not (isinstance(margin, (int, float)) and 0 < margin < float('inf')):
        raise ConfigError(f'--margin must be a finite number > 0, got {margin!r}')
    if jobs > 1 and measure_speed:
        raise ConfigError('--measure-speed times every cell on this machine: run it with '
                          '--jobs 1 (workers running side by side would slow each other down)')
    if groups is not None and len(groups) != len(names):
        raise ConfigError(f'{len(groups)} groups for {len(names)} models')
    if flops_convention not in CONVENTIONS:
        raise ConfigError(f'unknown FLOPs convention {flops_convention!r}; choose from '
                          f'{", ".join(CONVENTIONS)}')


def run_sweep(models: Sequence[Tuple[str, str]], methods: Sequence[str],
              ratios: Sequence[float], out_dir: str, names: Optional[Sequence[str]] = None,
              cfg_options: Optional[dict] = None, verbose: bool = False,
              progress: bool = True, precision: str = 'fp32', seeds: Sequence[int] = (0, ),
              locations: Optional[Sequence[int]] = None, flops_convention: str = 'mamba',
              measure_speed: bool = False, replicates: int = 1000,
              groups: Optional[Sequence[str]] = None, jobs: int = 1,
              final: bool = True, margin: Optional[float] = None, launcher: str = 'none',
              one_pass: bool = True) -> Dict[str, object]:
    """Run (or resume) a sweep; returns the merged results also written to ``results.json``.

    Rows of ``results.json`` are reused only when their model name, method, ratio, precision,
    protocol, checkpoint sha256 and config sha256 all match (see :mod:`amvim_mm.apis.sweep`);
    each finished cell is merged into the file under a lock, so other sweeps into the same
    ``out_dir`` keep their rows. ``precision`` runs every test step under autocast
    (:class:`~amvim_mm.engine.loops.AmpTestLoop`). ``groups`` (one name per model, e.g. the
    architecture of checkpoints trained with several seeds) adds ``group_results`` and
    ``group_paired_differences`` (:func:`~amvim_mm.apis.sweep.intervals.add_intervals`).

    ``jobs`` > 1 evaluates the models in that many worker processes at once (one model at a
    time per worker, each with ``torch.get_num_threads() // jobs`` threads; see
    :func:`~amvim_mm.apis.sweep.workers.sweep_in_workers`); the rows are the same as one
    process's, and this process then runs the final pass. ``final=False`` (a worker's call)
    skips the final pass: no intervals, no stale-row message.

    ``launcher`` (``'pytorch'``, ``'slurm'``, ``'mpi'``; the process group started by
    :func:`amvim_mm.apis.dist.init_launcher`): every test loop is sharded across the ranks and
    gathered on rank 0 (mmengine's samplers and ``collect_results``), which alone writes rows,
    per-image files and the final pass; the files equal a single process's (apart from
    timings). ``one_pass`` (default): a model's pending cells are evaluated in one pass over
    the data (:mod:`~amvim_mm.apis.sweep.one_pass`), the same rows as cell by cell (False),
    which is kept for comparison and for evaluators too large to hold many at once.

    The libraries' warnings go to ``out_dir/prune_eval_warnings.log`` (:data:`WARNINGS_LOG`),
    not into the progress bar; ``verbose`` keeps them on the screen with the runners' logs.
    """
    names = validate(models, methods, ratios, names, precision, seeds)
    _check_options(names, margin, jobs, measure_speed, groups, flops_convention, launcher,
                   replicates)
    dist.init_launcher(launcher)
    sweep = _Sweep(models=list(models), methods=list(methods),
                   ratios=sorted(set(float(r) for r in ratios)), out_dir=out_dir, names=names,
                   cfg_options=cfg_options, verbose=verbose, progress=progress,
                   precision=precision, seeds=seeds, locations=locations,
                   flops_convention=flops_convention, measure_speed=measure_speed,
                   replicates=replicates, groups=groups, jobs=jobs, final=final, margin=margin,
                   one_pass=one_pass)
    with warnings_to_file(osp.join(out_dir, WARNINGS_LOG), enabled=not verbose):
        return sweep.run()


def _loader_defaults(cfg) -> None:
    """On a GPU: pinned memory for the test data, and loader workers where the config has
    none (the host's cores shared by the processes of this node); a distributed run gathers
    its metrics' results over the GPUs (no shared temporary folder needed across nodes)."""
    import os

    import torch
    if not torch.cuda.is_available():
        return
    loader = cfg.get('test_dataloader')
    if isinstance(loader, dict):
        loader.setdefault('pin_memory', True)
        if not loader.get('num_workers'):
            local = dist.local_world_size()
            loader['num_workers'] = max(1, min(8, (os.cpu_count() or 1) // max(local, 1)))
            loader.setdefault('persistent_workers', True)
    if dist.world_size() > 1:
        metrics = cfg.get('test_evaluator')
        for m in metrics if isinstance(metrics, list) else [metrics]:
            if isinstance(m, dict):
                m.setdefault('collect_device', 'gpu')


def _fused_label_maps(model) -> None:
    """On a GPU a segmentor's labels come from the fused label-map kernel (the same labels
    without the resized logits, which the sweep's metric does not read:
    :mod:`amvim_mm.ops.label_map`); a segmentor with a post-processing of its own keeps it."""
    import torch

    from amvim_mm.models.segmentors import use_label_map
    if torch.cuda.is_available():
        try:   # no class chunks: on a GPU they save memory but cost time (fp32 takes the kernel)
            use_label_map(model, chunk=1 << 30)
        except ConfigError:
            pass


def _worker_sweep(task: dict) -> None:
    """One model's cells in a worker process (``run_sweep`` with ``final=False``)."""
    run_sweep(**task)


@dataclass
class _Sweep:
    """One call of :func:`run_sweep` (its arguments checked; ``ratios`` sorted, distinct)."""

    models: List[Tuple[str, str]]
    methods: List[str]
    ratios: List[float]
    out_dir: str
    names: List[str]
    cfg_options: Optional[dict]
    verbose: bool
    progress: bool
    precision: str
    seeds: Sequence[int]
    locations: Optional[Sequence[int]]
    flops_convention: str
    measure_speed: bool
    replicates: int
    groups: Optional[Sequence[str]]
    jobs: int
    final: bool
    margin: Optional[float]
    one_pass: bool = True

    def run(self) -> Dict[str, object]:
        from tqdm import tqdm
        self.path = osp.join(prepare_out_dir(self.out_dir), 'results.json')
        self.cfgs, self.prints = self._load_configs()
        self.learned_models = {n for n, c in zip(self.names, self.cfgs)
                               if config_has_learned_reducer(c)}
        if LEARNED in self.methods and not self.learned_models:
            raise ConfigError('method learned needs a model whose config carries a learned '
                              'reducer (e.g. a *_dynamicvit.py fine-tuning config); none of '
                              'the configs has')
        from amvim_mm.apis.runner import check_data_roots
        for (config, _), cfg in zip(self.models, self.cfgs, strict=True):
            check_data_roots(cfg, ('test_dataloader', ), config)
        main = dist.is_main()
        # rank 0 reads what is done (another sweep may write meanwhile) and tells the others
        self.done, stale = dist.broadcast(
            reusable_rows(self.path, self.prints, self.out_dir) if main else None)
        # what this sweep may replace as stale: the rows of other fingerprints stored now
        # (rank 0 alone merges)
        self.replaceable = stored_fingerprints(self.path, self.names) if main else None
        for (name, method), n in (older_rule_rows(self.path, self.prints).items()
                                  if main else ()):
            print(f'prune_eval: {n} {method} row(s) of {name!r} in {self.path} were computed '
                  f'with an older rule of {method} (version < {method_version(method)}, see '
                  'CHANGELOG.md): recomputing and replacing them', file=sys.stderr, flush=True)
        for name, n in (stale.items() if self.final and main else ()):
            print(f'prune_eval: {n} row(s) of {name!r} in {self.path} come from another '
                  'checkpoint or config (sha256 differs): stale, recomputing and replacing '
                  'them', file=sys.stderr, flush=True)
        self.meta = self._meta()
        self.cells = self._cells()
        bar = tqdm(total=len(self.cells), desc='prune_eval', unit='cell',
                   disable=not (self.progress and main))
        todo = {i: self._pending(i) for i in range(len(self.models))}
        bar.update(len(self.cells) - sum(map(len, todo.values())))
        if self.jobs > 1 and sum(1 for v in todo.values() if v) > 1:
            todo = self._in_workers(todo, bar)
        for i in range(len(self.models)):
            if todo[i]:
                self._evaluate_model(i, todo[i], bar)
        bar.close()
        if not self.final:
            with results_lock(self.path):
                return load_results(self.path)
        # the final pass (drops, intervals, meta; stale rows of these models) merges under
        # the lock, on rank 0; the others read its result
        data = merge_results(self.path, [], self.meta, current=self.prints,
                             replaceable=self.replaceable,
                             out_dir=self.out_dir, replicates=self.replicates) if main else None
        return dist.broadcast(data)

    def _load_configs(self) -> Tuple[list, Dict[str, Fingerprint]]:
        """The loaded configs, ready for the sweep's runners, and each model's fingerprint."""
        from amvim_mm.apis.runner import drop_token_reduction_hooks, identify_images, load_config
        cfgs, prints = [], {}
        for (config, ckpt), name in zip(self.models, self.names):
            cfg = load_config(config, self.cfg_options,
                              work_dir=osp.join(self.out_dir, 'work', name))
            prints[name] = (file_sha256(ckpt), config_sha256(cfg))
            # the sweep loads CHECKPOINT itself; a config's own load_from (e.g. a fine-tuning
            # config's start) would be loaded over it by runner.test()
            cfg.load_from, cfg.resume = None, False
            # every cell sets its own reducer; a config's TokenReductionHook would replace it
            if drop_token_reduction_hooks(cfg) and self.final:
                print(f'prune_eval: {config}: its TokenReductionHook is not used (each cell '
                      'sets its own token reduction)', file=sys.stderr, flush=True)
            identify_images(cfg)     # random pruning draws per image, whatever the batch size
            # after the hash: rows of several precisions share one fingerprint
            cfg.test_cfg = dict(type='AmpTestLoop', precision=self.precision)
            _loader_defaults(cfg)
            cfgs.append(cfg)
        return cfgs, prints

    def _meta(self) -> dict:
        import torch

        from amvim_mm.analysis.flops import CONVENTIONS
        return dict(
            convention=CONVENTIONS[self.flops_convention],
            flops_convention=self.flops_convention,
            protocol='training-free; ToMe/random: AMVim protocol (r tokens removed at the '
            'start of the even blocks); EViT/ToP: keep rate after locations',
            device='cuda' if torch.cuda.is_available() else 'cpu', torch=torch.__version__,
            bootstrap=dict(replicates=self.replicates, level=0.95, seed=0, over='images'),
            statistics=STATISTICS, margin=self.margin, models=list(self.names),
            groups=dict(zip(self.names, self.groups)) if self.groups is not None else None)

    def _cells(self) -> List[Cell]:
        cells = [(i, m, r) for i in range(len(self.models)) for m in self.methods
                 if m != LEARNED for r in self.ratios]
        if LEARNED in self.methods:   # one cell per model with a learned reducer, at its ratio
            cells += [(i, LEARNED, -1.0) for i in range(len(self.models))
                      if self.names[i] in self.learned_models]
        return cells

    def _pending(self, i: int) -> List[Tuple[str, float, str]]:
        """Model ``i``'s cells without a reusable row: (method, ratio, protocol)."""
        name, mine = self.names[i], []
        for _, method, ratio in [c for c in self.cells if c[0] == i]:
            proto = protocol(method, self.seeds, self.locations, self.flops_convention,
                             self.measure_speed)
            if method == LEARNED:
                row = next((r for k, r in self.done.items() if k[0] == name
                            and k[1] == LEARNED and k[3] == self.precision), None)
            else:
                row = self.done.get((name, method, round(ratio, 6), self.precision))
            if row is None or row.get('protocol') != proto:
                mine.append((method, ratio, proto))
        return mine

    def _in_workers(self, todo: Dict[int, list], bar) -> Dict[int, list]:
        """Evaluate the models with pending cells in worker processes; what is left then."""
        kwargs = dict(cfg_options=self.cfg_options, verbose=self.verbose, progress=False,
                      precision=self.precision, seeds=self.seeds, locations=self.locations,
                      flops_convention=self.flops_convention, measure_speed=self.measure_speed,
                      replicates=self.replicates, final=False, margin=self.margin,
                      one_pass=self.one_pass)
        tasks = [dict(kwargs, models=[self.models[i]], names=[self.names[i]],
                      ratios=self.ratios, out_dir=self.out_dir,
                      methods=[m for m in self.methods
                               if m != LEARNED or self.names[i] in self.learned_models])
                 for i, v in todo.items() if v]
        try:
            sweep_in_workers(_worker_sweep, tasks, self.jobs, bar, self.path, self.prints)
        except BaseException:
            bar.close()       # the error line comes after the bar, not inside it
            raise
        self.done, _ = reusable_rows(self.path, self.prints, self.out_dir)
        todo = {i: self._pending(i) for i in range(len(self.models))}
        bar.n = len(self.cells) - sum(map(len, todo.values()))
        bar.refresh()
        return todo

    def _evaluate_model(self, i: int, mine: Sequence[Tuple[str, float, str]], bar) -> None:
        """Model ``i``'s pending cells in this process (one pass over the data for all but the
        learned reducer's, or cell by cell), rows merged into ``results.json`` on rank 0 (a
        pass's rows together when it ends; a cell's when it is done)."""
        (config, ckpt), name, cfg = self.models[i], self.names[i], self.cfgs[i]
        cells = self._model_cells(config, ckpt, name, cfg)
        if dist.world_size() > 1 and cells.learned is not None and cells.learned.dynamic and \
                any(c[0] == LEARNED for c in mine):
            raise ConfigError(f'{name}: a learned reducer with per-image token counts (LTMP) '
                              'averages its counts in one process: run it without --launcher')
        passed = [c for c in mine if c[0] != LEARNED] if self.one_pass else []
        if passed:
            evals = any(r == 0 for _, r, _ in passed) + sum(
                len(self.seeds) if m in SEEDED_METHODS else 1 for m, r, _ in passed if r > 0)
            fits, why = pass_fits(cells.runner, evals)
            if not fits:
                if dist.is_main():
                    print(f'prune_eval: {name}: {why}; evaluating cell by cell',
                          file=sys.stderr, flush=True)
                passed = []
        if passed:
            bar.set_postfix_str(f'{name}: one pass, {len(passed)} cells')

            def progress(frac: float) -> None:
                bar.set_postfix_str(f'{name}: one pass, {len(passed)} cells, {frac:.0%}')
            self._record(cells.evaluate_pass(passed, self.done, progress), bar)
        for method, ratio, proto in [c for c in mine if c not in passed]:
            bar.set_postfix_str(f'{name} {method} {ratio}')
            self._record([cells.evaluate(method, ratio, proto, self.done)], bar)

    def _record(self, rows: Sequence[Optional[object]], bar) -> None:
        """Merge finished rows (rank 0's) into ``results.json`` and every rank's ``done``."""
        rows = [r.to_dict() for r in rows if r is not None] if dist.is_main() else None
        if rows:
            merge_results(self.path, rows, self.meta, replaceable=self.replaceable)
        rows = dist.broadcast(rows)
        for row in rows:
            self.done[row_key(row)] = row
        bar.update(len(rows))

    def _model_cells(self, config: str, ckpt: str, name: str, cfg) -> ModelCells:
        """A runner for the model with its checkpoint loaded, as a :class:`ModelCells`."""
        from amvim_mm.analysis import stats as S
        from amvim_mm.apis.runner import load_model_weights, make_runner
        from amvim_mm.engine.hooks import find_reducible_backbone
        if not self.verbose:
            cfg.log_level = 'ERROR'
            cfg.default_hooks.logger = dict(type='LoggerHook', interval=10**9)
        runner = make_runner(cfg)
        ckpt_meta = load_model_weights(runner.model, ckpt, strict=True)
        if cfg.default_scope == 'mmseg':
            _fused_label_maps(runner.model)
        recorders = [S.MetricRecorder(m) for m in runner.test_loop.evaluator.metrics
                     if type(m).__name__ in S.KINDS]
        if len(recorders) != 1:
            raise ConfigError(f'{config}: expected one test metric of {", ".join(S.KINDS)}, '
                              f'found {len(recorders)}')
        backbone = find_reducible_backbone(runner.model)
        learned = learned_reducer(backbone)
        if learned is not None:
            learned.fine_tuned = fine_tuning_label(ckpt_meta)
        return ModelCells(
            runner=runner, backbone=backbone, learned=learned, recorder=recorders[0],
            config=config, ckpt=ckpt, name=name, precision=self.precision,
            metric_key=PRIMARY_METRICS[cfg.default_scope], seeds=list(self.seeds),
            locations=self.locations, flops_convention=self.flops_convention,
            measure_speed=self.measure_speed, out_dir=self.out_dir, results=self.path,
            fingerprint=self.prints[name])
