"""Where a sweep's rows live: ``results.json`` in the out-dir, its lock, the fingerprints that
decide which stored rows a sweep reuses, and the merge of new rows into the file.

Every write happens under an exclusive ``flock`` on ``results.json.lock``: the file is read
again, the new rows replace those with the same key (:func:`~.rows.row_key`), rows of a model
whose fingerprint (checkpoint and config sha256) differs are dropped as stale, and the file is
replaced atomically. So an interrupted sweep keeps what it finished, a second call resumes, and
sweeps writing into one out-dir at the same time keep each other's rows.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import os.path as osp
from typing import Dict, Iterator, Optional, Sequence, Set, Tuple

from amvim_mm.apis.sweep.intervals import add_intervals
from amvim_mm.apis.sweep.methods import IMPORTANCE_METHODS, SEEDED_METHODS, row_is_current
from amvim_mm.apis.sweep.rows import Fingerprint, fingerprint, row_key, set_drops
from amvim_mm.errors import CheckpointError, ConfigError


def strict_json(obj):
    """``obj`` with every float that is not finite (NaN, +-inf; also numpy's) as None, and a
    ``<key>_null_reason`` beside it in its dict: JSON has no NaN, and strict readers (browsers,
    ``jq``, other languages) refuse Python's ``NaN`` token."""
    import math
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out[k] = strict_json(v)
            if out[k] is None and isinstance(v, float) and not math.isfinite(v):
                out.setdefault(f'{k}_null_reason', f'not a finite number ({v})')
        return out
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, 'item') and getattr(obj, 'shape', None) == ():   # numpy scalars
        return strict_json(obj.item())
    return obj


def _write_json(path: str, data) -> None:
    from amvim_mm.engine.fileio import atomic_write_bytes
    atomic_write_bytes(json.dumps(strict_json(data), indent=2, allow_nan=False).encode(), path)


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
    if not isinstance(data, dict) or not isinstance(data.get('results'), list):
        raise ConfigError(f'{path} is not a results file of prune_eval (no "results" list); '
                          'move it away or pick another --out-dir')
    for i, row in enumerate(data['results']):
        problem = _row_problem(row)
        if problem is not None:
            raise ConfigError(f'{path}: row {i} {problem}; fix or delete that row (or move the '
                              'file away) and run again')
    return data


def _row_problem(row) -> Optional[str]:
    """Why a stored row cannot be used (None: it can): the fields of its identity."""
    import math
    if not isinstance(row, dict):
        return f'is a {type(row).__name__}, not an object'
    for key in ('model', 'method'):
        if not isinstance(row.get(key), str):
            return f'has no text {key!r} (got {row.get(key)!r})'
    ratio = row.get('ratio')
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or \
            not (math.isfinite(ratio) and 0 <= ratio < 1):
        return f'has ratio {ratio!r}, not a number in [0, 1)'
    if not isinstance(row.get('precision', 'fp32'), str):
        return f'has precision {row.get("precision")!r}, not a text'
    return None


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


def merge_results(path: str, rows: Sequence[dict], meta: Optional[dict] = None,
                  current: Optional[Dict[str, Fingerprint]] = None,
                  out_dir: Optional[str] = None, replicates: int = 1000,
                  replaceable: Optional[Dict[str, Set[Fingerprint]]] = None
                  ) -> Dict[str, object]:
    """Merge ``rows`` into the results file ``path`` under :func:`results_lock`.

    The file is read again under the lock; a row replaces the one with the same model, method
    and ratio; rows of a model whose fingerprint (checkpoint and config hashes) differs from
    the new rows' (or from ``current[model]``) are stale and removed. ``replaceable``
    (a sweep's :func:`stored_fingerprints` at its start): only rows of those fingerprints may
    be removed as stale; a row of a fingerprint that appeared since was written meanwhile by
    another sweep under the same model name with another checkpoint or config, and the merge
    stops with one line instead of deleting it (two such sweeps used to delete each other's
    rows without a word). ``drop`` is recomputed for all rows and the file replaced
    atomically. Returns the merged results.
    """
    current = dict(current or {})
    for r in rows:
        current[r['model']] = fingerprint(r)
    with results_lock(path):
        data = load_results(path)
        for r in data['results']:
            name = r['model']
            if replaceable is not None and name in current and \
                    fingerprint(r) != current[name] and \
                    fingerprint(r) not in replaceable.get(name, set()):
                raise ConfigError(f'{path}: rows of model {name!r} from another checkpoint or '
                                  'config were written while this sweep ran (another '
                                  'prune_eval into this --out-dir with the same --names?); '
                                  'give this model another name, or run the two one after '
                                  'the other')
        merged = {row_key(r): r for r in data['results']
                  if r['model'] not in current or fingerprint(r) == current[r['model']]}
        merged.update((row_key(r), dict(r)) for r in rows)
        data['results'] = sorted(merged.values(),
                                 key=lambda r: (r['model'], r['method'], float(r['ratio'])))
        set_drops(data['results'])
        if meta is not None:
            data['meta'] = meta
        if out_dir is not None:     # the final pass: bootstrap intervals
            add_intervals(data, out_dir, replicates)
        _write_json(path, data)
    return data


def stored_fingerprints(path: str, names: Sequence[str]) -> Dict[str, Set[Fingerprint]]:
    """The fingerprints of the rows ``path`` holds now for each of ``names`` (read under the
    lock): what a sweep starting now may replace (``merge_results(replaceable=...)``)."""
    with results_lock(path):
        rows = load_results(path)['results']
    out: Dict[str, Set[Fingerprint]] = {n: set() for n in names}
    for r in rows:
        if r['model'] in out:
            out[r['model']].add(fingerprint(r))
    return out


def _reusable(rows: Sequence[dict], prints: Dict[str, Fingerprint],
              out_dir: Optional[str] = None) -> Tuple[Dict[tuple, dict], Dict[str, int]]:
    """Split the stored rows of this sweep's models into reusable ones (same fingerprint,
    computed with the method's current rule and, with ``out_dir``, their per-image statistics
    present there), by key, and a count of stale ones per model name (rows of an older rule
    are recomputed and replaced by key, not counted)."""
    done, stale = {}, {}
    for r in rows:
        name = r['model']
        if name not in prints:
            continue
        if fingerprint(r) == prints[name]:
            if not row_is_current(r):      # recomputed and replaced by key, not stale
                continue
            if out_dir is None or (r.get('stats_file') and
                                   osp.isfile(osp.join(out_dir, r['stats_file']))):
                done[row_key(r)] = r
        else:
            stale[name] = stale.get(name, 0) + 1
    return done, stale


def reusable_rows(path: str, prints: Dict[str, Fingerprint], out_dir: Optional[str] = None
                  ) -> Tuple[Dict[tuple, dict], Dict[str, int]]:
    """:func:`_reusable` of the rows ``path`` holds now (read under the lock)."""
    with results_lock(path):
        rows = load_results(path)['results']
    return _reusable(rows, prints, out_dir)


def older_rule_rows(path: str, prints: Dict[str, Fingerprint]) -> Dict[Tuple[str, str], int]:
    """(model, method) -> the number of this sweep's stored rows computed with an older rule
    of the method (:func:`~.methods.row_is_current`): recomputed and replaced."""
    with results_lock(path):
        rows = load_results(path)['results']
    out: Dict[Tuple[str, str], int] = {}
    for r in rows:
        if r['model'] in prints and fingerprint(r) == prints[r['model']] \
                and not row_is_current(r):
            out[r['model'], r['method']] = out.get((r['model'], r['method']), 0) + 1
    return out


def zero_row(done: Dict[tuple, dict], name: str, precision: str) -> Optional[dict]:
    """The reusable ratio-0 row of model ``name`` at ``precision``, else None."""
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


def stats_name(name: str, method: str, ratio: float, precision: str) -> str:
    """Where a row's per-image statistics go, relative to the out-dir."""
    tag = 'none_0' if ratio == 0 else f'{method}_{ratio:g}'
    return osp.join('per_image', name, f'{tag}_{precision}.npz')
