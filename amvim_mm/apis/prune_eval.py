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
a row with the same hashes. Ratio 0 (no reduction) is evaluated once per model and reused for
every method.
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
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from amvim_mm.errors import CheckpointError, ConfigError, LookupConfigError

METHODS = {'tome': 'ToMe', 'random': 'RandomPrune'}
PRIMARY_METRICS = {'mmseg': 'mIoU', 'mmdet': 'coco/bbox_mAP', 'mmpretrain': 'accuracy/top1'}


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


def _key(r: dict) -> Tuple[str, str, float]:
    return (r['model'], r['method'], round(float(r['ratio']), 6))


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


def _set_drops(rows: List[dict]) -> None:
    """``drop`` = metric - metric at ratio 0 of the same model (same method if there is one),
    only against a ratio-0 row with the same checkpoint and config hashes; else None."""
    zeros: Dict[Tuple[str, str], dict] = {}
    for r in rows:
        if round(float(r['ratio']), 6) == 0.0:
            zeros.setdefault((r['model'], r['method']), r)
    for r in rows:
        base = zeros.get((r['model'], r['method']))
        if base is None:    # ratio 0 is the same for every method
            base = next((z for (m, _), z in sorted(zeros.items()) if m == r['model']), None)
        same = base is not None and _fingerprint(base) == _fingerprint(r)
        r['drop'] = round(r['metric'] - base['metric'], 4) if same else None


def merge_results(path: str, rows: Sequence[dict], meta: Optional[dict] = None,
                  current: Optional[Dict[str, Fingerprint]] = None) -> Dict[str, object]:
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
        _write_json(path, data)
    return data


def _reusable(rows: Sequence[dict], prints: Dict[str, Fingerprint]
              ) -> Tuple[Dict[Tuple[str, str, float], dict], Dict[str, int]]:
    """Split the stored rows of this sweep's models into reusable ones (same fingerprint), by
    key, and a count of stale ones per model name."""
    done, stale = {}, {}
    for r in rows:
        name = r['model']
        if name not in prints:
            continue
        if _fingerprint(r) == prints[name]:
            done[_key(r)] = r
        else:
            stale[name] = stale.get(name, 0) + 1
    return done, stale


def _zero_row(done: Dict[Tuple[str, str, float], dict], name: str) -> Optional[dict]:
    return next((r for k, r in sorted(done.items()) if k[0] == name and k[2] == 0.0), None)


def validate(models: Sequence[Tuple[str, str]], methods: Sequence[str],
             ratios: Sequence[float], names: Optional[Sequence[str]] = None) -> List[str]:
    """Check the sweep's arguments; returns the display names (``names`` or from the configs)."""
    if not models:
        raise ConfigError('give at least one CONFIG CHECKPOINT pair')
    for cfg, ckpt in models:
        if not osp.isfile(cfg):
            raise FileNotFoundError(f'config file not found: {cfg}')
        if not osp.isfile(ckpt):
            raise FileNotFoundError(f'checkpoint not found: {ckpt}')
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f'unknown method {m!r}; choose from {", ".join(METHODS)}')
    for r in ratios:
        if not 0 <= r < 1:
            raise ConfigError(f'ratio {r} is outside [0, 1)')
    names = list(names) if names else [model_name(c) for c, _ in models]
    if len(names) != len(models):
        raise ConfigError(f'{len(names)} names for {len(models)} models')
    if len(set(names)) != len(names):
        raise ConfigError(f'two models share the name {names}; give distinct --names')
    return names


def run_sweep(models: Sequence[Tuple[str, str]], methods: Sequence[str],
              ratios: Sequence[float], out_dir: str, names: Optional[Sequence[str]] = None,
              cfg_options: Optional[dict] = None, verbose: bool = False,
              progress: bool = True) -> Dict[str, object]:
    """Run (or resume) a sweep; returns the merged results also written to ``results.json``.

    Rows of ``results.json`` are reused only when their model name, method, ratio, checkpoint
    sha256 and config sha256 all match (see the module docstring); each finished run is merged
    into the file under a lock, so other sweeps into the same ``out_dir`` keep their rows.
    """
    import torch
    from tqdm import tqdm

    from amvim_mm.analysis.flops import CONVENTION, vim_family_flops
    from amvim_mm.apis.runner import load_config, load_model_weights, make_runner
    from amvim_mm.engine.hooks import find_reducible_backbone
    names = validate(models, methods, ratios, names)
    path = osp.join(prepare_out_dir(out_dir), 'results.json')
    cfgs, prints = [], {}
    for (config, ckpt), name in zip(models, names):
        cfg = load_config(config, cfg_options, work_dir=osp.join(out_dir, 'work', name))
        cfgs.append(cfg)
        prints[name] = (file_sha256(ckpt), config_sha256(cfg))
    with results_lock(path):
        stored = load_results(path)['results']
    done, stale = _reusable(stored, prints)
    for name, n in stale.items():
        print(f'prune_eval: {n} row(s) of {name!r} in {path} come from another checkpoint or '
              'config (sha256 differs): stale, recomputing and replacing them',
              file=sys.stderr, flush=True)
    ratios = sorted(set(float(r) for r in ratios))
    todo = [(i, m, r) for i in range(len(models)) for m in methods for r in ratios
            if (names[i], m, round(r, 6)) not in done]
    meta = dict(convention=CONVENTION, protocol='training-free, AMVim protocol '
                '(r tokens removed at the start of the even blocks)',
                device='cuda' if torch.cuda.is_available() else 'cpu', torch=torch.__version__)
    bar = tqdm(total=len(todo), desc='prune_eval', disable=not progress, unit='run')
    for i, (config, ckpt) in enumerate(models):
        mine = [(m, r) for j, m, r in todo if j == i]
        if not mine:
            continue
        name, cfg = names[i], cfgs[i]
        hashes = dict(checkpoint_sha256=prints[name][0], config_sha256=prints[name][1])
        if not verbose:
            cfg.log_level = 'ERROR'
            cfg.default_hooks.logger = dict(type='LoggerHook', interval=10**9)
        scope = cfg.default_scope
        metric_key = PRIMARY_METRICS[scope]
        runner = make_runner(cfg)
        load_model_weights(runner.model, ckpt, strict=True)
        backbone = find_reducible_backbone(runner.model)
        size = backbone.img_size
        for method, ratio in mine:
            bar.set_postfix_str(f'{name} {method} {ratio}')
            zero = _zero_row(done, name)
            if ratio == 0.0 and zero is None:
                # another sweep into this out-dir may have evaluated it meanwhile
                with results_lock(path):
                    fresh, _ = _reusable(load_results(path)['results'], {name: prints[name]})
                zero = _zero_row(fresh, name)
            if ratio == 0.0 and zero is not None:
                rec = dict(zero, method=method)   # ratio 0 is no reduction: same for every method
            else:
                red = dict(type=METHODS[method], ratio=ratio) if ratio > 0 else None
                backbone.set_token_reduction(red)
                t0 = time.perf_counter()
                metrics = runner.test()
                dt = time.perf_counter() - t0
                backbone.set_token_reduction(None)
                if metric_key not in metrics:
                    raise LookupConfigError(f'{config}: the test metrics {sorted(metrics)} have no '
                                            f'{metric_key!r}')
                n = len(runner.test_dataloader.dataset)
                flops = vim_family_flops(backbone, size, red)
                rec = dict(model=name, config=config, checkpoint=ckpt, method=method,
                           ratio=ratio, realised_ratio=round(flops['realised_ratio'], 4),
                           gflops=round(flops['gflops'], 4), metric_name=metric_key,
                           metric=float(metrics[metric_key]), final_tokens=flops['tokens'][-1],
                           seconds=round(dt, 2),
                           img_per_s=round(n / dt, 1) if torch.cuda.is_available() else None,
                           **hashes)
            done[_key(rec)] = rec
            merge_results(path, [rec], meta)
            bar.update(1)
    bar.close()
    # the final pass (drops, meta; stale rows of these models) also merges under the lock
    return merge_results(path, [], meta, current=prints)


def markdown_table(data: Dict[str, object]) -> str:
    rows = data['results']
    gpu = any(r.get('img_per_s') for r in rows)
    head = ['model', 'method', 'ratio', 'realised', 'GFLOPs', 'metric', 'value', 'drop']
    if gpu:
        head.append('img/s')
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        cells = [r['model'], r['method'], f"{r['ratio']:.2f}", f"{r['realised_ratio']:.3f}",
                 f"{r['gflops']:.3f}", r['metric_name'], f"{r['metric']:.2f}",
                 '' if r.get('drop') is None else f"{r['drop']:+.2f}"]
        if gpu:
            cells.append('' if r.get('img_per_s') is None else f"{r['img_per_s']:.1f}")
        lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
    return '\n'.join(lines)


def plot(data: Dict[str, object], path: str) -> str:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in data['results']:
        series.setdefault((r['model'], r['method']), []).append(r)
    models = sorted({m for m, _ in series})
    colors = {m: plt.get_cmap('tab10')(i % 10) for i, m in enumerate(models)}
    styles = {'tome': '-', 'random': '--'}
    for (model, method), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r['ratio'])
        ax.plot([r['ratio'] for r in rs], [r['metric'] for r in rs], color=colors[model],
                marker='o' if method == 'tome' else 's', linestyle=styles.get(method, ':'),
                label=f'{model} / {method}')
    name = data['results'][0]['metric_name'] if data['results'] else 'metric'
    ax.set_xlabel('token reduction ratio (training-free)')
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
