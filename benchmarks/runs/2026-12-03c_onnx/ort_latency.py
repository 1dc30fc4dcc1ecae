"""ONNX Runtime CPU latency, batch 1, 224: Vim-T (unreduced, ToMe 0.27) and timm's DeiT-T, each
exported the same way (amvim_mm.deploy.export_onnx: TorchScript exporter, opset 17, dynamic
batch), next to the PyTorch CPU paths (ours: the compiled CPU kernels; DeiT-T: timm eager), in
one process, interleaved rounds, the same thread count. Whole classifiers (1000-way head).
Run from the repository root: python benchmarks/runs/2026-12-03c_onnx/ort_latency.py [threads]
"""
import statistics
import sys
import tempfile
import time

import numpy as np
import timm
import torch

from amvim_mm.bench.measure import build
from amvim_mm.deploy import compare_onnx, export_onnx, ort_session

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(threads)
torch.manual_seed(0)
models = {
    'vim-t': build('vim-t', 224, device='cpu'),
    'vim-t tome0.27': build('vim-t', 224, device='cpu',
                            token_reduction=dict(type='ToMe', ratio=0.27)),
    'deit-t': timm.create_model('deit_tiny_patch16_224', pretrained=False).eval(),
}
models['vim-t tome0.27'].load_state_dict(models['vim-t'].state_dict())
x = torch.randn(1, 3, 224, 224)
tmp = tempfile.mkdtemp()
sessions = {}
for name, m in models.items():
    t = time.perf_counter()
    path = export_onnx(m, f'{tmp}/{name.replace(" ", "_")}.onnx', x)
    err = compare_onnx(m, path, torch.randn(2, 3, 224, 224), threads=threads)
    print(f'{name}: exported in {time.perf_counter() - t:.1f} s, max relative error '
          f'{max(e["max_rel_err"] for e in err.values()):.2g}', flush=True)
    sessions[name] = ort_session(path, threads=threads)

feed = x.numpy()


def ort_ms(name):
    s = sessions[name]
    inp = s.get_inputs()[0].name
    t = time.perf_counter()
    s.run(None, {inp: feed})
    return (time.perf_counter() - t) * 1000


def torch_ms(name):
    with torch.no_grad():
        t = time.perf_counter()
        models[name](x)
        return (time.perf_counter() - t) * 1000


rows = {(n, k): [] for n in models for k in ('onnxruntime', 'pytorch')}
for fn in (ort_ms, torch_ms):           # warm-up
    for n in models:
        fn(n)
for _ in range(5):                       # interleaved rounds, 3 calls each, median
    for n in models:
        rows[(n, 'onnxruntime')].append(statistics.median(ort_ms(n) for _ in range(3)))
        rows[(n, 'pytorch')].append(statistics.median(torch_ms(n) for _ in range(3)))
med = {k: statistics.median(v) for k, v in rows.items()}
print(f'\nthreads {threads}, batch 1, 224, medians of 5 interleaved rounds (ms):')
print('| model | ONNX Runtime | PyTorch CPU | ORT / PyTorch time |')
print('|---|---|---|---|')
for n in models:
    o, p = med[(n, 'onnxruntime')], med[(n, 'pytorch')]
    print(f'| {n} | {o:.1f} | {p:.1f} | {o / p:.2f} |')
print(f'\nVim-T ORT / DeiT-T ORT: {med[("vim-t", "onnxruntime")] / med[("deit-t", "onnxruntime")]:.2f}; '
      f'ToMe 0.27 speed-up in ORT: {med[("vim-t", "onnxruntime")] / med[("vim-t tome0.27", "onnxruntime")]:.2f}')
