"""A sweep's summary for a reader or a paper, from the merged ``results.json`` data:
``summary.md`` (:func:`summary_markdown`): the verdicts first (the robustness AUC per
architecture and each architecture's AUC minus the first one's), then every cell, then what
each interval rests on, with the per-architecture and per-checkpoint tables folded below.
The checkpoint-level paired differences (one pair of checkpoints on the same images, no
architecture claim) go to their own file (:func:`checkpoint_differences`), in the verdicts'
words. ``tools/prune_eval.py`` writes both per run; the demo's summary is one section per task.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from amvim_mm.apis.sweep.report import (decided_verdicts, differences_table, fmt_ci,
                                        group_table, markdown_table, metric_digits)


def architectures(data: Dict[str, object]) -> List[str]:
    """The architectures in the sweep's order: its groups, or its models without groups."""
    meta = data.get('meta') or {}
    if meta.get('groups'):
        return list(dict.fromkeys(meta['groups'].values()))
    present = list(dict.fromkeys(e['group'] for e in data.get('group_results') or []))
    return [m for m in meta.get('models') or present if m in present] or present


def _other_minus_first(d: dict, dg: int) -> str:
    """A verdict row (first architecture A minus another B) as B - A, with its reading."""
    value = d['auc_difference'] if 'auc_difference' in d else d['paired_difference']
    lo, hi = d.get('difference_ci_low'), d.get('difference_ci_high')
    ci = '' if lo is None else fmt_ci(-hi, -lo, dg) + ' '
    return f"{-value:+.{dg}f} {ci}{d['reading']}"


def _drop(e: dict, dg: int) -> str:
    """A drop with its relative drop; empty without the ratio-0 row it is measured from."""
    if e.get('drop') is None:
        return ''
    rel = e.get('relative_drop')
    return f"{e['drop']:+.{dg}f}" + ('' if rel is None else f' ({rel:+.1f})')


def _metric(data: Dict[str, object], metric: Optional[str]) -> str:
    rows = data.get('group_results') or data.get('results') or [{}]
    return metric or rows[0].get('metric_name', 'metric')


def auc_table(data: Dict[str, object], groups: Optional[Sequence[str]] = None,
              metric: Optional[str] = None) -> str:
    """Per method: every architecture's robustness AUC (mean drop over the kept-token range,
    interval over training seeds and images) and each other architecture's AUC minus the first
    one's with its Holm-adjusted verdict (interval at the verdict's level)."""
    groups = list(groups or architectures(data))
    a, others = groups[0], groups[1:]
    aucs = {(e['group'], e['method']): e for e in data.get('group_auc') or []}
    if not aucs:
        return ''
    dg = metric_digits(next(iter(aucs.values()))['metric_name'])
    diffs = {(d['group_b'], d['method']): d for d in data.get('group_auc_differences') or []
             if d['group_a'] == a}
    head = (['method'] + [f'{g} AUC drop [95% CI]' for g in groups]
            + [f'{g} - {a} [CI] verdict' for g in others])
    lines = ['| ' + ' | '.join(head) + ' |', '|---' * len(head) + '|']
    for method in sorted({m for (_, m) in aucs}):
        es = [aucs.get((g, method)) for g in groups]
        if any(e is None for e in es):
            continue
        cells = [method] + [
            f"{e['auc_drop']:+.{dg}f} {fmt_ci(e['auc_drop_ci_low'], e['auc_drop_ci_high'], dg)}"
            for e in es]
        cells += ['' if diffs.get((g, method)) is None else
                  _other_minus_first(diffs[(g, method)], dg) for g in others]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def cell_table(data: Dict[str, object], groups: Optional[Sequence[str]] = None,
               metric: Optional[str] = None) -> str:
    """Per cell: every architecture's mean over its checkpoints with the 95 % interval, its
    drop and relative drop (% of its own unreduced metric), and each other architecture's drop
    minus the first one's with its interval and Holm-adjusted verdict (> 0: it loses less)."""
    groups = list(groups or architectures(data))
    a, others = groups[0], groups[1:]
    entries = {(e['group'], e['method'], e['ratio']): e for e in data['group_results']}
    if not entries:
        return ''
    dg = metric_digits(next(iter(entries.values()))['metric_name'])
    name = _metric(data, metric)
    diffs = {(d['group_b'], d['method'], d['ratio']): d
             for d in data.get('group_paired_differences') or [] if d['group_a'] == a}
    head = (['method', 'ratio', 'realised'] + [f'{g} {name} [95% CI]' for g in groups]
            + [f'{g} drop (rel. %)' for g in groups]
            + [f'{g} - {a} drop [CI] verdict' for g in others])
    lines = ['| ' + ' | '.join(head) + ' |', '|---' * len(head) + '|']
    keys = sorted({(m, r) for (_, m, r) in entries}, key=lambda k: (k[1] != 0, k[0], k[1]))
    shown_zero = False
    for method, ratio in keys:
        es = [entries.get((g, method, ratio)) for g in groups]
        if any(e is None for e in es):
            continue
        if ratio == 0:
            if shown_zero:
                continue
            shown_zero, method = True, 'none'
        cells = [method, f'{ratio:.2f}', f"{es[0]['realised_ratio']:.3f}"]
        cells += [f"{e['metric']:.{dg}f} {fmt_ci(e['ci_low'], e['ci_high'], dg)}" for e in es]
        cells += [_drop(e, dg) for e in es]
        cells += ['' if diffs.get((g, method, ratio)) is None else
                  _other_minus_first(diffs[(g, method, ratio)], dg) for g in others]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def verdict_family(data: Dict[str, object]) -> str:
    """One sentence: the Holm family of the verdicts and the level of their intervals."""
    decided = decided_verdicts(data)
    if not decided:
        return ('no architecture verdicts: each architecture has one trained checkpoint here '
                '(give each two or more training seeds with --groups)')
    levels = sorted({round(100 * d['ci_level'], 2) for d in decided})
    span = f'{levels[0]:g}' + ('' if levels[0] == levels[-1] else f'-{levels[-1]:g}')
    return (f'one Holm family of {len(decided)} comparisons: the AUCs and all cells; each '
            f"difference's CI at the level of its verdict, {span} %, so it excludes 0 exactly "
            f'when the verdict is "loses less / more"; equivalence margin '
            f"+-{decided[0]['margin']:g}")


def _bases(data: Dict[str, object]) -> List[str]:
    """What each interval rests on, one bullet per kind of interval."""
    meta = data.get('meta') or {}
    boot = meta.get('bootstrap') or {}
    basis = sorted({e['basis'] for e in (data.get('group_results') or []) if e.get('basis')})
    lines = [f"- Per checkpoint: 95 % paired bootstrap over the validation "
             f"images ({boot.get('replicates', '?')} replicates, one resampling shared by "
             'every row).']
    if basis:
        lines.append(f"- Per architecture (AUC and cell tables): 95 % over {'; '.join(basis)}.")
    if decided_verdicts(data):
        lines.append('- Architecture differences (the verdict columns): paired over the images, '
                     'over training seeds per architecture (Welch t), at the level of each '
                     'verdict\'s Holm step.')
    return lines


def summary_lines(data: Dict[str, object], title: str, metric: Optional[str] = None,
                  groups: Optional[Sequence[str]] = None, heading: str = '##',
                  checkpoints: bool = True) -> List[str]:
    """A sweep's section of a summary (markdown lines): verdicts, AUC, cells, what the
    intervals rest on, the per-architecture (and with ``checkpoints`` the per-checkpoint)
    tables folded."""
    lines = [f'{heading} {title}', '', f'Verdicts: {verdict_family(data)}.', '']
    aucs = auc_table(data, groups, metric)
    if aucs:
        lines += ['Robustness AUC (mean drop over the kept-token range; AUC differences over '
                  'the range both architectures cover):', '', aucs, '']
    if data.get('group_results'):
        lines += ['Per cell:', '', cell_table(data, groups, metric), '']
    lines += ['What the intervals rest on:', '', *_bases(data), '']
    if group_table(data):
        lines += ['<details><summary>per architecture</summary>', '', group_table(data), '',
                  '</details>', '']
    if checkpoints:
        lines += ['<details><summary>per checkpoint</summary>', '',
                  markdown_table(data, differences=False), '', '</details>', '']
    return lines


def summary_markdown(data: Dict[str, object], title: str = 'prune_eval',
                     command: Optional[str] = None) -> str:
    """``summary.md`` of one sweep (``command``: how it was run, shown under the title)."""
    meta = data.get('meta') or {}
    lines = summary_lines(data, title, heading='#')
    intro = [f'Run: `{command}`', ''] if command else []
    intro.append(f"Protocol: {meta.get('protocol', '')}; FLOPs: {meta.get('convention', '')}.")
    return '\n'.join(lines[:2] + intro + [''] + lines[2:])


def checkpoint_differences(data: Dict[str, object]) -> str:
    """The checkpoint-level paired differences (``paired_differences``) as markdown, in the
    verdicts' words but unadjusted: statements about two checkpoints on these images."""
    diffs = data.get('paired_differences') or []
    if not diffs:
        return ''
    return '\n'.join(['# Checkpoint-level differences', ''] + differences_table(
        diffs, 'model_a', 'model_b',
        'Each pair of checkpoints on the same images (A - B of their drops; > 0: A loses '
        'less). 95 % paired bootstrap intervals over the images, not adjusted for the '
        f'{len(diffs)} comparisons, no architecture verdict: training seeds of one '
        'architecture differ here by chance (summary.md has the verdicts).', precision=True)
        [1:])
