"""The dense suite's results: ratios between rows, the markdown tables, the versions."""
from __future__ import annotations

import importlib
import json
from typing import Dict, List, Optional

from amvim_mm.bench.measure import speedup_ceiling
from .config import GRAPH_IMPLS


def _ratio(a, b) -> Optional[float]:
    return round(a / b, 3) if a and b else None


def _three_ways(r: dict, whole0: Optional[dict], bb: Optional[dict],
                bb0: Optional[dict]) -> None:
    """A reduced whole-model row's speed-up three ways: ``backbone_speedup`` (the same
    reduction on the backbone alone, same size, batch, path and mode), the whole model's
    (``speedup_vs_unreduced``) and ``ceiling_speedup``: the unreduced whole model's time with
    its backbone's time scaled by the FLOPs ratio, the rest unchanged."""
    if bb is not None and bb0 is not None:
        r['backbone_speedup'] = _ratio(bb['img_per_s'], bb0['img_per_s'])
    if whole0 is not None and bb0 is not None and r.get('flops_ratio'):
        c = speedup_ceiling(whole0['ms_per_iter'], bb0['ms_per_iter'], r['flops_ratio'])
        r['ceiling_speedup'] = None if c is None else round(c, 3)


def add_ratios(rows: List[dict]) -> None:
    """Add ``fused_over_unfused``, ``ours_over_peer``, ``mem_over_peer`` and
    ``speedup_vs_unreduced`` (images/s quotients, 3 decimals) to the rows that have the row
    to compare with in ``rows`` (always of the same mode), and to the ade-whole rows with an
    ade-backbone row of the same size ``backbone_share`` and (fused rows) ``ratio_cap``."""
    def key(r, **over):
        k = dict(workload=r['workload'], res=r['res'], batch=r['batch'], model=r['model'],
                 impl=r['impl'], reduction=r['reduction'], mode=r.get('mode'))
        k.update(over)
        return tuple(sorted(k.items()))
    index = {key(r): r for r in rows if r.get('img_per_s')}
    peers = {(r['workload'], r['res'], r['batch'], r.get('mode')): r for r in rows
             if r['impl'] == 'peer' and r.get('img_per_s')}
    for r in rows:
        if not r.get('img_per_s') or r['impl'] == 'peer':
            continue
        if r['impl'] in GRAPH_IMPLS:
            base_impl = GRAPH_IMPLS[r['impl']]
            if base_impl is not None:
                base = index.get(key(r, impl=base_impl))
                r['fused_over_unfused'] = _ratio(r['img_per_s'], base and base['img_per_s'])
            plain = index.get(key(r, impl='unfused'))
            # the user-visible gain: a graphed backbone against the plain eager unfused one
            r['over_unfused_no_graphs'] = _ratio(r['img_per_s'], plain and plain['img_per_s'])
        elif r['impl'] != 'unfused':
            base = index.get(key(r, impl='unfused'))
            r['fused_over_unfused'] = _ratio(r['img_per_s'], base and base['img_per_s'])
        if r['workload'] == 'ade-whole':
            bb = index.get(key(r, workload='ade-backbone'))
            if bb is not None:
                r['backbone_share'] = round(bb['ms_per_iter'] / r['ms_per_iter'], 3)
            base_impl = GRAPH_IMPLS.get(r['impl'], 'unfused')
            whole = index.get(key(r, impl=base_impl))
            bb = index.get(key(r, workload='ade-backbone', impl=base_impl))
            if base_impl and r['impl'] != 'unfused' and whole is not None and bb is not None:
                rest = whole['ms_per_iter'] - bb['ms_per_iter']
                r['ratio_cap'] = round(whole['ms_per_iter'] / rest, 3) if rest > 0 else None
        peer = peers.get((r['workload'], r['res'], r['batch'], r.get('mode')))
        if peer is not None:
            r['ours_over_peer'] = _ratio(r['img_per_s'], peer['img_per_s'])
            r['mem_over_peer'] = _ratio(r.get('peak_mib'), peer.get('peak_mib'))
        if r['reduction'] != 'none':
            base = index.get(key(r, reduction='none'))
            r['speedup_vs_unreduced'] = _ratio(r['img_per_s'], base and base['img_per_s'])
            if r['workload'] in ('ade-whole', 'ade-slide'):
                _three_ways(r, base, index.get(key(r, workload='ade-backbone')),
                            index.get(key(r, workload='ade-backbone', reduction='none')))


COLUMNS = ['model', 'impl', 'reduction', 'mode', 'path_ran', 'fused_calls', 'res', 'batch',
           'dtype', 'img_per_s', 'ms_per_iter', 'spread_pct', 'peak_mib', 'fused_over_unfused',
           'ours_over_peer', 'mem_over_peer', 'backbone_speedup', 'speedup_vs_unreduced',
           'ceiling_speedup', 'error']


def markdown(result: dict) -> str:
    """The results as markdown: one table per workload, then the skipped rows and notes."""
    from amvim_mm.bench.measure import table
    md = ['# benchmark (dense)' + (' - CPU smoke run, not a measurement' if result.get('smoke')
                                   else ''),
          '', f'`{result["command"]}`', '',
          f'environment: `{json.dumps(result.get("environment", {}))}`', '',
          f'device {result["device"]}, autocast {result["dtype"]}, wall {result.get("wall_s")}'
          f' s, budget {result.get("budget_s")} s; medians of {result["sizes"]["repeats"]} '
          'repeats, spread = (max - min) / median', '']
    for w, title in result['workloads'].items():
        rows = [r for r in result.get('rows', []) if r['workload'] == w]
        if not rows:
            continue
        extra = {k for r in rows for k in ('windows_per_forward', 'scan_backend',
                                           'conv_backend', 'path_note', 'backbone_share',
                                           'ratio_cap', 'over_unfused_no_graphs',
                                           'backbone_graphs') if k in r}
        cols = COLUMNS[:-1] + sorted(extra) + ['error']
        md += [f'## {w}: {title}', '', table(rows, cols), '']
    if result.get('skipped'):
        md += ['## skipped', '', table(result['skipped'], [
            'workload', 'model', 'impl', 'reduction', 'mode', 'res', 'batch', 'reason']), '']
    md += ['## notes', ''] + [f'- {n}' for n in result.get('notes', [])]
    return '\n'.join(md)


def stack_versions() -> Dict[str, str]:
    """Versions of mmengine, mmcv and mmseg (or why they do not import)."""
    out = {}
    for name in ('mmengine', 'mmcv', 'mmseg'):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as e:   # noqa: BLE001
            out[name] = f'absent ({type(e).__name__})'
    return out
