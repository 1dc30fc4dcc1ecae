"""Training-free token-reduction sweeps: metric vs reduction ratio for several models.

For every model (config + checkpoint) and every method and ratio, the backbone's reducer is
switched on (AMVim protocol), the config's test loop runs through the library's own metric
(mIoU / COCO AP / Top-1), and the result is stored with the analytic GFLOPs and the realised
ratio. Every finished run is *merged* into ``results.json``: under an exclusive ``flock`` on
``results.json.lock`` next to it the file is read again, this run's rows are added (replacing
rows with the same model, method and ratio) and the file is replaced atomically. So an
interrupted sweep keeps what it finished, a second call resumes where it stopped, and sweeps
running at the same time into one out-dir (e.g. one per method) keep each other's rows.

Resuming keys on the model name, method and ratio *and* on what produced the row. Each row stores

* ``checkpoint_sha256``: sha256 of the checkpoint file's bytes (read in 1 MiB chunks);
* ``config_sha256``: sha256 of ``pretty_text`` of the config as loaded, i.e. with its
  ``_base_`` files merged and ``--cfg-options`` applied, but without the run-specific
  ``work_dir`` and ``launcher`` (another out-dir does not invalidate rows; an edited base file
  or another override does).

Rows of a model name whose hashes differ from this run's are stale: they are recomputed and
replaced (one line on stderr says so), never reused. ``results.json`` thus holds rows of one
checkpoint and config per model name, and the ratio-0 baseline of the ``drop`` column is always
a row with the same hashes. Ratio 0 (no reduction) is evaluated once per model and precision
and reused for every method.

Methods and their schedules (:mod:`amvim_mm.apis.reduction_methods`, shared with ``tools/test.py
--reduce``, which thus measures what a cell does): ``tome`` and ``random`` use the AMVim
protocol (``ratio``); ``evit`` and ``top`` prune after blocks (``locations``, default ToP-ViM's
Tiny schedule scaled to the depth, :meth:`ReductionSchedule.importance_locations`) at the keep
rate whose realised ratio is nearest to the requested one
(:meth:`ReductionSchedule.keep_rate_for_ratio`); the keep rate and the realised ratio are stored
with the row. ``random`` is evaluated for every ``seeds``
entry: the row's metric is their mean, with ``metric_seeds`` and ``seed_std``.

``learned`` evaluates the learned reducer the model's own config carries (e.g. a
``*_dynamicvit.py`` fine-tuning config and its checkpoint): one row per model at the reducer's
realised ratio (the ``ratios`` do not apply), labelled with the reducer and how long it was
fine-tuned (``fine_tuned``: ``'fine-tuned N epochs'`` / ``'... N iterations'`` from the
checkpoint's ``meta``); the other methods run on the same fine-tuned weights with the
learned reducer switched off.

Intervals: every evaluation also keeps per-image statistics (``per_image/*.npz``, see
:mod:`amvim_mm.analysis.stats`); after the sweep a paired bootstrap over images (one set of
resampled images per data set, shared by every row) gives each row ``ci_low``/``ci_high`` (95 %),
the drop from ratio 0 with ``drop_ci_low``/``drop_ci_high``, and for every pair of models the
difference of their drops at each method and ratio with its interval
(``paired_differences``). A row whose protocol (seeds, locations, FLOPs convention, speed
measurement) differs from the requested one is recomputed.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import os.path as osp
import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

# the method table and its mapping to reducers are shared with tools/test.py; the names stay
# importable from here
from amvim_mm.apis.reduction_methods import (IMPORTANCE_METHODS, LEARNED, METHODS,  # noqa: F401
                                             SEEDED_METHODS, cell_reducer, check_method,
                                             check_ratio, config_has_learned_reducer,
                                             learned_reducer, reduction_config)
from amvim_mm.errors import CheckpointError, ConfigError, LookupConfigError

PRECISIONS = ('fp32', 'bf16', 'fp16')
PRIMARY_METRICS = {'mmseg': 'mIoU', 'mmdet': 'coco/bbox_mAP', 'mmpretrain': 'accuracy/top1'}
#: what results.json's intervals and verdicts rest on (``meta.statistics``)
STATISTICS = dict(
    rows='percentile bootstrap over the validation images (one draw per data set, shared by '
         'every row: paired); random pruning: the mean over pruning seeds per image, its masks '
         'drawn per image',
    architectures='mean over the training seeds (the checkpoints of a group); interval '
                  't(df) * sqrt(seed variance / k + image bootstrap variance), df = k - 1; '
                  'one checkpoint: over the images only',
    differences='architecture A minus B, paired over images; Welch-Satterthwaite df; '
                'verdicts with Holm adjustment over the family shown (all cells; the AUCs '
                'separately) and TOST equivalence within the margin',
    auc='robustness AUC: the mean drop over the kept-token range (trapezoids from no '
        'reduction to the largest ratio), per method',
    docs='docs/statistics.md')


def model_name(config: str) -> str:
    """A short display name from a config file name (``amvim-t_pyramid_...`` -> ``amvim-t``)."""
    return osp.splitext(osp.basename(config))[0].split('_')[0]


def _write_json(path: str, data) -> None:
    from amvim_mm.engine.fileio import atomic_write_bytes
    atomic_write_bytes(json.dumps(data, indent=2).encode(), path)


def load_results(path: str) -> Dict[str, object]:
    if osp.exists(path) and not osp.isfile(path):
        raise ConfigError(f'{path} is not a file; move it away or pick another --out-dir')
    if not osp.isfile(path):
        return dict(results=[])
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f'{path} is not valid JSON ({e}); move it away or pick another '
                              '--out-dir') from None
    if not isinstance(data, dict) or 'results' not in data:
        raise ConfigError(f'{path} is not a results file of prune_eval (no "results" list); '
                          'move it away or pick another --out-dir')
    return data


def _key(r: dict) -> Tuple[str, str, float, str]:
    return (r['model'], r['method'], round(float(r['ratio']), 6), r.get('precision', 'fp32'))


Fingerprint = Tuple[Optional[str], Optional[str]]


def _fingerprint(r: dict) -> Fingerprint:
    """What produced a row: (checkpoint sha256, config sha256); (None, None) for old rows."""
    return (r.get('checkpoint_sha256'), r.get('config_sha256'))


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks (checkpoints can be large)."""
    h = hashlib.sha256()
    try:
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(chunk), b''):
                h.update(block)
    except OSError as e:
        raise CheckpointError(f'cannot read checkpoint {path}: {e.strerror or e}') from None
    return h.hexdigest()


def config_sha256(cfg) -> str:
    """sha256 of ``pretty_text`` of a loaded config (``_base_`` merged, ``--cfg-options``
    applied) without the run-specific ``work_dir`` and ``launcher``."""
    from mmengine.config import Config
    d = cfg.to_dict()
    for k in ('work_dir', 'launcher'):
        d.pop(k, None)
    return hashlib.sha256(Config(d).pretty_text.encode()).hexdigest()


def prepare_out_dir(out_dir: str) -> str:
    """Create ``out_dir`` (a :class:`ConfigError` if it is a file or cannot be created)."""
    if osp.exists(out_dir) and not osp.isdir(out_dir):
        raise ConfigError(f'--out-dir {out_dir} exists and is not a directory')
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f'cannot create --out-dir {out_dir}: {e.strerror or e}') from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f'--out-dir {out_dir} is not writable')
    return out_dir


@contextlib.contextmanager
def results_lock(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<path>.lock`` (created if missing) for the block."""
    lock = path + '.lock'
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ConfigError(f'cannot create the lock file {lock}: {e.strerror or e}') from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)    # closing the descriptor releases the lock


def _zero_of(rows: Sequence[dict], r: dict) -> Optional[dict]:
    """The ratio-0 row for ``r``: same model and precision (same method if there is one) and
    the same checkpoint and config hashes; else None."""
    zeros = [z for z in rows if round(float(z['ratio']), 6) == 0.0 and z['model'] == r['model']
             and z.get('precision', 'fp32') == r.get('precision', 'fp32')
             and _fingerprint(z) == _fingerprint(r)]
    same = [z for z in zeros if z['method'] == r['method']]
    return (same or sorted(zeros, key=lambda z: z['method']) or [None])[0]


def _set_drops(rows: List[dict]) -> None:
    """``drop`` = metric - metric of the ratio-0 row (:func:`_zero_of`); else None."""
    for r in rows:
        base = _zero_of(rows, r)
        r['drop'] = round(r['metric'] - base['metric'], 4) if base is not None else None


def merge_results(path: str, rows: Sequence[dict], meta: Optional[dict] = None,
                  current: Optional[Dict[str, Fingerprint]] = None,
                  out_dir: Optional[str] = None, replicates: int = 1000) -> Dict[str, object]:
    """Merge ``rows`` into the results file ``path`` under :func:`results_lock`.

    The file is read again under the lock; a row replaces the one with the same model, method
    and ratio; rows of a model whose fingerprint (checkpoint and config hashes) differs from
    the new rows' (or from ``current[model]``) are stale and removed. ``drop`` is recomputed
    for all rows and the file replaced atomically. Returns the merged results.
    """
    current = dict(current or {})
    for r in rows:
        current[r['model']] = _fingerprint(r)
    with results_lock(path):
        data = load_results(path)
        merged = {_key(r): r for r in data['results']
                  if r['model'] not in current or _fingerprint(r) == current[r['model']]}
        merged.update((_key(r), dict(r)) for r in rows)
        data['results'] = sorted(merged.values(),
                                 key=lambda r: (r['model'], r['method'], float(r['ratio'])))
        _set_drops(data['results'])
        if meta is not None:
            data['meta'] = meta
        if out_dir is not None:     # the final pass: bootstrap intervals
            add_intervals(data, out_dir, replicates)
        _write_json(path, data)
    return data


def _reusable(rows: Sequence[dict], prints: Dict[str, Fingerprint],
              out_dir: Optional[str] = None) -> Tuple[Dict[tuple, dict], Dict[str, int]]:
    """Split the stored rows of this sweep's models into reusable ones (same fingerprint and,
    with ``out_dir``, their per-image statistics present there), by key, and a count of stale
    ones per model name."""
    done, stale = {}, {}
    for r in rows:
        name = r['model']
        if name not in prints:
            continue
        if _fingerprint(r) == prints[name]:
            if out_dir is None or (r.get('stats_file') and
                                   osp.isfile(osp.join(out_dir, r['stats_file']))):
                done[_key(r)] = r
        else:
            stale[name] = stale.get(name, 0) + 1
    return done, stale


def _zero_row(done: Dict[tuple, dict], name: str, precision: str) -> Optional[dict]:
    return next((r for k, r in sorted(done.items())
                 if k[0] == name and k[2] == 0.0 and k[3] == precision), None)


def protocol(method: str, seeds: Sequence[int], locations: Optional[Sequence[int]],
             convention: str, measure_speed: bool) -> str:
    """What besides model, method, ratio and precision defines a row (reuse needs equality)."""
    # metric=exact: the point value recomputed from the per-image statistics (earlier rows
    # held the library's rounded value); masks=per-image: random choices drawn per image
    parts = [f'flops={convention}', 'metric=exact']
    if method in SEEDED_METHODS:
        parts.append('seeds=' + ','.join(str(s) for s in seeds) + ';masks=per-image')
    if method in IMPORTANCE_METHODS:
        parts.append('locations=' + (','.join(str(x) for x in locations) if locations
                                     else 'default'))
    if measure_speed:
        parts.append('speed')
    return ';'.join(parts)


def fine_tuning_label(meta: dict) -> str:
    """``'fine-tuned N epochs'`` / ``'fine-tuned N iterations'`` from a checkpoint's ``meta``
    (mmengine's ``epoch`` / ``iter``; an exported student keeps them), else ``'fine-tuned'``."""
    epoch, it = meta.get('epoch'), meta.get('iter')
    if isinstance(epoch, int) and epoch > 0:
        return f'fine-tuned {epoch} epoch' + ('s' if epoch > 1 else '')
    if isinstance(it, int) and it > 0:
        return f'fine-tuned {it} iterations'
    return 'fine-tuned'


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


def _stats_name(name: str, method: str, ratio: float, precision: str) -> str:
    tag = 'none_0' if ratio == 0 else f'{method}_{ratio:g}'
    return osp.join('per_image', name, f'{tag}_{precision}.npz')


def run_sweep(models: Sequence[Tuple[str, str]], methods: Sequence[str],
              ratios: Sequence[float], out_dir: str, names: Optional[Sequence[str]] = None,
              cfg_options: Optional[dict] = None, verbose: bool = False,
              progress: bool = True, precision: str = 'fp32', seeds: Sequence[int] = (0, ),
              locations: Optional[Sequence[int]] = None, flops_convention: str = 'mamba',
              measure_speed: bool = False, replicates: int = 1000,
              groups: Optional[Sequence[str]] = None, jobs: int = 1,
              final: bool = True, margin: Optional[float] = None) -> Dict[str, object]:
    """Run (or resume) a sweep; returns the merged results also written to ``results.json``.

    Rows of ``results.json`` are reused only when their model name, method, ratio, precision,
    protocol, checkpoint sha256 and config sha256 all match (see the module docstring); each
    finished cell is merged into the file under a lock, so other sweeps into the same
    ``out_dir`` keep their rows. ``precision`` runs every test step under autocast
    (:class:`~amvim_mm.engine.loops.AmpTestLoop`). ``groups`` (one name per model, e.g. the
    architecture of checkpoints trained with several seeds) adds ``group_results`` and
    ``group_paired_differences`` (:func:`_group_intervals`).

    ``jobs`` > 1 evaluates the models in that many worker processes at once (one model at a
    time per worker, each with ``torch.get_num_threads() // jobs`` threads; see
    :func:`_sweep_in_workers`); the rows are the same as one process's, and this process then
    runs the final pass. ``final=False`` (a worker's call) skips the final pass: no intervals,
    no stale-row message.
    """
    import torch
    from tqdm import tqdm

    from amvim_mm.analysis import stats as S
    from amvim_mm.analysis.flops import CONVENTIONS
    from amvim_mm.apis.runner import (drop_token_reduction_hooks, identify_images, load_config,
                                      load_model_weights, make_runner)
    from amvim_mm.engine.hooks import find_reducible_backbone
    names = validate(models, methods, ratios, names, precision, seeds)
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
    path = osp.join(prepare_out_dir(out_dir), 'results.json')
    cfgs, prints = [], {}
    for (config, ckpt), name in zip(models, names):
        cfg = load_config(config, cfg_options, work_dir=osp.join(out_dir, 'work', name))
        prints[name] = (file_sha256(ckpt), config_sha256(cfg))
        # the sweep loads CHECKPOINT itself; a config's own load_from (e.g. a fine-tuning
        # config's start) would be loaded over it by runner.test()
        cfg.load_from, cfg.resume = None, False
        # every cell sets its own reducer; a config's TokenReductionHook would replace it
        if drop_token_reduction_hooks(cfg) and final:
            print(f'prune_eval: {config}: its TokenReductionHook is not used (each cell sets '
                  'its own token reduction)', file=sys.stderr, flush=True)
        identify_images(cfg)     # random pruning draws per image, whatever the batch size
        # after the hash: rows of several precisions share one fingerprint
        cfg.test_cfg = dict(type='AmpTestLoop', precision=precision)
        cfgs.append(cfg)
    learned_models = {n for n, c in zip(names, cfgs) if config_has_learned_reducer(c)}
    if LEARNED in methods and not learned_models:
        raise ConfigError('method learned needs a model whose config carries a learned reducer '
                          '(e.g. a *_dynamicvit.py fine-tuning config); none of the configs has')
    with results_lock(path):
        stored = load_results(path)['results']
    done, stale = _reusable(stored, prints, out_dir)
    for name, n in (stale.items() if final else ()):
        print(f'prune_eval: {n} row(s) of {name!r} in {path} come from another checkpoint or '
              'config (sha256 differs): stale, recomputing and replacing them',
              file=sys.stderr, flush=True)
    ratios = sorted(set(float(r) for r in ratios))
    meta = dict(convention=CONVENTIONS[flops_convention], flops_convention=flops_convention,
                protocol='training-free; ToMe/random: AMVim protocol (r tokens removed at the '
                'start of the even blocks); EViT/ToP: keep rate after locations',
                device='cuda' if torch.cuda.is_available() else 'cpu', torch=torch.__version__,
                bootstrap=dict(replicates=replicates, level=0.95, seed=0, over='images'),
                statistics=STATISTICS, margin=margin,
                models=list(names),
                groups=dict(zip(names, groups)) if groups is not None else None)
    cells = [(i, m, r) for i in range(len(models)) for m in methods if m != LEARNED
             for r in ratios]
    if LEARNED in methods:   # one cell per model with a learned reducer, at its own ratio
        cells += [(i, LEARNED, -1.0) for i in range(len(models)) if names[i] in learned_models]
    bar = tqdm(total=len(cells), desc='prune_eval', disable=not progress, unit='cell')

    def pending(i: int) -> List[Tuple[str, float, str]]:
        """Model ``i``'s cells without a reusable row: (method, ratio, protocol)."""
        mine = []
        for _, method, ratio in [c for c in cells if c[0] == i]:
            proto = protocol(method, seeds, locations, flops_convention, measure_speed)
            if method == LEARNED:
                row = next((r for k, r in done.items() if k[0] == names[i] and k[1] == LEARNED
                            and k[3] == precision), None)
            else:
                row = done.get((names[i], method, round(ratio, 6), precision))
            if row is None or row.get('protocol') != proto:
                mine.append((method, ratio, proto))
        return mine

    todo = {i: pending(i) for i in range(len(models))}
    bar.update(len(cells) - sum(map(len, todo.values())))
    if jobs > 1 and sum(1 for v in todo.values() if v) > 1:
        busy = [i for i, v in todo.items() if v]
        kwargs = dict(cfg_options=cfg_options, verbose=verbose, progress=False,
                      precision=precision, seeds=seeds, locations=locations,
                      flops_convention=flops_convention, measure_speed=measure_speed,
                      replicates=replicates, final=False, margin=margin)
        tasks = [dict(kwargs, models=[models[i]], names=[names[i]], ratios=ratios,
                      out_dir=out_dir,
                      methods=[m for m in methods if m != LEARNED or names[i] in learned_models])
                 for i in busy]
        try:
            _sweep_in_workers(tasks, jobs, bar, path, prints)
        except BaseException:
            bar.close()       # the error line comes after the bar, not inside it
            raise
        with results_lock(path):
            done, _ = _reusable(load_results(path)['results'], prints, out_dir)
        todo = {i: pending(i) for i in range(len(models))}
        bar.n = len(cells) - sum(map(len, todo.values()))
        bar.refresh()
    for i, (config, ckpt) in enumerate(models):
        name, cfg = names[i], cfgs[i]
        mine = todo[i]
        if not mine:
            continue
        if not verbose:
            cfg.log_level = 'ERROR'
            cfg.default_hooks.logger = dict(type='LoggerHook', interval=10**9)
        runner = make_runner(cfg)
        ckpt_meta = load_model_weights(runner.model, ckpt, strict=True)
        recorders = [S.MetricRecorder(m) for m in runner.test_loop.evaluator.metrics
                     if type(m).__name__ in S.KINDS]
        if len(recorders) != 1:
            raise ConfigError(f'{config}: expected one test metric of {", ".join(S.KINDS)}, '
                              f'found {len(recorders)}')
        backbone = find_reducible_backbone(runner.model)
        learned = learned_reducer(backbone)
        if learned is not None:
            learned.fine_tuned = fine_tuning_label(ckpt_meta)
        cell = _Cell(runner=runner, backbone=backbone, learned=learned,
                     recorder=recorders[0], config=config, ckpt=ckpt, name=name,
                     precision=precision, metric_key=PRIMARY_METRICS[cfg.default_scope],
                     seeds=list(seeds), locations=locations, flops_convention=flops_convention,
                     measure_speed=measure_speed, out_dir=out_dir, results=path,
                     fingerprint=prints[name])
        for method, ratio, proto in mine:
            bar.set_postfix_str(f'{name} {method} {ratio}')
            row = cell.evaluate(method, ratio, proto, done)
            done[_key(row)] = row
            merge_results(path, [row], meta)
            bar.update(1)
    bar.close()
    if not final:
        with results_lock(path):
            return load_results(path)
    # the final pass (drops, intervals, meta; stale rows of these models) merges under the lock
    return merge_results(path, [], meta, current=prints, out_dir=out_dir,
                         replicates=replicates)


def _worker_init(threads: int) -> None:
    """A sweep worker's start: its share of the cores (before any torch op runs)."""
    import warnings
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
    import torch
    torch.set_num_threads(threads)


def _worker_sweep(task: dict) -> None:
    """One model's cells in a worker process (``run_sweep`` with ``final=False``)."""
    run_sweep(**task)


def _sweep_in_workers(tasks: Sequence[dict], jobs: int, bar, path: str,
                      prints: Dict[str, Fingerprint]) -> None:
    """Run ``tasks`` (``run_sweep`` keyword sets, one model each) in ``jobs`` spawned worker
    processes, each with ``torch.get_num_threads() // jobs`` threads (two torch processes
    that both spin on every core run many times slower than one), a worker taking the next
    model when it is done with one. Every worker merges its rows into ``path`` under the lock,
    as one process would; ``bar`` follows the file. After the first worker error no further
    model starts (the running ones finish theirs) and the error is raised here; the rows
    finished so far stay, and a rerun resumes."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    import torch
    jobs = min(jobs, len(tasks))
    threads = max(1, torch.get_num_threads() // jobs)
    start, before = bar.n, _rows_done(path, prints, tasks)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context('spawn'),
                             initializer=_worker_init, initargs=(threads, )) as ex:
        futures = [ex.submit(_worker_sweep, t) for t in tasks]
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=2.0, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in finished):
                for f in pending:
                    f.cancel()
                break
            bar.n = start + max(0, _rows_done(path, prints, tasks) - before)
            bar.refresh()
        for f in futures:
            if f.done() and not f.cancelled() and f.exception() is not None:
                raise f.exception()


def _rows_done(path: str, prints: Dict[str, Fingerprint], tasks: Sequence[dict]) -> int:
    """How many rows of ``tasks``' models (with this sweep's fingerprints) ``path`` holds now,
    for the progress bar (an unreadable file counts as none)."""
    names = {t['names'][0] for t in tasks}
    try:
        rows = load_results(path)['results']
    except (OSError, ValueError, ConfigError):
        return 0
    return sum(1 for r in rows if r['model'] in names and _fingerprint(r) == prints[r['model']])


@dataclass
class _Cell:
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

    def evaluate(self, method: str, ratio: float, proto: str, done: Dict[tuple, dict]) -> dict:
        """Evaluate one (method, ratio) cell, or reuse this model's ratio-0 evaluation."""
        import numpy as np
        import torch

        from amvim_mm.analysis import stats as S
        from amvim_mm.analysis.flops import backbone_flops
        from amvim_mm.engine.fileio import atomic_write_bytes
        bb = self.backbone
        if ratio == 0.0:
            zero = self._zero(done)
            if zero is not None and (not self.measure_speed or zero.get('img_per_s')) and \
                    zero.get('gflops_convention') == self.flops_convention:
                return dict(zero, method=method, protocol=proto)
        M, depth = bb.reduction_domain()
        dynamic = method == LEARNED and self.learned is not None and self.learned.dynamic
        if dynamic:       # per-image counts (LTMP): the ratio is known after the evaluation
            self.learned.reset_observed()
            ratio = 0.5   # a placeholder > 0 for the seed rule; replaced below
        elif method == LEARNED:
            ratio = round(self.learned.token_plan(M, depth)[2], 6)
        seeds = self.seeds if method in SEEDED_METHODS and ratio > 0 else [0]
        metrics, exact, per_seed, red = [], [], [], None
        t0 = time.perf_counter()
        for seed in seeds:
            red = cell_reducer(bb, method, ratio, self.locations, seed, learned=self.learned)
            bb.set_token_reduction(red)
            try:
                out = self.runner.test()
            finally:
                bb.set_token_reduction(None)
            st = self.recorder.stats()
            if self.metric_key not in out and self.recorder.kind == 'det' and \
                    len(st['det_score']) == 0:
                # mmdet reports nothing when no box passes the score threshold; COCO's AP of
                # an empty detection set is 0
                print(f'prune_eval: {self.name} {method} {ratio}: no detections, AP 0',
                      file=sys.stderr, flush=True)
                out = {self.metric_key: 0.0}
            if self.metric_key not in out:
                raise LookupConfigError(f'{self.config}: the test metrics {sorted(out)} have no '
                                        f'{self.metric_key!r}')
            # the point value: the metric recomputed from the per-image statistics (the same
            # numbers the intervals use), checked against the library's rounded value
            exact.append(S.check_against(st, float(out[self.metric_key]),
                                         f'{self.name} {method} {ratio} seed {seed}'))
            metrics.append(float(out[self.metric_key]))
            per_seed.append(st)
        dt = time.perf_counter() - t0
        keys = _image_keys(self.runner, self.recorder)
        if method == LEARNED:
            bb.set_token_reduction(red)
            try:
                flops = backbone_flops(bb, bb.img_size, 'model', convention=self.flops_convention)
            finally:
                bb.set_token_reduction(None)
            red = red.config()
            if dynamic:
                ratio = round(flops['realised_ratio'], 6)
        else:
            flops = backbone_flops(bb, bb.img_size, red, convention=self.flops_convention)
        stats_file = _stats_name(self.name, method, ratio, self.precision)
        os.makedirs(osp.dirname(osp.join(self.out_dir, stats_file)), exist_ok=True)
        atomic_write_bytes(S.dumps(per_seed, keys), osp.join(self.out_dir, stats_file))
        row = dict(model=self.name, config=self.config, checkpoint=self.ckpt, method=method,
                   ratio=ratio, precision=self.precision, protocol=proto, reduction=red,
                   realised_ratio=round(flops['realised_ratio'], 4),
                   gflops=round(flops['gflops'], 4), gflops_convention=self.flops_convention,
                   metric_name=self.metric_key, metric=round(float(np.mean(exact)), 4),
                   metric_library=round(float(np.mean(metrics)), 4),
                   final_tokens=flops['tokens'][-1], seconds=round(dt, 2), images=len(keys),
                   stats_file=stats_file, checkpoint_sha256=self.fingerprint[0],
                   config_sha256=self.fingerprint[1])
        if len(exact) > 1:
            row.update(seeds=seeds, metric_seeds=[round(m, 4) for m in exact],
                       seed_std=round(float(np.std(exact, ddof=1)), 4))
        if method == LEARNED:
            row['fine_tuned'] = getattr(self.learned, 'fine_tuned', None) or True
        if self.measure_speed:
            row.update(_speed(bb, bb.img_size, self.precision,
                              self.learned if method == LEARNED else red))
        elif torch.cuda.is_available():
            row['img_per_s_test_loop'] = round(len(keys) * len(seeds) / dt, 1)
        return row

    def _zero(self, done: Dict[tuple, dict]) -> Optional[dict]:
        zero = _zero_row(done, self.name, self.precision)
        if zero is None:   # another sweep into this out-dir may have evaluated it meanwhile
            with results_lock(self.results):
                fresh, _ = _reusable(load_results(self.results)['results'],
                                     {self.name: self.fingerprint}, self.out_dir)
            zero = _zero_row(fresh, self.name, self.precision)
        return zero


def _speed(backbone, size, precision: str, red: Optional[dict]) -> dict:
    """Backbone throughput on the present device (eager, median of 5 repeats), with the
    cell's reducer on; batch 8 on a CPU, 64 on a GPU."""
    import torch

    from amvim_mm.analysis.benchmark import measure
    if size[0] != size[1]:
        raise ConfigError(f'--measure-speed needs a square img_size, got {size}')
    cuda = next(backbone.parameters()).is_cuda
    batch = 64 if cuda else 8
    backbone.set_token_reduction(red)
    was = backbone.training
    try:
        backbone.eval()
        r = measure(backbone, batch, size[0], precision, 'eager', warmup=2,
                    iters=10 if cuda else 3, repeats=5)
    finally:
        backbone.set_token_reduction(None)
        backbone.train(was)
    return dict(img_per_s=r['img_per_s'], speed_batch=batch, speed_spread_pct=r['spread_pct'],
                speed_device=torch.cuda.get_device_name(0) if cuda else 'cpu')


def add_intervals(data: Dict[str, object], out_dir: str, replicates: int = 1000,
                  level: float = 0.95, seed: int = 0) -> None:
    """Fill every row's intervals over images (metric, drop, relative drop), the models'
    ``paired_differences`` (over images) and, per architecture (``meta.groups``; every model
    is its own group without them), the verdicts of :func:`_group_verdicts` (see the module
    docstring)."""
    import numpy as np

    from amvim_mm.analysis import stats as S
    rows = data['results']
    weights: Dict[tuple, np.ndarray] = {}
    values: Dict[tuple, Optional[Tuple[np.ndarray, tuple, float]]] = {}

    def vals(r):
        """(bootstrap replicates over images (R,), image keys, point value) of a row: the
        metric recomputed from its per-image statistics (mean over pruning seeds)."""
        if r is None:
            return None
        k = _key(r)
        if k not in values:
            f = r.get('stats_file')
            values[k] = None
            if f and osp.isfile(osp.join(out_dir, f)):
                per_seed, keys = S.loads(osp.join(out_dir, f))
                keys = tuple(keys)
                if keys not in weights:
                    weights[keys] = S.bootstrap_weights(len(keys), replicates, seed)
                point = float(S.mean_over_seeds(per_seed, np.ones((1, len(keys))))[0])
                values[k] = (S.mean_over_seeds(per_seed, weights[keys]), keys, point)
        return values[k]

    for r in rows:
        for f in ('ci_low', 'ci_high', 'drop_ci_low', 'drop_ci_high', 'relative_drop',
                  'relative_drop_ci_low', 'relative_drop_ci_high'):
            r[f] = None
        v = vals(r)
        if v is None:
            continue
        r['ci_low'], r['ci_high'] = S.interval(v[0], level)
        z = _zero_of(rows, r)
        v0 = vals(z)
        if v0 is not None and v0[1] == v[1] and v0[2] != 0:
            r['drop_ci_low'], r['drop_ci_high'] = S.interval(v[0] - v0[0], level)
            r['relative_drop'] = round(100 * (v[2] - v0[2]) / v0[2], 4)
            with np.errstate(invalid='ignore', divide='ignore'):
                rel = 100 * (v[0] - v0[0]) / v0[0]
            r['relative_drop_ci_low'], r['relative_drop_ci_high'] = S.interval(rel, level)
    order = list((data.get('meta') or {}).get('models') or [])
    models = list(dict.fromkeys(order + [r['model'] for r in rows]))
    models = [m for m in models if any(r['model'] == m for r in rows)]
    pairs = []
    for i, a in enumerate(models):
        for b in models[i + 1:]:
            for ra in rows:
                if ra['model'] != a or float(ra['ratio']) == 0.0 or ra.get('drop') is None:
                    continue
                rb = next((x for x in rows if x['model'] == b and _key(x)[1:] == _key(ra)[1:]),
                          None)
                if rb is None or rb.get('drop') is None:
                    continue
                va, vb = vals(ra), vals(rb)
                v0a, v0b = vals(_zero_of(rows, ra)), vals(_zero_of(rows, rb))
                if None in (va, vb, v0a, v0b) or len({va[1], vb[1], v0a[1], v0b[1]}) != 1:
                    continue      # not the same images: no paired difference
                diff = (va[0] - v0a[0]) - (vb[0] - v0b[0])
                lo, hi = S.interval(diff, level)
                d = round(ra['drop'] - rb['drop'], 4)
                pairs.append(dict(
                    model_a=a, model_b=b, method=ra['method'], ratio=ra['ratio'],
                    precision=ra.get('precision', 'fp32'), metric_name=ra['metric_name'],
                    drop_a=ra['drop'], drop_b=rb['drop'], paired_difference=d,
                    difference_ci_low=lo, difference_ci_high=hi,
                    relative_drop_a=ra.get('relative_drop'),
                    relative_drop_b=rb.get('relative_drop'),
                    reading=_reading(a, b, lo, hi), basis='images (one checkpoint each)'))
    data['paired_differences'] = pairs
    meta = data.get('meta') or {}
    groups = meta.get('groups') or {m: m for m in models}
    _group_verdicts(data, groups, vals, level, meta.get('margin'))


def _group_verdicts(data, groups: Dict[str, str], vals, level: float,
                    margin: Optional[float]) -> None:
    """Per architecture (a group of checkpoints, e.g. one per training seed) and cell: the
    mean metric, drop and relative drop over its checkpoints with intervals over training seeds
    and images (``group_results``, :func:`amvim_mm.analysis.verdicts.estimate`); per pair of
    architectures and cell the difference of their drops with its verdict
    (``group_paired_differences``, :func:`~amvim_mm.analysis.verdicts.compare`, Holm over all
    cells shown); per architecture and method the robustness AUC, the mean drop over the
    kept-token range (``group_auc``), and per pair its difference with a verdict
    (``group_auc_differences``, Holm over those). ``margin`` (None: the metric's default)
    is the equivalence margin of the drops and AUCs."""
    import numpy as np

    from amvim_mm.analysis import verdicts as V
    rows = data['results']
    models = data['meta'].get('models') or list(groups)
    order = list(dict.fromkeys(groups[m] for m in models if m in groups))
    members = {g: [m for m in models if groups.get(m) == g] for g in order}
    cells = sorted({_key(r)[1:] for r in rows if r['model'] in groups})
    out, per = [], {}
    for g in order:
        for cell in cells:
            rs = [next((r for r in rows if r['model'] == m and _key(r)[1:] == cell), None)
                  for m in members[g]]
            if any(r is None for r in rs):
                continue
            entry = dict(group=g, models=members[g], method=cell[0], ratio=cell[1],
                         precision=cell[2], metric_name=rs[0]['metric_name'],
                         realised_ratio=rs[0]['realised_ratio'], gflops=rs[0]['gflops'],
                         metric=round(float(np.mean([r['metric'] for r in rs])), 4),
                         metric_models=[r['metric'] for r in rs],
                         drop=(None if any(r.get('drop') is None for r in rs) else
                               round(float(np.mean([r['drop'] for r in rs])), 4)),
                         ci_low=None, ci_high=None, drop_ci_low=None, drop_ci_high=None,
                         relative_drop=None, relative_drop_ci_low=None,
                         relative_drop_ci_high=None, basis=None)
            vs = [vals(r) for r in rs]
            v0s = [vals(_zero_of(rows, r)) for r in rs]
            keys = {v[1] for v in vs + v0s if v is not None}
            if None not in vs and len(keys) == 1:
                X, B = np.array([v[2] for v in vs]), np.stack([v[0] for v in vs])
                est = V.estimate(X, B, level)
                entry.update(metric=round(est['value'], 4), ci_low=round(est['ci_low'], 4),
                             ci_high=round(est['ci_high'], 4), basis=est['basis'])
                if None not in v0s:
                    X0, B0 = np.array([v[2] for v in v0s]), np.stack([v[0] for v in v0s])
                    quantities = dict(drop=(X - X0, B - B0))
                    with np.errstate(invalid='ignore', divide='ignore'):
                        quantities['relative_drop'] = (100 * (X - X0) / X0,
                                                       100 * (B - B0) / B0)
                    for name, (x, b) in quantities.items():
                        e = V.estimate(x, b, level)
                        entry.update({name: round(e['value'], 4),
                                      f'{name}_ci_low': round(e['ci_low'], 4),
                                      f'{name}_ci_high': round(e['ci_high'], 4)})
                    per[(g, cell)] = dict(quantities, metric0=(X0, B0), keys=next(iter(keys)),
                                          kept=1.0 - float(rs[0]['realised_ratio']))
            out.append(entry)
    data['group_results'] = out
    margin_of = (lambda name: margin) if margin else V.default_margin    # noqa: E731
    diffs = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            for cell in cells:
                pa, pb = per.get((a, cell)), per.get((b, cell))
                if float(cell[1]) == 0.0 or pa is None or pb is None or \
                        pa['keys'] != pb['keys']:
                    continue
                name = next(e['metric_name'] for e in out if e['group'] == a)
                c = V.compare(*pa['drop'], *pb['drop'], margin=margin_of(name), level=level)
                rel = V.compare(*pa['relative_drop'], *pb['relative_drop'], margin=1.0,
                                level=level)
                ea = next(e for e in out if e['group'] == a and
                          (e['method'], e['ratio'], e['precision']) == cell)
                eb = next(e for e in out if e['group'] == b and
                          (e['method'], e['ratio'], e['precision']) == cell)
                diffs.append(dict(
                    group_a=a, group_b=b, method=cell[0], ratio=cell[1], precision=cell[2],
                    metric_name=name, drop_a=ea['drop'], drop_b=eb['drop'],
                    relative_drop_a=ea['relative_drop'], relative_drop_b=eb['relative_drop'],
                    relative_difference=round(rel['difference'], 4),
                    relative_difference_ci_low=round(rel['ci_low'], 4),
                    relative_difference_ci_high=round(rel['ci_high'], 4),
                    **_rounded(c, 'paired_difference')))
    V.decide(diffs, alpha=1 - level, key='paired_difference')
    for d in diffs:
        d['reading'] = _verdict_text(d)
    data['group_paired_differences'] = diffs
    _group_auc(data, order, per, level, margin_of)


def _rounded(c: dict, name: str) -> dict:
    """A :func:`~amvim_mm.analysis.verdicts.compare` result as row fields (``name`` for the
    difference)."""
    return {name: round(c['difference'], 4), 'difference_ci_low': round(c['ci_low'], 4),
            'difference_ci_high': round(c['ci_high'], 4), 'se': round(c['se'], 4),
            'df': None if c['df'] is None else round(c['df'], 2), 'p': c['p'],
            'p_equivalence': c['p_equivalence'], 'margin': c['margin'],
            'detectable': round(c['detectable'], 4), 'basis': c['basis']}


def _verdict_text(d: dict) -> str:
    """One line for a verdict of :func:`~amvim_mm.analysis.verdicts.decide`."""
    a, b = d.get('group_a'), d.get('group_b')
    v = d['verdict']
    if v == 'A loses less':
        return f'{a} loses less than {b}'
    if v == 'A loses more':
        return f'{a} loses more than {b}'
    if v == 'equivalent':
        return f'equivalent within +-{d["margin"]:g}'
    return f'inconclusive (detectable: {d["detectable"]:.3g})'


def _group_auc(data, order: Sequence[str], per: dict, level: float, margin_of) -> None:
    """``group_auc`` and ``group_auc_differences`` (see :func:`_group_verdicts`)."""
    import numpy as np

    from amvim_mm.analysis import verdicts as V
    entries, curves = [], {}
    for g in order:
        for method, precision in sorted({(c[0], c[2]) for (gg, c) in per if gg == g}):
            pts = sorted(((c[1], p) for (gg, c), p in per.items()
                          if gg == g and c[0] == method and c[2] == precision
                          and float(c[1]) > 0), key=lambda t: t[0])
            zero = next((p for (gg, c), p in per.items() if gg == g and c[2] == precision
                         and float(c[1]) == 0.0), None)
            if not pts or zero is None or len({p['keys'] for _, p in pts} | {zero['keys']}) != 1:
                continue
            kept = [1.0] + [p['kept'] for _, p in pts]
            X0, B0 = zero['metric0']
            curve = dict(
                drop=([np.zeros_like(X0)] + [p['drop'][0] for _, p in pts],
                      [np.zeros_like(B0)] + [p['drop'][1] for _, p in pts]),
                relative_drop=([np.zeros_like(X0)] + [p['relative_drop'][0] for _, p in pts],
                               [np.zeros_like(B0)] + [p['relative_drop'][1] for _, p in pts]))
            aucs = {k: (V.robustness_auc(kept, np.stack(x)), V.robustness_auc(kept, np.stack(b)))
                    for k, (x, b) in curve.items()}
            curves[(g, method, precision)] = (aucs, zero['keys'])
            e_drop = V.estimate(*aucs['drop'], level)
            e_rel = V.estimate(*aucs['relative_drop'], level)
            entries.append(dict(
                group=g, method=method, precision=precision,
                metric_name=next(e['metric_name'] for e in data['group_results']
                                 if e['group'] == g),
                ratios=[r for r, _ in pts], kept=[round(k, 4) for k in kept],
                auc_drop=round(e_drop['value'], 4), auc_drop_ci_low=round(e_drop['ci_low'], 4),
                auc_drop_ci_high=round(e_drop['ci_high'], 4),
                auc_relative_drop=round(e_rel['value'], 4),
                auc_relative_drop_ci_low=round(e_rel['ci_low'], 4),
                auc_relative_drop_ci_high=round(e_rel['ci_high'], 4), basis=e_drop['basis']))
    diffs = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            for (g, method, precision), (aucs, keys) in curves.items():
                other = curves.get((b, method, precision))
                if g != a or other is None or other[1] != keys:
                    continue
                ea = next(e for e in entries if (e['group'], e['method'], e['precision']) ==
                          (a, method, precision))
                eb = next(e for e in entries if (e['group'], e['method'], e['precision']) ==
                          (b, method, precision))
                if ea['ratios'] != eb['ratios']:
                    continue      # other ratios: the areas cover other ranges
                c = V.compare(*aucs['drop'], *other[0]['drop'],
                              margin=margin_of(ea['metric_name']), level=level)
                diffs.append(dict(group_a=a, group_b=b, method=method, precision=precision,
                                  metric_name=ea['metric_name'], auc_drop_a=ea['auc_drop'],
                                  auc_drop_b=eb['auc_drop'],
                                  **_rounded(c, 'auc_difference')))
    V.decide(diffs, alpha=1 - level, key='auc_difference')
    for d in diffs:
        d['reading'] = _verdict_text(d)
    data['group_auc'] = entries
    data['group_auc_differences'] = diffs


def _reading(a: str, b: str, lo: Optional[float], hi: Optional[float]) -> str:
    """What the interval of ``a``'s drop minus ``b``'s says."""
    if lo is not None and lo > 0:
        return f'{a} keeps more'
    if hi is not None and hi < 0:
        return f'{b} keeps more'
    return 'no difference resolved (the interval contains 0)'


def _digits(metric_name: str) -> int:
    """Decimals to print: COCO AP is a fraction, mIoU / top-1 are percentages."""
    return 3 if metric_name.startswith('coco') else 2


def _fmt_ci(lo, hi, digits: int) -> str:
    return '' if lo is None else f'[{lo:.{digits}f}, {hi:.{digits}f}]'


def _differences_table(diffs: Sequence[dict], a: str, b: str, title: str,
                       precision: bool) -> List[str]:
    """Markdown lines of paired differences (``a``/``b``: the keys naming the two sides)."""
    if not diffs:
        return []
    head = ['A', 'B', 'method', 'ratio'] + (['precision'] if precision else []) + [
        'drop A', 'drop B', 'A - B', '95% CI', 'reading']
    lines = ['', title, '', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for d in diffs:
        dg = _digits(d['metric_name'])
        cells = [d[a], d[b], d['method'], f"{d['ratio']:.2f}"] + (
            [d['precision']] if precision else []) + [
            f"{d['drop_a']:+.{dg}f}", f"{d['drop_b']:+.{dg}f}",
            f"{d['paired_difference']:+.{dg}f}",
            _fmt_ci(d['difference_ci_low'], d['difference_ci_high'], dg), d['reading']]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines


def _yerr(items: Sequence[dict]) -> List[List[float]]:
    """Error bars (below, above) of ``metric`` from ``ci_low``/``ci_high`` (0 where absent)."""
    return [[max(0.0, r['metric'] - r['ci_low']) if r.get('ci_low') is not None else 0
             for r in items],
            [max(0.0, r['ci_high'] - r['metric']) if r.get('ci_high') is not None else 0
             for r in items]]


def markdown_table(data: Dict[str, object]) -> str:
    rows = data['results']
    speed = any(r.get('img_per_s') for r in rows)
    seeded = any(r.get('seed_std') is not None for r in rows)
    head = ['model', 'method', 'ratio', 'realised', 'GFLOPs', 'metric', 'value', 'drop',
            '95% CI', 'drop 95% CI', 'precision']
    if seeded:
        head.append('seed std')
    if speed:
        head += ['img/s', 'speed-up']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        dg = _digits(r['metric_name'])
        method = r['method']
        if r.get('fine_tuned'):
            how = r['fine_tuned'] if isinstance(r['fine_tuned'], str) else 'fine-tuned'
            method = f"{(r.get('reduction') or {}).get('type', method)} ({how})"
        cells = [r['model'], method, f"{r['ratio']:.2f}", f"{r['realised_ratio']:.3f}",
                 f"{r['gflops']:.3f}", r['metric_name'], f"{r['metric']:.{dg}f}",
                 '' if r.get('drop') is None else f"{r['drop']:+.{dg}f}",
                 _fmt_ci(r.get('ci_low'), r.get('ci_high'), dg),
                 _fmt_ci(r.get('drop_ci_low'), r.get('drop_ci_high'), dg),
                 r.get('precision', 'fp32')]
        if seeded:
            cells.append('' if r.get('seed_std') is None else f"{r['seed_std']:.{dg}f}")
        if speed:
            z = _zero_of(rows, r)
            sp = (r['img_per_s'] / z['img_per_s'] if r.get('img_per_s') and z is not None
                  and z.get('img_per_s') else None)
            cells += ['' if r.get('img_per_s') is None else f"{r['img_per_s']:.1f}",
                      '' if sp is None else f'{sp:.2f}x']
        lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
    lines += _differences_table(
        data.get('paired_differences') or [], 'model_a', 'model_b',
        'Paired differences of the drops (model A - model B, same images; > 0: A keeps more):',
        precision=True)
    return '\n'.join(lines)


def group_table(data: Dict[str, object]) -> str:
    """The architectures' table (mean over each group's checkpoints, intervals over training
    seeds and images; absolute and relative drops); empty without groups."""
    entries = data.get('group_results') or []
    if not entries or not (data.get('meta') or {}).get('groups'):
        return ''
    lines = ['| group | models | method | ratio | realised | metric | mean | 95% CI | '
             'mean drop | drop 95% CI | relative drop % | 95% CI | per model |',
             '|' + '---|' * 13]
    zeros = set()
    for e in entries:
        dg = _digits(e['metric_name'])
        method = e['method']
        if float(e['ratio']) == 0.0:      # no reduction: the same for every method, once
            if (e['group'], e['precision']) in zeros:
                continue
            zeros.add((e['group'], e['precision']))
            method = 'none'
        rel = e.get('relative_drop')
        lines.append(
            f"| {e['group']} | {len(e['models'])} | {method} | {e['ratio']:.2f} | "
            f"{e['realised_ratio']:.3f} | {e['metric_name']} | {e['metric']:.{dg}f} | "
            f"{_fmt_ci(e['ci_low'], e['ci_high'], dg)} | "
            f"{'' if e['drop'] is None else format(e['drop'], f'+.{dg}f')} | "
            f"{_fmt_ci(e['drop_ci_low'], e['drop_ci_high'], dg)} | "
            f"{'' if rel is None else format(rel, '+.1f')} | "
            f"{_fmt_ci(e.get('relative_drop_ci_low'), e.get('relative_drop_ci_high'), 1)} | "
            f"{' / '.join(format(m, f'.{dg}f') for m in e['metric_models'])} |")
    return '\n'.join(lines)


def _p(p: float) -> str:
    return '<0.001' if p < 0.001 else f'{p:.3f}'


def verdict_table(data: Dict[str, object]) -> str:
    """The verdicts: the robustness AUC per architecture and method, the AUC differences of
    every pair of architectures, then the drop differences per cell (Holm-adjusted within each
    family; > 0: A loses less). Architectures are the groups, or the models without groups."""
    aucs = data.get('group_auc') or []
    auc_diffs = data.get('group_auc_differences') or []
    diffs = data.get('group_paired_differences') or []
    if not (aucs or diffs):
        return ''
    lines = []
    if aucs:
        name = aucs[0]['metric_name']
        dg = _digits(name)
        lines += [f'Robustness AUC: the mean drop of {name} over the kept-token range (no '
                  'reduction to the largest ratio); 95 % intervals over training seeds and '
                  'images:', '',
                  '| architecture | method | ratios | AUC drop | 95% CI | AUC relative drop % '
                  '| 95% CI |', '|' + '---|' * 7]
        for e in aucs:
            lines.append(
                f"| {e['group']} | {e['method']} | {', '.join(f'{r:g}' for r in e['ratios'])} | "
                f"{e['auc_drop']:+.{dg}f} | "
                f"{_fmt_ci(e['auc_drop_ci_low'], e['auc_drop_ci_high'], dg)} | "
                f"{e['auc_relative_drop']:+.1f} | "
                f"{_fmt_ci(e['auc_relative_drop_ci_low'], e['auc_relative_drop_ci_high'], 1)} |")
    if auc_diffs:
        n, m = auc_diffs[0]['family_size'], auc_diffs[0]['margin']
        dg = _digits(auc_diffs[0]['metric_name'])
        lines += ['', f'AUC differences (A - B; > 0: A loses less; Holm over {n}; equivalence '
                  f'margin +-{m:g}):', '',
                  '| A | B | method | A - B | 95% CI | p (Holm) | detectable | verdict |',
                  '|' + '---|' * 8]
        for d in auc_diffs:
            lines.append(
                f"| {d['group_a']} | {d['group_b']} | {d['method']} | "
                f"{d['auc_difference']:+.{dg}f} | "
                f"{_fmt_ci(d['difference_ci_low'], d['difference_ci_high'], dg)} | "
                f"{_p(d['p_holm'])} | {d['detectable']:.{dg}f} | {d['reading']} |")
    if diffs:
        n, m = diffs[0]['family_size'], diffs[0]['margin']
        dg = _digits(diffs[0]['metric_name'])
        lines += ['', f'Drop differences per cell (A - B; > 0: A loses less; Holm over {n}; '
                  f'equivalence margin +-{m:g}; relative drops in % of each model\'s own '
                  'unreduced metric):', '',
                  '| A | B | method | ratio | drop A | drop B | A - B | 95% CI | rel. A % | '
                  'rel. B % | p (Holm) | verdict |', '|' + '---|' * 12]
        for d in diffs:
            ra, rb = d.get('relative_drop_a'), d.get('relative_drop_b')
            lines.append(
                f"| {d['group_a']} | {d['group_b']} | {d['method']} | {d['ratio']:.2f} | "
                f"{d['drop_a']:+.{dg}f} | {d['drop_b']:+.{dg}f} | "
                f"{d['paired_difference']:+.{dg}f} | "
                f"{_fmt_ci(d['difference_ci_low'], d['difference_ci_high'], dg)} | "
                f"{'' if ra is None else format(ra, '+.1f')} | "
                f"{'' if rb is None else format(rb, '+.1f')} | {_p(d['p_holm'])} | "
                f"{d['reading']} |")
    basis = (aucs or diffs)[0]['basis']
    lines += ['', f'Intervals over {basis}.']
    return '\n'.join(lines)


def plot(data: Dict[str, object], path: str) -> str:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=120)
    series: Dict[Tuple[str, str, str], List[dict]] = {}
    for r in data['results']:
        series.setdefault((r['model'], r['method'], r.get('precision', 'fp32')), []).append(r)
    models = sorted({m for m, _, _ in series})
    colors = {m: plt.get_cmap('tab10')(i % 10) for i, m in enumerate(models)}
    styles = {'tome': ('-', 'o'), 'random': ('--', 's'), 'evit': (':', '^'), 'top': ('-.', 'D')}
    for (model, method, prec), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r['realised_ratio'])
        x = [r['realised_ratio'] for r in rs]
        y = [r['metric'] for r in rs]
        err = _yerr(rs)
        ls, mk = styles.get(method, (':', 'x'))
        ax.errorbar(x, y, yerr=err, color=colors[model], marker=mk, linestyle=ls, capsize=2,
                    label=f'{model} / {method}' + ('' if prec == 'fp32' else f' / {prec}'))
    name = data['results'][0]['metric_name'] if data['results'] else 'metric'
    ax.set_xlabel('realised token reduction ratio (training-free)')
    ax.set_ylabel(f'{name} (95% bootstrap CI over images)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_groups(data: Dict[str, object], path: str) -> str:
    """One panel per method: each group's mean metric vs realised ratio, with the interval over
    images and the group's models as error bars."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    entries = data.get('group_results') or []
    methods = list(dict.fromkeys(e['method'] for e in entries))
    groups = list(dict.fromkeys(e['group'] for e in entries))
    fig, axes = plt.subplots(1, max(len(methods), 1), figsize=(3.2 * max(len(methods), 1), 3.4),
                             dpi=120, sharey=True, squeeze=False)
    colors = {g: plt.get_cmap('tab10')(i % 10) for i, g in enumerate(groups)}
    for ax, method in zip(axes[0], methods):
        for g in groups:
            es = sorted((e for e in entries if e['group'] == g and e['method'] == method),
                        key=lambda e: e['realised_ratio'])
            if not es:
                continue
            y = [e['metric'] for e in es]
            err = _yerr(es)
            ax.errorbar([e['realised_ratio'] for e in es], y, yerr=err, color=colors[g],
                        marker='o', capsize=2, label=f'{g} ({len(es[0]["models"])} models)')
        ax.set_title(method)
        ax.set_xlabel('realised ratio')
        ax.grid(alpha=0.3)
    if entries:
        axes[0][0].set_ylabel(f"{entries[0]['metric_name']} (mean, 95% CI)")
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
