"""ViL-T against Vim-T on the CPU, batch 1, 224, fp32, torch.no_grad, interleaved rounds
(issue 55: ViL's mLSTM cell compiled on the CPU). Rows: Vim-T on the compiled kernels (the
default CPU path), ViL-T with the compiled mLSTM cell (the default now), ViL-T with the
PyTorch forms of the cell (``runtime.override(cpu_kernels=False)``, the path before). Backbones
with their classifier inputs (Vim-T: the class token; ViL-T: the official bilateral pooling).

    python benchmarks/runs/2026-12-07c_vil_cpu_cell/vil_vs_vim.py [threads] [rounds] [iters]
"""
import statistics
import sys
import time

import torch

from amvim_mm import runtime
from amvim_mm.registry import MODELS

threads, rounds, iters = (int(a) for a in (sys.argv[1:] + ['2', '9', '5'][len(sys.argv) - 1:]))
torch.set_num_threads(threads)
torch.manual_seed(0)
x = torch.randn(1, 3, 224, 224)
rows = {
    'vim-t (compiled kernels)': (MODELS.build(dict(type='Vim', arch='tiny', img_size=224,
                                                   out_type='cls_token')).eval(), True),
    'vil-t (compiled mLSTM cell)': (MODELS.build(dict(type='ViL', arch='tiny', img_size=224,
                                                      out_type='pooled')).eval(), True),
    'vil-t (PyTorch cell)': (MODELS.build(dict(type='ViL', arch='tiny', img_size=224,
                                               out_type='pooled')).eval(), False),
}
times = {k: [] for k in rows}
with torch.no_grad():
    for name, (m, kernels) in rows.items():
        with runtime.override(cpu_kernels=kernels):
            for _ in range(2):
                m(x)
    for _ in range(rounds):
        for name, (m, kernels) in rows.items():
            with runtime.override(cpu_kernels=kernels):
                t = time.perf_counter()
                for _ in range(iters):
                    m(x)
                times[name].append((time.perf_counter() - t) / iters * 1e3)
vim = statistics.median(times['vim-t (compiled kernels)'])
print(f'threads {threads}, rounds {rounds} x {iters} calls, batch 1, 224, fp32; median ms '
      '(spread = (max - min) / median); ratio to Vim-T; paired = median of per-round ratios')
for name, ts in times.items():
    med = statistics.median(ts)
    paired = statistics.median(t / v for t, v in zip(ts, times['vim-t (compiled kernels)']))
    print(f'{name:30s} {med:8.1f} ms  spread {100 * (max(ts) - min(ts)) / med:5.1f} %  '
          f'x Vim-T {med / vim:.2f} (paired {paired:.2f})')
