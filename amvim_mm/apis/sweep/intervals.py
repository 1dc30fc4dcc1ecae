"""A sweep's statistics (the final pass over ``results.json``): every row's intervals over
images, the models' paired differences, and per architecture the mean over its checkpoints,
the verdicts of each pair and the robustness AUC (``docs/statistics.md``; the functions of
:mod:`amvim_mm.analysis.stats` and :mod:`amvim_mm.analysis.verdicts` do the arithmetic).
"""
from __future__ import annotations

import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

from amvim_mm.apis.sweep.rows import row_key, zero_of
from amvim_mm.errors import ConfigError, first_line

#: how far a row's stored metric may lie from its statistics' value (it is stored rounded to
#: 4 decimals)
EDIT_TOLERANCE = 1e-3
#: why a relative drop is null (results.json is strict JSON: no NaN)
ZERO_BASELINE = 'the unreduced metric is 0: no relative drop'


class _Values:
    """Per row: (bootstrap replicates over images (R,), image keys, point value), the metric
    recomputed from its per-image statistics (mean over pruning seeds); None without them.
    Cached per row key; one set of resampled images per data set, shared by every row."""

    def __init__(self, out_dir: str, replicates: int, seed: int):
        self.out_dir, self.replicates, self.seed = out_dir, replicates, seed
        self.weights: Dict[tuple, object] = {}
        self.values: Dict[tuple, Optional[Tuple[object, tuple, float]]] = {}

    def __call__(self, r: Optional[dict]):
        import numpy as np

        from amvim_mm.analysis import stats as S
        if r is None:
            return None
        k = row_key(r)
        if k not in self.values:
            f = r.get('stats_file')
            self.values[k] = None
            if f and osp.isfile(osp.join(self.out_dir, f)):
                per_seed, keys = _read_stats(osp.join(self.out_dir, f))
                keys = tuple(keys)
                if keys not in self.weights:
                    self.weights[keys] = S.bootstrap_weights(len(keys), self.replicates,
                                                             self.seed)
                point = float(S.mean_over_seeds(per_seed, np.ones((1, len(keys))))[0])
                self.values[k] = (S.mean_over_seeds(per_seed, self.weights[keys]), keys, point)
        return self.values[k]


def _read_stats(path: str):
    """A row's per-image statistics file, or a one-line error naming it."""
    from amvim_mm.analysis import stats as S
    try:
        return S.loads(path)
    except Exception as err:     # BadZipFile, EOFError, KeyError, ValueError of a bad file
        raise ConfigError(f'{path}: the per-image statistics file is unreadable '
                          f'({type(err).__name__}: {first_line(err)}); delete it and its row in '
                          'results.json to evaluate that cell again') from None


def add_intervals(data: Dict[str, object], out_dir: str, replicates: int = 1000,
                  level: float = 0.95, seed: int = 0) -> None:
    """Fill every row's intervals over images (metric, drop, relative drop), the models'
    ``paired_differences`` (over images) and, per architecture (``meta.groups``; every model
    is its own group without them), the verdicts of :func:`_group_verdicts` (see the module
    docstring)."""
    rows = data['results']
    vals = _Values(out_dir, replicates, seed)
    for r in rows:
        _row_intervals(r, rows, vals, level)
    order = list((data.get('meta') or {}).get('models') or [])
    models = list(dict.fromkeys(order + [r['model'] for r in rows]))
    models = [m for m in models if any(r['model'] == m for r in rows)]
    data['paired_differences'] = _paired_differences(rows, models, vals, level)
    meta = data.get('meta') or {}
    groups = meta.get('groups') or {m: m for m in models}
    _group_verdicts(data, groups, vals, level, meta.get('margin'))


def _row_intervals(r: dict, rows: Sequence[dict], vals: _Values, level: float) -> None:
    """A row's intervals over images: metric, drop and relative drop (None where its
    statistics or those of its ratio-0 row on the same images are missing)."""
    import numpy as np

    from amvim_mm.analysis import stats as S
    for f in ('ci_low', 'ci_high', 'drop_ci_low', 'drop_ci_high', 'relative_drop',
              'relative_drop_ci_low', 'relative_drop_ci_high'):
        r[f] = None
    r.pop('relative_drop_reason', None)
    v = vals(r)
    if v is None:
        return
    if r.get('metric') is not None and not abs(float(r['metric']) - v[2]) <= EDIT_TOLERANCE:
        raise ConfigError(f'{r["model"]} {r["method"]} {r["ratio"]}: results.json says metric '
                          f'{r["metric"]} but its per-image statistics ({r.get("stats_file")}) '
                          f'give {v[2]:.4f}: one of them was changed after the evaluation; '
                          'delete the row and its statistics file to evaluate the cell again')
    r['ci_low'], r['ci_high'] = S.interval(v[0], level)
    z = zero_of(rows, r)
    v0 = vals(z)
    if v0 is None or v0[1] != v[1]:
        return
    r['drop_ci_low'], r['drop_ci_high'] = S.interval(v[0] - v0[0], level)
    if v0[2] == 0:
        r['relative_drop_reason'] = ZERO_BASELINE
        return
    r['relative_drop'] = round(100 * (v[2] - v0[2]) / v0[2], 4)
    with np.errstate(invalid='ignore', divide='ignore'):
        rel = 100 * (v[0] - v0[0]) / v0[0]
    rel[~np.isfinite(rel)] = np.nan       # replicates whose unreduced metric is 0: left out
    r['relative_drop_ci_low'], r['relative_drop_ci_high'] = S.interval(rel, level)


def _paired_differences(rows: Sequence[dict], models: Sequence[str], vals: _Values,
                        level: float) -> List[dict]:
    """Per pair of models and cell: the difference of their drops, paired over images."""
    from amvim_mm.analysis import stats as S
    pairs = []
    for i, a in enumerate(models):
        for b in models[i + 1:]:
            for ra in rows:
                if ra['model'] != a or float(ra['ratio']) == 0.0 or ra.get('drop') is None:
                    continue
                rb = next((x for x in rows
                           if x['model'] == b and row_key(x)[1:] == row_key(ra)[1:]), None)
                if rb is None or rb.get('drop') is None:
                    continue
                va, vb = vals(ra), vals(rb)
                v0a, v0b = vals(zero_of(rows, ra)), vals(zero_of(rows, rb))
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
    return pairs


def _group_verdicts(data, groups: Dict[str, str], vals: _Values, level: float,
                    margin: Optional[float]) -> None:
    """Per architecture (a group of checkpoints, e.g. one per training seed) and cell: the
    mean metric, drop and relative drop over its checkpoints with intervals over training seeds
    and images (``group_results``, :func:`amvim_mm.analysis.verdicts.estimate`); per
    architecture and method the robustness AUC, the mean drop over the kept-token range
    (``group_auc``); per pair of architectures the difference of their drops per cell
    (``group_paired_differences``) and of their AUCs over the kept range both cover
    (``group_auc_differences``), each with a verdict (:func:`~amvim_mm.analysis.verdicts.compare`;
    **one Holm family** for the cells and the AUCs of the report, so the whole report holds the
    level). Fewer than two checkpoints on a side: no architecture verdict. ``margin`` (None:
    the metric's default) is the equivalence margin of the drops and AUCs."""
    from amvim_mm.analysis import verdicts as V
    rows = data['results']
    models = data['meta'].get('models') or list(groups)
    order = list(dict.fromkeys(groups[m] for m in models if m in groups))
    members = {g: [m for m in models if groups.get(m) == g] for g in order}
    cells = sorted({row_key(r)[1:] for r in rows if r['model'] in groups})
    out, per = [], {}
    for g in order:
        for cell in cells:
            entry = _group_entry(rows, g, members[g], cell, vals, level, per)
            if entry is not None:
                out.append(entry)
    data['group_results'] = out
    margin_of = (lambda name: margin) if margin else V.default_margin    # noqa: E731
    diffs = _group_differences(order, cells, per, out, level, margin_of)
    entries, auc_diffs = _group_auc(data, order, per, level, margin_of)
    V.decide([c for _, c in diffs + auc_diffs], alpha=1 - level)
    data['group_paired_differences'] = [dict(row, **_rounded(c, 'paired_difference', row))
                                        for row, c in diffs]
    data['group_auc'] = entries
    data['group_auc_differences'] = [dict(row, **_rounded(c, 'auc_difference', row))
                                     for row, c in auc_diffs]


def _group_entry(rows: Sequence[dict], g: str, members: Sequence[str], cell: tuple,
                 vals: _Values, level: float, per: dict) -> Optional[dict]:
    """Architecture ``g``'s entry of ``group_results`` for ``cell`` (None unless every member
    has a row there); records in ``per[(g, cell)]`` the replicates its verdicts use."""
    import numpy as np

    from amvim_mm.analysis import verdicts as V
    rs = [next((r for r in rows if r['model'] == m and row_key(r)[1:] == cell), None)
          for m in members]
    if any(r is None for r in rs):
        return None
    entry = dict(group=g, models=members, method=cell[0], ratio=cell[1],
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
    v0s = [vals(zero_of(rows, r)) for r in rs]
    keys = {v[1] for v in vs + v0s if v is not None}
    if None in vs or len(keys) != 1:
        return entry
    X, B = np.array([v[2] for v in vs]), np.stack([v[0] for v in vs])
    est = V.estimate(X, B, level)
    entry.update(metric=round(est['value'], 4), ci_low=round(est['ci_low'], 4),
                 ci_high=round(est['ci_high'], 4), basis=est['basis'])
    if None in v0s:
        return entry
    X0, B0 = np.array([v[2] for v in v0s]), np.stack([v[0] for v in v0s])
    quantities = dict(drop=(X - X0, B - B0))
    if np.all(X0 != 0):
        with np.errstate(invalid='ignore', divide='ignore'):
            quantities['relative_drop'] = (100 * (X - X0) / X0, 100 * (B - B0) / B0)
    else:
        entry['relative_drop_reason'] = ZERO_BASELINE
    for name, (x, b) in quantities.items():
        e = V.estimate(x, b, level)
        entry.update({name: round(e['value'], 4), f'{name}_ci_low': round(e['ci_low'], 4),
                      f'{name}_ci_high': round(e['ci_high'], 4)})
    per[(g, cell)] = dict(quantities, metric0=(X0, B0), keys=next(iter(keys)),
                          kept=1.0 - float(rs[0]['realised_ratio']))
    return entry


def _group_differences(order: Sequence[str], cells: Sequence[tuple], per: dict,
                       out: Sequence[dict], level: float, margin_of) -> List[tuple]:
    """Per pair of architectures and cell: (the row's fields, the comparison of their drops
    before the family's adjustment)."""
    from amvim_mm.analysis import verdicts as V
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
                ea = next(e for e in out if e['group'] == a and
                          (e['method'], e['ratio'], e['precision']) == cell)
                eb = next(e for e in out if e['group'] == b and
                          (e['method'], e['ratio'], e['precision']) == cell)
                row = dict(group_a=a, group_b=b, method=cell[0], ratio=cell[1],
                           precision=cell[2], metric_name=name, drop_a=ea['drop'],
                           drop_b=eb['drop'], relative_drop_a=ea['relative_drop'],
                           relative_drop_b=eb['relative_drop'], relative_difference=None,
                           relative_difference_ci_low=None, relative_difference_ci_high=None)
                if 'relative_drop' in pa and 'relative_drop' in pb:
                    rel = V.compare(*pa['relative_drop'], *pb['relative_drop'], margin=1.0,
                                    level=level)
                    row['relative_difference'] = round(rel['difference'], 4)
                    if rel['ci_low'] is not None:    # unadjusted: a description, no verdict
                        row['relative_difference_ci_low'] = round(rel['ci_low'], 4)
                        row['relative_difference_ci_high'] = round(rel['ci_high'], 4)
                diffs.append((row, c))
    return diffs


def _r(v, digits: int = 4):
    return None if v is None else round(v, digits)


def _rounded(c: dict, name: str, row: dict) -> dict:
    """A decided :func:`~amvim_mm.analysis.verdicts.compare` result as row fields (``name``
    for the difference), with its reading (the sides named as in ``row``)."""
    out = {name: round(c['difference'], 4), 'difference_ci_low': _r(c['ci_low']),
           'difference_ci_high': _r(c['ci_high']), 'ci_level': _r(c['ci_level'], 6),
           'se': _r(c['se']), 'df': _r(c['df'], 2), 'p': c['p'],
           'p_equivalence': c['p_equivalence'], 'p_holm': c['p_holm'],
           'p_equivalence_holm': c['p_equivalence_holm'], 'margin': c['margin'],
           'detectable': _r(c['detectable']), 'seeds': list(c['seeds']),
           'verdict': c['verdict'], 'family_size': c['family_size'],
           'adjustment': c['adjustment'], 'basis': c['basis']}
    return dict(out, reading=_verdict_text(c, row['group_a'], row['group_b']))


def _verdict_text(c: dict, a: str, b: str) -> str:
    """One line for a verdict of :func:`~amvim_mm.analysis.verdicts.decide`."""
    v = c['verdict']
    if v == 'A loses less':
        return f'{a} loses less than {b}'
    if v == 'A loses more':
        return f'{a} loses more than {b}'
    if v == 'equivalent':
        return f'equivalent within +-{c["margin"]:g}'
    if v == 'inconclusive':
        return f'inconclusive (detectable: {c["detectable"]:.3g})'
    return 'one trained model: no architecture verdict'


def _group_auc(data, order: Sequence[str], per: dict, level: float,
               margin_of) -> Tuple[List[dict], List[tuple]]:
    """``group_auc`` entries and the AUC comparisons (row fields, comparison before the
    family's adjustment): per pair over the kept-token range both curves cover (the curves
    interpolated at its lower end), so two architectures whose realised ratios differ are
    averaged over the same range."""
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
            if len(set(kept)) < 2:
                continue
            X0, B0 = zero['metric0']
            names = ['drop'] + (['relative_drop'] if all('relative_drop' in p
                                                        for _, p in pts) else [])
            curve = {k: ([np.zeros_like(X0)] + [p[k][0] for _, p in pts],
                         [np.zeros_like(B0)] + [p[k][1] for _, p in pts]) for k in names}
            curves[(g, method, precision)] = (kept, curve, zero['keys'])
            aucs = {k: (V.robustness_auc(kept, np.stack(x)), V.robustness_auc(kept, np.stack(b)))
                    for k, (x, b) in curve.items()}
            e_drop = V.estimate(*aucs['drop'], level)
            entry = dict(
                group=g, method=method, precision=precision,
                metric_name=next(e['metric_name'] for e in data['group_results']
                                 if e['group'] == g),
                ratios=[r for r, _ in pts], kept=[round(k, 4) for k in kept],
                auc_drop=round(e_drop['value'], 4), auc_drop_ci_low=round(e_drop['ci_low'], 4),
                auc_drop_ci_high=round(e_drop['ci_high'], 4), auc_relative_drop=None,
                auc_relative_drop_ci_low=None, auc_relative_drop_ci_high=None,
                basis=e_drop['basis'])
            if 'relative_drop' in aucs:
                e_rel = V.estimate(*aucs['relative_drop'], level)
                entry.update(auc_relative_drop=round(e_rel['value'], 4),
                             auc_relative_drop_ci_low=round(e_rel['ci_low'], 4),
                             auc_relative_drop_ci_high=round(e_rel['ci_high'], 4))
            else:
                entry['auc_relative_drop_reason'] = ZERO_BASELINE
            entries.append(entry)
    diffs = []
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            for (g, method, precision), (kept_a, curve_a, keys) in curves.items():
                other = curves.get((b, method, precision))
                if g != a or other is None or other[2] != keys:
                    continue
                kept_b, curve_b, _ = other
                ea = next(e for e in entries if (e['group'], e['method'], e['precision']) ==
                          (a, method, precision))
                eb = next(e for e in entries if (e['group'], e['method'], e['precision']) ==
                          (b, method, precision))
                if ea['ratios'] != eb['ratios']:
                    continue      # other ratios: another protocol
                lowest = max(min(kept_a), min(kept_b))

                def auc(kept, curve):
                    x, bt = curve['drop']
                    return (V.robustness_auc(kept, np.stack(x), lowest),
                            V.robustness_auc(kept, np.stack(bt), lowest))
                (xa, ba), (xb, bb) = auc(kept_a, curve_a), auc(kept_b, curve_b)
                c = V.compare(xa, ba, xb, bb, margin=margin_of(ea['metric_name']), level=level)
                diffs.append((dict(group_a=a, group_b=b, method=method, precision=precision,
                                   metric_name=ea['metric_name'],
                                   auc_drop_a=round(float(np.mean(xa)), 4),
                                   auc_drop_b=round(float(np.mean(xb)), 4),
                                   kept_range=[round(lowest, 4), 1.0]), c))
    return entries, diffs


def _reading(a: str, b: str, lo: Optional[float], hi: Optional[float]) -> str:
    """What the interval of ``a``'s drop minus ``b``'s says about these two checkpoints on
    these images (a checkpoint-level reading, not an architecture verdict)."""
    if lo is not None and lo > 0:
        return f'{a} loses less than {b} (these checkpoints, unadjusted)'
    if hi is not None and hi < 0:
        return f'{a} loses more than {b} (these checkpoints, unadjusted)'
    return 'inconclusive (these checkpoints: the interval contains 0)'
