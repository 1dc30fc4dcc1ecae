"""A sweep's tables and plots, from the merged ``results.json`` data: the rows with their
intervals (:func:`markdown_table`), the architectures (:func:`group_table`), the verdicts
(:func:`verdict_table`); the plots are in :mod:`.plots`, the summary in :mod:`.summary`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from amvim_mm.apis.sweep.rows import zero_of
from amvim_mm.bench.measure import speedup_ceiling


def metric_digits(metric_name: str) -> int:
    """Decimals to print: COCO AP is a fraction, mIoU / top-1 are percentages."""
    return 3 if metric_name.startswith('coco') else 2


def fmt_ci(lo, hi, digits: int) -> str:
    """``[lo, hi]`` with ``digits`` decimals; empty without an interval."""
    return '' if lo is None else f'[{lo:.{digits}f}, {hi:.{digits}f}]'


def differences_table(diffs: Sequence[dict], a: str, b: str, title: str,
                      precision: bool) -> List[str]:
    """Markdown lines of paired differences (``a``/``b``: the keys naming the two sides)."""
    if not diffs:
        return []
    head = ['A', 'B', 'method', 'ratio'] + (['precision'] if precision else []) + [
        'drop A', 'drop B', 'A - B', '95% CI', 'reading']
    lines = ['', title, '', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for d in diffs:
        dg = metric_digits(d['metric_name'])
        cells = [d[a], d[b], d['method'], f"{d['ratio']:.2f}"] + (
            [d['precision']] if precision else []) + [
            f"{d['drop_a']:+.{dg}f}", f"{d['drop_b']:+.{dg}f}",
            f"{d['paired_difference']:+.{dg}f}",
            fmt_ci(d['difference_ci_low'], d['difference_ci_high'], dg), d['reading']]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines


def ceiling_speedup(row: dict, zero: dict) -> Optional[float]:
    """The whole model's speed-up if its backbone ran exactly at the cell's FLOPs ratio: the
    unreduced model's time per image with the backbone's share (timed alone, same batch)
    scaled by ``gflops / gflops at ratio 0``, the rest (data preprocessor, neck, head,
    post-processing, resizes) unchanged. None without both timings at ratio 0."""
    if not (zero.get('img_per_s') and zero.get('img_per_s_model') and row.get('gflops')
            and zero.get('gflops')):
        return None
    return speedup_ceiling(1 / zero['img_per_s_model'], 1 / zero['img_per_s'],
                           row['gflops'] / zero['gflops'])


def _speed_cells(r: dict, z: Optional[dict]) -> List[str]:
    """backbone img/s and speed-up, model img/s and speed-up, ceiling speed-up."""
    def ratio(key):
        return (f'{r[key] / z[key]:.2f}x' if r.get(key) and z is not None and z.get(key)
                else '')
    ceil = None if z is None else ceiling_speedup(r, z)
    return ['' if r.get('img_per_s') is None else f"{r['img_per_s']:.1f}", ratio('img_per_s'),
            '' if r.get('img_per_s_model') is None else f"{r['img_per_s_model']:.1f}",
            ratio('img_per_s_model'), '' if ceil is None else f'{ceil:.2f}x']


def markdown_table(data: Dict[str, object], differences: bool = True) -> str:
    """Every row (checkpoint, method, ratio) with its intervals; with ``differences`` the
    checkpoint-level paired differences below it (:func:`differences_table`)."""
    rows = data['results']
    speed = any(r.get('img_per_s') for r in rows)
    seeded = any(r.get('seed_std') is not None for r in rows)
    head = ['model', 'method', 'ratio', 'realised', 'GFLOPs', 'metric', 'value', 'drop',
            '95% CI', 'drop 95% CI', 'precision']
    if seeded:
        head.append('seed std')
    if speed:     # the backbone alone, the whole model (library's test step), the ceiling
        head += ['backbone img/s', 'backbone x', 'model img/s', 'model x', 'ceiling x']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        dg = metric_digits(r['metric_name'])
        method = r['method']
        if r.get('fine_tuned'):
            how = r['fine_tuned'] if isinstance(r['fine_tuned'], str) else 'fine-tuned'
            method = f"{(r.get('reduction') or {}).get('type', method)} ({how})"
        cells = [r['model'], method, f"{r['ratio']:.2f}", f"{r['realised_ratio']:.3f}",
                 f"{r['gflops']:.3f}", r['metric_name'], f"{r['metric']:.{dg}f}",
                 '' if r.get('drop') is None else f"{r['drop']:+.{dg}f}",
                 fmt_ci(r.get('ci_low'), r.get('ci_high'), dg),
                 fmt_ci(r.get('drop_ci_low'), r.get('drop_ci_high'), dg),
                 r.get('precision', 'fp32')]
        if seeded:
            cells.append('' if r.get('seed_std') is None else f"{r['seed_std']:.{dg}f}")
        if speed:
            cells += _speed_cells(r, zero_of(rows, r))
        lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
    if differences:
        lines += differences_table(
            data.get('paired_differences') or [], 'model_a', 'model_b',
            'Paired differences of the drops, checkpoint level (model A - model B, these '
            'checkpoints on the same images; > 0: A loses less; unadjusted, no architecture '
            'verdict):', precision=True)
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
        dg = metric_digits(e['metric_name'])
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
            f"{fmt_ci(e['ci_low'], e['ci_high'], dg)} | "
            f"{'' if e['drop'] is None else format(e['drop'], f'+.{dg}f')} | "
            f"{fmt_ci(e['drop_ci_low'], e['drop_ci_high'], dg)} | "
            f"{'' if rel is None else format(rel, '+.1f')} | "
            f"{fmt_ci(e.get('relative_drop_ci_low'), e.get('relative_drop_ci_high'), 1)} | "
            f"{' / '.join(format(m, f'.{dg}f') for m in e['metric_models'])} |")
    return '\n'.join(lines)


def decided_verdicts(data: Dict[str, object]) -> List[dict]:
    """The architecture differences that have a verdict (a p value): the AUCs', then the
    cells'."""
    return [d for d in (data.get('group_auc_differences') or [])
            + (data.get('group_paired_differences') or []) if d.get('p') is not None]


def _p(p) -> str:
    if p is None:
        return ''
    return '<0.001' if p < 0.001 else f'{p:.3f}'


def _level(diffs: Sequence[dict]) -> str:
    """The levels of the verdicts' intervals, for the table's heading."""
    levels = sorted({d['ci_level'] for d in diffs if d.get('ci_level') is not None})
    if not levels:
        return ''
    pct = [f'{100 * v:.2f}'.rstrip('0').rstrip('.') for v in (levels[0], levels[-1])]
    return pct[0] + ' %' if pct[0] == pct[1] else f'{pct[0]}-{pct[1]} %'


def verdict_table(data: Dict[str, object]) -> str:
    """The verdicts: the robustness AUC per architecture and method, the AUC differences of
    every pair of architectures, then the drop differences per cell (> 0: A loses less; one
    Holm family for all of them; each interval at the level of its verdict). Architectures are
    the groups, or the models without groups; with one trained model on a side there is no
    architecture verdict, and the table says so."""
    aucs = data.get('group_auc') or []
    auc_diffs = data.get('group_auc_differences') or []
    diffs = data.get('group_paired_differences') or []
    if not (aucs or diffs):
        return ''
    lines = []
    decided = decided_verdicts(data)
    if aucs:
        name = aucs[0]['metric_name']
        dg = metric_digits(name)
        lines += [f'Robustness AUC: the mean drop of {name} over the kept-token range (no '
                  'reduction to the largest ratio); 95 % intervals over training seeds and '
                  'images:', '',
                  '| architecture | method | ratios | AUC drop | 95% CI | AUC relative drop % '
                  '| 95% CI |', '|' + '---|' * 7]
        for e in aucs:
            rel = e.get('auc_relative_drop')
            lines.append(
                f"| {e['group']} | {e['method']} | {', '.join(f'{r:g}' for r in e['ratios'])} | "
                f"{e['auc_drop']:+.{dg}f} | "
                f"{fmt_ci(e['auc_drop_ci_low'], e['auc_drop_ci_high'], dg)} | "
                f"{'' if rel is None else format(rel, '+.1f')} | "
                f"{fmt_ci(e['auc_relative_drop_ci_low'], e['auc_relative_drop_ci_high'], 1)} |")
    if (auc_diffs or diffs) and not decided:
        lines += ['', 'No architecture verdicts: every architecture here has one trained model '
                  '(a single checkpoint says nothing about its architecture). Give each '
                  'architecture two or more training seeds with --groups; the paired '
                  'differences of the checkpoints are in checkpoint_differences.md.']
    elif decided:
        n, m = decided[0]['family_size'], decided[0]['margin']
        family = (f'Holm over {n} comparisons (the AUCs and the cells together); intervals at '
                  f'the level of each verdict ({_level(decided)}: Bonferroni at the comparison\'s '
                  f'Holm step), so an interval excludes 0 exactly when its verdict is "loses '
                  f'less / more"; equivalence margin +-{m:g}')
        lines += ['', f'Verdicts: {family}.']
    if auc_diffs and decided:
        dg = metric_digits(auc_diffs[0]['metric_name'])
        lines += ['', 'AUC differences (A - B over the kept range both cover; > 0: A loses '
                  'less):', '',
                  '| A | B | method | kept range | A - B | CI | p (Holm) | detectable | verdict |',
                  '|' + '---|' * 9]
        for d in auc_diffs:
            lo, hi = d['kept_range']
            det = d.get('detectable')
            lines.append(
                f"| {d['group_a']} | {d['group_b']} | {d['method']} | {lo:g}-{hi:g} | "
                f"{d['auc_difference']:+.{dg}f} | "
                f"{fmt_ci(d['difference_ci_low'], d['difference_ci_high'], dg)} | "
                f"{_p(d['p_holm'])} | {'' if det is None else format(det, f'.{dg}f')} | "
                f"{d['reading']} |")
    if diffs and decided:
        dg = metric_digits(diffs[0]['metric_name'])
        lines += ['', 'Drop differences per cell (A - B; > 0: A loses less; relative drops in % '
                  'of each model\'s own unreduced metric):', '',
                  '| A | B | method | ratio | drop A | drop B | A - B | CI | rel. A % | '
                  'rel. B % | p (Holm) | verdict |', '|' + '---|' * 12]
        for d in diffs:
            ra, rb = d.get('relative_drop_a'), d.get('relative_drop_b')
            lines.append(
                f"| {d['group_a']} | {d['group_b']} | {d['method']} | {d['ratio']:.2f} | "
                f"{d['drop_a']:+.{dg}f} | {d['drop_b']:+.{dg}f} | "
                f"{d['paired_difference']:+.{dg}f} | "
                f"{fmt_ci(d['difference_ci_low'], d['difference_ci_high'], dg)} | "
                f"{'' if ra is None else format(ra, '+.1f')} | "
                f"{'' if rb is None else format(rb, '+.1f')} | {_p(d['p_holm'])} | "
                f"{d['reading']} |")
    basis = (aucs or diffs)[0]['basis']
    lines += ['', f'Intervals of the architectures over {basis}.']
    return '\n'.join(lines)
