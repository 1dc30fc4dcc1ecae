"""Reproduce the vil part's bf16 'default' failure (illegal memory access): ViL-T classifier,
batch 128, 224, bf16 under autocast, the backbone's own CUDA graphs on; (a) a fresh model in the
default mode only, (b) the graph mode (measure's outer capture) first, as the part does,
(c) (a) with the backbone's graphs off, (d) (b) for Vim-T.
Run with CUDA_LAUNCH_BLOCKING=1 from the repository root (PYTHONPATH as tools/gpu/run.sh)."""
import sys
import traceback

import torch

from amvim_mm.bench import measure as B
from amvim_mm.bench.official_vil import ViLClassifier

case = sys.argv[1]
torch.manual_seed(0)
m = B.build('vim-t', 224) if case == 'd' else ViLClassifier('tiny').cuda().eval()
modes = {'a': ['eager'], 'b': ['graph', 'eager'], 'c': ['eager'], 'd': ['graph', 'eager']}[case]
if case == 'c':
    m.backbone.cuda_graph = False
for mode in modes:
    try:
        r = B.measure(m, 128, 224, 'bf16', mode, warmup=3, iters=5, repeats=2)
        torch.cuda.synchronize()
        print(case, mode, 'ok', r['img_per_s'], flush=True)
    except Exception:
        print(case, mode, 'FAILED', flush=True)
        traceback.print_exc()
        break
