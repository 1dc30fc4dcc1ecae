"""The GPU suite's ``reduction-table`` part: every family x reducer at its published budget, in
three modes, with the speed-up over no reduction against the FLOPs ratio.

Modes, same model, same weights, same batch (128, 224, bf16), one process:

* ``graph``: the whole classifier captured in one CUDA graph by the benchmark (the backbone's
  own graphs off): what the kernels cost without the host;
* ``default``: a plain eager call of the classifier, as mmseg's / mmdet's / mmpretrain's test
  loops make it, with every switch at its default (the backbone replays its forward from its
  own CUDA graphs: ``cuda_graph=None``, ``AMVIM_CUDA_GRAPH`` on);
* ``eager``: the same call with the backbone's graphs off (``cuda_graph=False``).

Budgets (the publications'): ToMe at ratio 0.46 (AMVim's largest); ToP and EViT keep 0.8
after ToP-ViM's blocks (Tiny: 0-based 9, 19; Small: 4, 9, 14), whose GFLOPs in LocalMamba's
convention are the published 1.27 / 3.60 G; DynamicViT's rho fitted to the same GFLOPs
(keep predictors before blocks 6, 12, 18); PlainMamba-L3: the 8.44-GFLOPs ToP schedule
(:data:`~amvim_mm.models.plain_mamba.plain_mamba.L3_TOP_BUDGET`), EViT at the same, ToMe 0.42;
VMamba-T: stage-3 ToMe 0.27 / 0.46 and ToP at realised 0.27. FLOPs ratios are in each
backbone's default convention (Vim: mamba-ssm's, PlainMamba and VMamba: their official code's).
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from amvim_mm.analysis.flops import backbone_flops
from amvim_mm.models.plain_mamba.plain_mamba import L3_TOP_BUDGET
from amvim_mm.models.reduction import ReductionSchedule

from .. import measure as B
from .common import add_speedup, attempt, log

MODES = ('graph', 'default', 'eager')
#: the part's models (``--models`` picks among them; none of them named: all)
TABLE_MODELS = ('vim-t', 'vim-s', 'plainmamba-l3', 'vmamba-t')
#: ToP-ViM's pruning locations (after these 0-based blocks) and keep rate
TOP_LOCATIONS = {'vim-t': (9, 19), 'vim-s': (4, 9, 14)}
TOP_KEEP = 0.8
DYNAMICVIT_LOCATIONS = (5, 11, 17)


def _gflops(bb, red, convention) -> float:
    bb.set_token_reduction(red)
    try:
        return backbone_flops(bb, 224, 'model', num_classes=1000, convention=convention)['gflops']
    finally:
        bb.set_token_reduction(None)


def vim_cases(name: str, bb) -> List[Tuple[str, dict]]:
    """The Vim family's cases at the published budgets (see the module docstring)."""
    locs = TOP_LOCATIONS[name]
    top = dict(type='ToP', keep_rate=TOP_KEEP, locations=locs)
    target = _gflops(bb, top, 'localmamba')
    grid = [round(0.5 + 0.005 * i, 3) for i in range(101)]

    def dyn(rho):
        return dict(type='DynamicViT', keep_rate=rho, locations=DYNAMICVIT_LOCATIONS)

    rho = min(grid, key=lambda v: abs(_gflops(bb, dyn(v), 'localmamba') - target))
    log(f'  {name}: ToP keep {TOP_KEEP} after {locs}: {target:.3f} G (LocalMamba); '
        f'DynamicViT rho {rho}')
    return [('ToMe 0.46', dict(type='ToMe', ratio=0.46)),
            ('EViT', dict(type='EViT', keep_rate=TOP_KEEP, locations=locs)),
            ('ToP', top), ('ToP-noalign', dict(top, align=False)),
            ('DynamicViT', dyn(rho))]


def plainmamba_cases() -> List[Tuple[str, dict]]:
    return [('ToP', dict(type='ToP', **L3_TOP_BUDGET)),
            ('ToP-noalign', dict(type='ToP', align=False, **L3_TOP_BUDGET)),
            ('EViT', dict(type='EViT', **L3_TOP_BUDGET)),
            ('ToMe 0.42', dict(type='ToMe', ratio=0.42))]


def vmamba_cases(bb) -> List[Tuple[str, dict]]:
    M, depth = bb.reduction_domain()
    locs = ReductionSchedule.importance_locations(depth)
    keep = ReductionSchedule.keep_rate_for_ratio(0.27, M, depth, locs)
    return [('ToMe 0.27', dict(type='ToMe', ratio=0.27)),
            ('ToMe 0.46', dict(type='ToMe', ratio=0.46)),
            ('ToP 0.27', dict(type='ToP', locations=locs, keep_rate=keep))]


def _measure(m, mode: str) -> dict:
    """One timing of classifier ``m`` in ``mode`` (see the module docstring)."""
    bb = m.backbone
    bb.cuda_graph = None if mode == 'default' else False
    bb.reset_cuda_graphs()
    try:
        r = attempt(B.measure, m, 128, 224, 'bf16', 'graph' if mode == 'graph' else 'eager',
                    warmup=3, iters=10, repeats=3)
        stats = dict(bb._graphs.stats)
    finally:
        bb.cuda_graph = None
        bb.reset_cuda_graphs()
    r['mode'] = mode
    if mode == 'default':
        r['backbone_graph_replays'] = stats.get('replay', 0)
    return r


def gpu_reduction_table(args):
    """Every family x reducer (module docstring) of the models of :data:`TABLE_MODELS` that
    ``--models`` names (none named: all), graph / default / eager; the rows and, in the log,
    the markdown table of speed-ups against FLOPs ratios."""
    rows = []
    for name in [n for n in TABLE_MODELS if n in args.models] or TABLE_MODELS:
        torch.manual_seed(0)
        m = B.build(name, 224, head=True)
        bb = m.backbone
        cases = (vim_cases(name, bb) if name.startswith('vim') else
                 plainmamba_cases() if name.startswith('plain') else vmamba_cases(bb))
        convention = bb.default_flops_convention
        for mode in MODES:
            base = None
            for method, red in [('none', None)] + cases:
                bb.set_token_reduction(red)
                r = _measure(m, mode)
                fl = backbone_flops(bb, 224, 'model', num_classes=1000, convention=convention)
                r.update(model=name, part='reduction-table', method=method, reduction=red,
                         convention=convention, gflops=round(fl['gflops'], 3),
                         realised=round(fl['realised_ratio'], 3))
                base = base or r
                add_speedup(r, base)
                rows.append(r)
                log(f'  {name} {mode} {method}: {r.get("img_per_s")} img/s, speed-up '
                    f'{r.get("speedup")} vs FLOPs ratio {r.get("flops_ratio")} '
                    f'{r.get("error", "")}')
                torch.cuda.empty_cache()
        bb.set_token_reduction(None)
        del m, bb
        torch.cuda.empty_cache()
    log(reduction_markdown(rows))
    return rows


def reduction_markdown(rows) -> str:
    """The issue's table: per (model, method) the speed-up and speed-up / FLOPs ratio in each
    mode."""
    head = ('| model | method | FLOPs ratio | ' + ' | '.join(f'{m} speed-up (/ FLOPs ratio)'
                                                           for m in MODES) + ' |')
    lines = [head, '|' + '---|' * (3 + len(MODES))]
    keys = []
    for r in rows:
        if r.get('method') != 'none' and (r['model'], r['method']) not in keys:
            keys.append((r['model'], r['method']))
    for model, method in keys:
        got = {r['mode']: r for r in rows if r['model'] == model and r['method'] == method}
        ratio = next((r.get('flops_ratio') for r in got.values() if r.get('flops_ratio')), None)
        cells = [f'{got[m].get("speedup")} ({got[m].get("speedup_over_ideal")})'
                 if m in got and got[m].get('speedup') else
                 str(got.get(m, {}).get('error', '-'))[:40] for m in MODES]
        lines.append(f'| {model} | {method} | {ratio} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)
