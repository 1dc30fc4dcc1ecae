"""The CPU benchmark suite (``tools/benchmark.py --suite cpu``): batch-1 latency at 224 on this
machine's cores, every row side by side in one process; Vim-T and its ToMe 0.46 also at batch 8,
the batch ``prune_eval`` times a CPU at (its ``img_per_s`` column).

Rows: timm ``deit_tiny`` / ``deit_small`` (the transformer peers), Vim-T / Vim-S / AMVim-T on
the compiled CPU kernels (the default) and on the PyTorch scan (``AMVIM_CPU_KERNELS=0``, the
speed before them), Vim-T on the ``reference`` backend, and Vim-T with ToMe 0.17 / 0.46 (their
speed-up over Vim-T against the FLOPs ratio). Discipline as on the GPU: warm-up, then
``repeats`` rounds in which every row runs ``iters`` forwards in turn (interleaved, so a busy
spell of the machine hits every row alike); per row the median round, the fastest round and
the spread ((max - min) / median); the ratios use the medians. ToMe rows also give the paired
estimate (``paired_over_ideal``): the median over rounds of each round's speed-up, divided by
the FLOPs ratio (on a noisy machine a slow spell hits both rows of a round alike). fp32,
eager, ``torch.no_grad``, ``torch.set_num_threads(threads)``.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

from amvim_mm import runtime
from amvim_mm.analysis.flops import backbone_flops

from . import measure as B

#: the batch of the extra rows: the batch prune_eval measures speed at on a CPU
EVAL_BATCH = 8

#: (row name, model, how it runs, ToMe ratio[, batch (default 1)])
ROWS = (
    ('deit-tiny', 'deit_tiny_patch16_224', 'timm', None),
    ('deit-small', 'deit_small_patch16_224', 'timm', None),
    ('vim-t', 'vim-t', 'compiled', None),
    ('vim-t', 'vim-t', 'torch', None),
    ('vim-t', 'vim-t', 'reference', None),
    ('amvim-t', 'amvim-t', 'compiled', None),
    ('amvim-t', 'amvim-t', 'torch', None),
    ('vim-s', 'vim-s', 'compiled', None),
    ('vim-s', 'vim-s', 'torch', None),
    ('vim-t', 'vim-t', 'compiled', 0.17),
    ('vim-t', 'vim-t', 'compiled', 0.46),
    ('vim-t', 'vim-t', 'torch', 0.46),
    ('vim-t', 'vim-t', 'compiled', None, EVAL_BATCH),
    ('vim-t', 'vim-t', 'compiled', 0.46, EVAL_BATCH),
)

#: ToP-ViM's Tiny locations (after 0-based blocks 9 and 19) and DynamicViT's (before 6, 12, 18)
_TOP_LOCS, _DYN_LOCS = (9, 19), (5, 11, 17)
#: ``--cpu-rows reduction``: Vim-T at prune_eval's CPU batch with every reducer at its published
#: budget (ToMe 0.46; EViT / ToP keep 0.8 after ToP-ViM's blocks, DynamicViT at the same
#: GFLOPs), and ToP keep 0.7 with and without alignment; (label, reducer config) in place of
#: the ToMe ratio
REDUCTION_ROWS = (('vim-t', 'vim-t', 'compiled', None, EVAL_BATCH), ) + tuple(
    ('vim-t', 'vim-t', 'compiled', (label, red), EVAL_BATCH) for label, red in (
        ('ToMe 0.46', dict(type='ToMe', ratio=0.46)),
        ('EViT 0.8', dict(type='EViT', keep_rate=0.8, locations=_TOP_LOCS)),
        ('ToP 0.8', dict(type='ToP', keep_rate=0.8, locations=_TOP_LOCS)),
        ('ToP 0.8 noalign', dict(type='ToP', keep_rate=0.8, locations=_TOP_LOCS, align=False)),
        ('ToP 0.7', dict(type='ToP', keep_rate=0.7, locations=_TOP_LOCS)),
        ('ToP 0.7 noalign', dict(type='ToP', keep_rate=0.7, locations=_TOP_LOCS, align=False)),
        ('DynamicViT 0.88', dict(type='DynamicViT', keep_rate=0.88, locations=_DYN_LOCS))))
ROW_SETS = {'main': ROWS, 'reduction': REDUCTION_ROWS}

#: how a row runs -> the runtime settings it runs under
SETTINGS = {'compiled': dict(cpu_kernels=True), 'torch': dict(cpu_kernels=False),
            'reference': dict(cpu_kernels=False, scan_backend='reference'), 'timm': {}}


def _row_model(model: str, how: str, reduction) -> torch.nn.Module:
    """A row's model; ``reduction``: None, a ToMe ratio or (label, reducer config)."""
    if how == 'timm':
        import timm
        return timm.create_model(model, pretrained=False).eval()
    red = reduction[1] if isinstance(reduction, tuple) else \
        dict(type='ToMe', ratio=reduction) if reduction else None
    return B.build(model, 224, head=True, token_reduction=red, device='cpu').eval()


def _row_fields(name: str, how: str, reduction, batch) -> dict:
    """A row's identity: model, kernels, ToMe ratio (0: none) or reducer label, batch."""
    label = reduction[0] if isinstance(reduction, tuple) else ''
    tome = reduction if isinstance(reduction, float) else 0.0
    return dict(model=name, kernels=how, tome=tome, reducer=label,
                batch=batch[0] if batch else 1)


def run_cpu_suite(threads: int, iters: int = 3, repeats: int = 5, warmup: int = 2,
                  rows=ROWS, log: Callable[[str], None] = print) -> Dict[str, object]:
    """Measure ``rows``; return ``dict(rows=[...], summary={...})`` (see the module doc)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    images = torch.randn(max(r[4] if len(r) > 4 else 1 for r in rows), 3, 224, 224)
    built = []
    for name, model, how, reduction, *batch in rows:
        m = _row_model(model, how, reduction)
        row = _row_fields(name, how, reduction, batch)
        if how != 'timm':
            fl = backbone_flops(m.backbone, 224, 'model')
            row['gflops'] = round(fl['gflops'], 3)
        built.append((row, m))

    def forward(m, row):
        with runtime.override(**SETTINGS[row['kernels']]), torch.no_grad():
            return m(images[:row['batch']])

    for row, m in built:                      # warm-up (and the first-call costs)
        for _ in range(warmup):
            forward(m, row)
    times: List[List[float]] = [[] for _ in built]
    for rep in range(repeats):                # interleaved rounds
        for i, (row, m) in enumerate(built):
            t0 = time.perf_counter()
            for _ in range(iters):
                forward(m, row)
            times[i].append((time.perf_counter() - t0) / iters)
        log(f'  round {rep + 1}/{repeats}: ' + ', '.join(
            f'{r["model"]}/{r["kernels"]}{"+ToMe" + str(r["tome"]) if r["tome"] else ""}'
            f'{"+" + r["reducer"] if r["reducer"] else ""}'
            f'{"/b" + str(r["batch"]) if r["batch"] > 1 else ""} {1e3 * t[-1]:.0f}'
            for (r, _), t in zip(built, times)) + ' ms')
    out = []
    for (row, _), ts in zip(built, times):
        med = statistics.median(ts)
        out.append(dict(row, latency_ms=round(1e3 * med, 1), min_ms=round(1e3 * min(ts), 1),
                        spread_pct=round(100 * (max(ts) - min(ts)) / med, 1),
                        rounds_ms=[round(1e3 * t, 2) for t in ts]))
    return dict(rows=out, summary=summarize(out), threads=threads, iters=iters,
                repeats=repeats)


def _find(rows, model, kernels, tome=0.0, batch=1, reducer=''):
    for r in rows:
        if r['model'] == model and r['kernels'] == kernels and r['tome'] == tome \
                and r.get('batch', 1) == batch and r.get('reducer', '') == reducer:
            return r
    return None


def summarize(rows: List[dict]) -> Dict[str, object]:
    """Ratios of one run: each row against deit-tiny and against its own model on the PyTorch
    scan; ToMe rows' speed-up over Vim-T against their FLOPs ratio (written into the rows)."""
    deit = _find(rows, 'deit-tiny', 'timm')
    for r in rows:
        b = r.get('batch', 1)
        if deit is not None and b == 1:
            r['vs_deit_tiny'] = round(r['latency_ms'] / deit['latency_ms'], 2)
        before = _find(rows, r['model'], 'torch', r['tome'], b, r.get('reducer', ''))
        if before is not None and r['kernels'] != 'torch':
            r['speedup_vs_torch'] = round(before['latency_ms'] / r['latency_ms'], 2)
        base = _find(rows, r['model'], r['kernels'], batch=b)
        if (r['tome'] or r.get('reducer')) and base is not None:
            r['speedup'] = round(base['latency_ms'] / r['latency_ms'], 3)
            r['flops_ratio'] = round(base['gflops'] / r['gflops'], 3)
            r['speedup_over_ideal'] = round(r['speedup'] / r['flops_ratio'], 3)
            if r.get('rounds_ms') and len(base.get('rounds_ms', ())) == len(r['rounds_ms']):
                # the paired estimate: each round's ratio (both rows timed seconds apart), then
                # the median; a slow spell of the machine moves both rows of a round alike
                r['paired_over_ideal'] = round(statistics.median(
                    bt / t for bt, t in zip(base['rounds_ms'], r['rounds_ms']))
                    / r['flops_ratio'], 3)
    s: Dict[str, object] = {}
    vim, am = _find(rows, 'vim-t', 'compiled'), _find(rows, 'amvim-t', 'compiled')
    if vim and deit:
        s['vim_t_vs_deit_tiny'] = vim['vs_deit_tiny']
    if vim and am:
        s['amvim_t_over_vim_t'] = round(am['latency_ms'] / vim['latency_ms'], 3)
    for batch, name in ((1, 'tome_0.46'), (EVAL_BATCH, f'tome_0.46_batch{EVAL_BATCH}')):
        tome = _find(rows, 'vim-t', 'compiled', 0.46, batch)
        for key in ('speedup_over_ideal', 'paired_over_ideal'):
            if tome and key in tome:
                s[f'{name}_{key}'] = tome[key]
    if vim and 'speedup_vs_torch' in vim:
        s['vim_t_compiled_over_torch'] = vim['speedup_vs_torch']
    s.update(_reducer_summary(rows))
    return s


def _reducer_summary(rows: List[dict]) -> Dict[str, object]:
    """Per reducer row (``--cpu-rows reduction``): its speed-up and speed-up / FLOPs ratio;
    ToP's aligned latency over its unaligned one at the same keep rate."""
    s: Dict[str, object] = {}
    for r in rows:
        if r.get('reducer') and 'speedup' in r:
            key = r['reducer'].replace(' ', '_')
            s[f'{key}_speedup'] = r['speedup']
            s[f'{key}_over_ideal'] = r['speedup_over_ideal']
    for r in rows:
        label = r.get('reducer', '')
        if label.startswith('ToP') and not label.endswith('noalign'):
            plain = _find(rows, r['model'], r['kernels'], r['tome'], r['batch'],
                          label + ' noalign')
            if plain is not None:
                s[f'{label.replace(" ", "_")}_aligned_over_unaligned'] = round(
                    r['latency_ms'] / plain['latency_ms'], 3)
    return s


COLUMNS = ['model', 'kernels', 'tome', 'reducer', 'batch', 'gflops', 'latency_ms', 'min_ms',
           'spread_pct',
           'vs_deit_tiny', 'speedup_vs_torch', 'speedup', 'flops_ratio', 'speedup_over_ideal',
           'paired_over_ideal']
