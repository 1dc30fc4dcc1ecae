"""The markdown of the cpu and gpu suites' results (``benchmark_<suite>.md``): one section per
part that ran, in a fixed order."""
from __future__ import annotations

import json
from typing import Callable, Dict, List, Tuple

from . import cpu as CB
from .measure import table

#: part (results key) -> (section title, table columns), for the parts that are one table
TABLES: Dict[str, Tuple[str, List[str]]] = {
    'main': ('## main', [
        'model', 'dtype', 'mode', 'mixer', 'img_per_s', 'vs_official_run', 'official',
        'vs_official', 'latency_ms', 'spread_pct', 'peak_mem_mib']),
    'train': ('## train (training step, eager; vs_unfused: same run)', [
        'model', 'res', 'dtype', 'mixer', 'path', 'batch', 'img_per_s', 'vs_unfused',
        'latency_ms', 'spread_pct', 'peak_mem_mib', 'mem_vs_unfused', 'error']),
    'tune_bwd': ('## tune-bwd (fused scan backward: T,BLOCK_E,num_warps; bf16 training step)', [
        'model', 'res', 'batch', 'config', 'img_per_s', 'peak_mem_mib', 'error']),
    'tune': ('## tune (fused scan kernel: BLOCK_E,num_warps,dt_in_kernel; bf16 graph)', [
        'model', 'E', 'config', 'img_per_s', 'spread_pct']),
    'tune_match': ('## tune-match (ToMe matching kernel: BLOCK_D,num_warps,num_stages)', [
        'config', 'us_per_call']),
    'tune_embed': ('## tune-embed (one-kernel embedding: BLOCK_M,BLOCK_N,num_warps,num_stages)', [
        'config', 'us_per_call']),
    'reduction': ('## reduction (ToMe, bf16)', [
        'model', 'variant', 'mode', 'ratio', 'realised', 'gflops', 'img_per_s', 'speedup',
        'flops_ratio', 'speedup_over_ideal']),
    'resolution': ('## resolution (bf16, graph)', [
        'model', 'res', 'batch', 'img_per_s', 'official', 'peak_mem_mib']),
    'plainmamba': ('## plainmamba (batch 128, 224, our path)', [
        'model', 'dtype', 'mode', 'gflops', 'img_per_s', 'latency_ms', 'spread_pct',
        'peak_mem_mib', 'error']),
    'plainmamba_reduction': ('## plainmamba-reduction (PlainMamba-L3, bf16, batch 128, 224)', [
        'model', 'mode', 'method', 'realised', 'gflops', 'img_per_s', 'speedup', 'flops_ratio',
        'speedup_over_ideal', 'peak_mem_mib', 'error']),
    'learned_reduction': ('## learned-reduction (Vim-S, bf16, batch 128, 224, GFLOPs: '
                          'LocalMamba convention)', [
                              'model', 'mode', 'method', 'realised', 'final_tokens', 'gflops',
                              'img_per_s', 'speedup', 'flops_ratio', 'speedup_over_ideal',
                              'peak_mem_mib', 'error']),
}


def _cpu(cpu: dict) -> List[str]:
    return [f'batch 1 (8 where the batch column says so), 224, fp32, eager, '
            f'{cpu["threads"]} threads; latency: median of {cpu["repeats"]} interleaved rounds '
            f'of {cpu["iters"]} forwards', '', table(cpu['rows'], CB.COLUMNS), '',
            f'summary: {cpu["summary"]}']


def _tune_chunk(tc: dict) -> List[str]:
    return ['## tune-chunk (one mixer call, us; sequential / chunked fused scan / mamba-ssm)',
            table(tc['rows'], ['E', 'L', 'batch', 'dtype', 'mode', 'sequential_programs']
                  + tc['variants'] + ['best', 'best_over_seq']), '',
            'Fastest per shape (graph mode), ready to paste into '
            '`amvim_mm/ops/scan_choice.py`:', '', '```python', tc['table_literal'], '```', '']


def _vmamba(rows: List[dict]) -> List[str]:
    inf = [r for r in rows if 'mode' in r and r.get('part') != 'reduction']
    red = [r for r in rows if r.get('part') == 'reduction']
    return ['## vmamba (VMamba-T, batch 128, 224; vs_official_run: same mode, same run)',
            table(inf, ['model', 'dtype', 'mode', 'impl', 'img_per_s', 'vs_official_run',
                        'latency_ms', 'spread_pct', 'peak_mem_mib', 'error']), '',
            '## vmamba stage-3 reduction (bf16)',
            table(red, ['model', 'mode', 'method', 'ratio', 'realised', 'gflops', 'img_per_s',
                        'speedup', 'flops_ratio', 'speedup_over_ideal', 'error']), '']


#: parts whose section is more than one table
SECTIONS: Dict[str, Callable[[object], List[str]]] = {
    'cpu': _cpu, 'tune_chunk': _tune_chunk, 'vmamba': _vmamba}
#: the order of the sections
ORDER = ('cpu', 'main', 'train', 'tune_bwd', 'tune', 'tune_chunk', 'tune_match', 'tune_embed',
         'reduction', 'resolution', 'vmamba', 'plainmamba', 'plainmamba_reduction',
         'learned_reduction')


def results_markdown(suite: str, result: dict) -> str:
    """``result`` (the JSON of a cpu or gpu run) as markdown."""
    md = [f'# benchmark ({suite})', '', f'`{result["command"]}`', '',
          f'environment: `{json.dumps(result["environment"])}`', '']
    for key in ORDER:
        if key not in result:
            continue
        if key in SECTIONS:
            md += SECTIONS[key](result[key])
        else:
            title, cols = TABLES[key]
            md += [title, table(result[key], cols), '']
    return '\n'.join(md)
