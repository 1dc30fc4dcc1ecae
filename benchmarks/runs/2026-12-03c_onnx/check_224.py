"""ONNX Runtime vs PyTorch fp32 at 224 (batch 2 exported at batch 1: dynamic batch), every
family's tiny arch with the reducers at their test budgets: max relative error per output.
Run from the repository root: python benchmarks/runs/2026-12-03c_onnx/check_224.py [FAMILY...]"""
import sys
import tempfile
import time

import torch

from amvim_mm.deploy import compare_onnx, export_onnx
from amvim_mm.registry import MODELS

torch.set_num_threads(1)
RED = {
    'none': None, 'ToMe': dict(type='ToMe', ratio=0.27),
    'RandomPrune': dict(type='RandomPrune', ratio=0.27, seed=0),
    'EViT': dict(type='EViT', keep_rate=0.7, locations=(5, )),
    'ToP': dict(type='ToP', keep_rate=0.7, locations=(5, )),
    'DynamicViT': dict(type='DynamicViT', keep_rate=0.7, locations=(5, )),
}
FAMILIES = {
    'Vim': dict(type='Vim', arch='tiny'), 'AMVim': dict(type='AMVim', arch='tiny'),
    'LocalVim': dict(type='LocalVim', arch='tiny'), 'ViL': dict(type='ViL', arch='tiny'),
    'AMViL': dict(type='AMViL', arch='tiny'),
}
PAIRS = [('Vim', 'EViT'), ('Vim', 'DynamicViT'), ('AMVim', 'ToP'), ('AMVim', 'RandomPrune'),
         ('LocalVim', 'ToMe'), ('ViL', 'none'), ('ViL', 'ToMe'), ('AMViL', 'EViT'),
         ('ViL', 'DynamicViT')]
if len(sys.argv) > 1:      # e.g. ViL AMViL: only those families
    PAIRS = [p for p in PAIRS if p[0] in sys.argv[1:]]
tmp = tempfile.mkdtemp()
for fam, red in PAIRS:
    torch.manual_seed(0)
    m = MODELS.build(dict(FAMILIES[fam], img_size=224, out_type='featmap',
                          out_indices=(-1, ), token_reduction=RED[red])).eval()
    t = time.perf_counter()
    try:
        path = export_onnx(m, f'{tmp}/{fam}_{red}.onnx', torch.randn(1, 3, 224, 224))
        err = compare_onnx(m, path, torch.randn(2, 3, 224, 224), threads=1)
        worst = max(e['max_rel_err'] for e in err.values())
        print(f'| {fam}-T | {red} | {worst:.2g} | {"ok" if worst <= 1e-4 else "FAIL"} | '
              f'{time.perf_counter() - t:.0f} s |', flush=True)
    except Exception as e:   # noqa: BLE001
        print(f'| {fam}-T | {red} | error: {type(e).__name__}: {str(e)[:200]} |', flush=True)
