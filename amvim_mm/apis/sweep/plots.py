"""A sweep's plots, from the merged ``results.json`` data: metric against realised ratio
(:func:`plot`; per architecture with its checkpoints drawn thin when the sweep has groups) and
every architecture difference with its interval (:func:`plot_forest`).

Each PNG carries what it draws as a text chunk (``amvim_mm:drawn``, JSON; read it with
:func:`drawn`), so a reader or a test checks a plot against the tables without reading
pixels.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence, Tuple

from amvim_mm.apis.sweep.report import decided_verdicts

#: the PNG text chunk holding what a plot draws
DRAWN_KEY = 'amvim_mm:drawn'
_STYLES = {'tome': ('-', 'o'), 'random': ('--', 's'), 'evit': (':', '^'), 'top': ('-.', 'D')}


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str, drawn: dict) -> str:
    """Write ``fig`` to ``path`` (PNG) with ``drawn`` in its text chunk; legends outside the
    axes are kept (``bbox_inches='tight'``)."""
    fig.savefig(path, bbox_inches='tight', metadata={DRAWN_KEY: json.dumps(drawn)})
    _pyplot().close(fig)
    return path


def drawn(path: str) -> dict:
    """What :func:`plot` / :func:`plot_forest` drew into the PNG at ``path``."""
    from PIL import Image
    with Image.open(path) as im:
        return json.loads(im.text[DRAWN_KEY])


def _groups_of(data: Dict[str, object]) -> Dict[str, List[str]]:
    """Architecture -> its models, in the sweep's order; empty without groups."""
    groups = (data.get('meta') or {}).get('groups') or {}
    out: Dict[str, List[str]] = {}
    for model, group in groups.items():
        out.setdefault(group, []).append(model)
    return out


def _ci_bounds(items: Sequence[dict]) -> Tuple[List[float], List[float]]:
    """``ci_low`` / ``ci_high`` of every item (the value itself where absent)."""
    return ([r['ci_low'] if r.get('ci_low') is not None else r['metric'] for r in items],
            [r['ci_high'] if r.get('ci_high') is not None else r['metric'] for r in items])


def plot(data: Dict[str, object], path: str) -> str:
    """Metric against realised ratio. Without groups: one line per model and method with its
    95 % interval over images as error bars. With groups (training seeds of an architecture):
    one panel per method, each architecture's mean over its checkpoints as a thick line with
    its 95 % interval (over training seeds and images) as a band, its checkpoints as thin
    lines; the legend outside the axes."""
    if _groups_of(data) and data.get('group_results'):
        return _plot_groups(data, path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=120)
    series: Dict[Tuple[str, str, str], List[dict]] = {}
    for r in data['results']:
        series.setdefault((r['model'], r['method'], r.get('precision', 'fp32')), []).append(r)
    models = sorted({m for m, _, _ in series})
    colors = {m: plt.get_cmap('tab10')(i % 10) for i, m in enumerate(models)}
    lines = []
    for (model, method, prec), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r['realised_ratio'])
        x, y = [r['realised_ratio'] for r in rs], [r['metric'] for r in rs]
        lo, hi = _ci_bounds(rs)
        ls, mk = _STYLES.get(method, (':', 'x'))
        label = f'{model} / {method}' + ('' if prec == 'fp32' else f' / {prec}')
        ax.errorbar(x, y, yerr=[[max(0.0, v - a) for v, a in zip(y, lo)],
                                [max(0.0, b - v) for v, b in zip(y, hi)]],
                    color=colors[model], marker=mk, linestyle=ls, capsize=2, label=label)
        lines.append(dict(label=label, x=x, y=y, low=lo, high=hi))
    name = data['results'][0]['metric_name'] if data['results'] else 'metric'
    ax.set_xlabel('realised token reduction ratio (training-free)')
    ax.set_ylabel(f'{name} (95% bootstrap CI over images)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path, dict(kind='per model', lines=lines))


def _plot_groups(data: Dict[str, object], path: str) -> str:
    """:func:`plot` with groups."""
    plt = _pyplot()
    entries = data['group_results']
    members = _groups_of(data)
    methods = list(dict.fromkeys(e['method'] for e in entries))
    groups = [g for g in members if any(e['group'] == g for e in entries)]
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.4), dpi=120,
                             sharey=True, squeeze=False)
    colors = {g: plt.get_cmap('tab10')(i % 10) for i, g in enumerate(groups)}
    lines = []
    for ax, method in zip(axes[0], methods):
        for g in groups:
            es = sorted((e for e in entries if e['group'] == g and e['method'] == method),
                        key=lambda e: e['realised_ratio'])
            if not es:
                continue
            for model in members[g]:
                rs = sorted((r for r in data['results']
                             if r['model'] == model and r['method'] == method),
                            key=lambda r: r['realised_ratio'])
                ax.plot([r['realised_ratio'] for r in rs], [r['metric'] for r in rs],
                        color=colors[g], lw=0.7, alpha=0.35)
            x, y = [e['realised_ratio'] for e in es], [e['metric'] for e in es]
            lo, hi = _ci_bounds(es)
            ax.fill_between(x, lo, hi, color=colors[g], alpha=0.18, lw=0)
            ax.plot(x, y, color=colors[g], lw=2, marker='o', ms=3,
                    label=f'{g} ({len(es[0]["models"])} checkpoints)')
            lines.append(dict(label=f'{g} / {method}', x=x, y=y, low=lo, high=hi,
                              models=list(es[0]['models'])))
        ax.set_title(method)
        ax.set_xlabel('realised ratio')
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"{entries[0]['metric_name']} (mean, 95% CI)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(handles, labels, fontsize=7, loc='upper left',
                       bbox_to_anchor=(1.02, 1.0), title='architecture (thin: its checkpoints)',
                       title_fontsize=7)
    return _save(fig, path, dict(kind='per architecture', lines=lines))


def forest_rows(data: Dict[str, object]) -> List[dict]:
    """The architecture differences with a verdict (AUC first, then the cells): label, A - B,
    the interval at the verdict's level, the verdict."""
    rows = []
    for d in decided_verdicts(data):
        auc = 'auc_difference' in d
        rows.append(dict(part='AUC' if auc else 'cell',
                         label=f"{d['group_a']} - {d['group_b']} | {d['method']} "
                         + ('AUC' if auc else f"{d['ratio']:.2f}"),
                         value=d['auc_difference' if auc else 'paired_difference'],
                         low=d['difference_ci_low'], high=d['difference_ci_high'],
                         level=d['ci_level'], verdict=d['verdict'], margin=d['margin']))
    return rows


def plot_forest(data: Dict[str, object], path: str) -> Optional[str]:
    """Every architecture difference (robustness AUC, then each cell's drop; A - B, > 0: A
    loses less) as a point with its interval at its verdict's level, the equivalence margin as
    a band around 0, coloured by verdict; ``None`` (nothing written) when the sweep has no
    architecture verdict (one checkpoint per architecture)."""
    rows = forest_rows(data)
    if not rows:
        return None
    plt = _pyplot()
    parts = [p for p in ('AUC', 'cell') if any(r['part'] == p for r in rows)]
    counts = [sum(1 for r in rows if r['part'] == p) for p in parts]
    fig, axes = plt.subplots(len(parts), 1, figsize=(7.0, 1.2 + 0.9 * len(parts)
                                                     + 0.22 * len(rows)), dpi=120,
                             squeeze=False, layout='constrained',
                             gridspec_kw=dict(height_ratios=[c + 2 for c in counts]))
    colors = {'A loses less': 'tab:green', 'A loses more': 'tab:red',
              'equivalent': 'tab:blue', 'inconclusive': 'tab:gray'}
    margin = rows[0]['margin']
    metric = ((data.get('group_results') or [{}])[0]).get('metric_name', 'metric')
    for ax, part in zip(axes[:, 0], parts):
        mine = [r for r in rows if r['part'] == part]
        ys = list(range(len(mine)))[::-1]
        ax.axvspan(-margin, margin, color='tab:blue', alpha=0.1, lw=0,
                   label=f'equivalence margin +-{margin:g}')
        ax.axvline(0, color='black', lw=0.8)
        for y, r in zip(ys, mine):
            c = colors.get(r['verdict'], 'black')
            ax.hlines(y, r['low'], r['high'], color=c, lw=1.6)
            ax.plot([r['value']], [y], 'o', color=c, ms=3.5)
        ax.set_yticks(ys)
        ax.set_yticklabels([r['label'] for r in mine], fontsize=6.5)
        ax.set_ylim(-0.8, len(mine) - 0.2)
        ax.set_title('robustness AUC' if part == 'AUC' else 'drop per cell (method, ratio)',
                     fontsize=9)
        ax.set_xlabel(f'A - B, {metric} (> 0: A loses less)', fontsize=8)
        ax.grid(axis='x', alpha=0.3)
    for verdict, c in colors.items():
        axes[0][0].plot([], [], 'o-', color=c, label=verdict)
    axes[0][0].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.02, 1.0),
                      title='verdict (Holm); intervals\nat each verdict\'s level',
                      title_fontsize=7)
    return _save(fig, path, dict(kind='forest', margin=margin, rows=rows))
