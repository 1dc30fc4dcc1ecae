"""Where the time of PlainMamba-L3's reduced bf16 forwards goes (after the snake-scan kernel) (batch 128, 224, backbone graphs off,
torch.profiler CUDA time per kernel name): each reducer of the reduction table against the
unreduced forward, kernel by kernel (the difference sorted by size). Run on the GPU machine
from the repository root with PYTHONPATH set as tools/gpu/run.sh sets it."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from amvim_mm.bench import measure as B
from amvim_mm.bench.gpu.reduction_table import plainmamba_cases


def kernel_times(m, x):
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                m(x)
            torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = e.self_device_time_total
        if t:
            out[e.key[:70]] = (t / 5e3, e.count // 5)
    return out


for name in sys.argv[1:] or ['plainmamba-l3']:
    torch.manual_seed(0)
    m = B.build(name, 224, head=True)
    bb = m.backbone
    bb.cuda_graph = False
    x = torch.randn(128, 3, 224, 224, device='cuda')
    cases = plainmamba_cases()
    bb.set_token_reduction(None)
    base = kernel_times(m, x)
    tb = sum(t for t, _ in base.values())
    print(f'=== {name} unreduced: {tb:.3f} ms CUDA per forward', flush=True)
    for k, (t, c) in sorted(base.items(), key=lambda kv: -kv[1][0])[:12]:
        print(f'  {t:8.3f} ms x{c:4d}  {k}')
    for method, red in cases:
        bb.set_token_reduction(red)
        got = kernel_times(m, x)
        tr = sum(t for t, _ in got.values())
        print(f'=== {name} {method}: {tr:.3f} ms ({tb / tr:.3f}x); per kernel reduced - '
              f'unreduced (ms, calls):', flush=True)
        keys = set(base) | set(got)
        diff = sorted(((got.get(k, (0, 0))[0] - base.get(k, (0, 0))[0], k) for k in keys))
        for item in diff[:6]:
            d, k = item
            print(f'  {d:+8.3f}  {got.get(k, (0, 0))[1]:4d}/{base.get(k, (0, 0))[1]:4d}  {k}')
        print('  ...')
        for d, k in diff[-22:]:
            print(f'  {d:+8.3f}  {got.get(k, (0, 0))[1]:4d}/{base.get(k, (0, 0))[1]:4d}  {k}')
    bb.set_token_reduction(None)
    del m, bb
    torch.cuda.empty_cache()
