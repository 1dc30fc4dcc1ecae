"""Where the time of Vim's reduced bf16 forwards goes INSIDE one CUDA graph (batch 128, 224,
the whole classifier captured as the reduction table's graph mode does): per replay the span,
the kernels' summed time, their count, and the idle time between kernels attributed to the
kernel that follows the gap (top names). Run on the GPU machine from the repository root."""
import collections
import sys

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from amvim_mm.bench import measure as B
from amvim_mm.bench.gpu.reduction_table import vim_cases

REPLAYS = 5


def graph_timeline(m, x):
    def fwd():
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
            return m(x)
    graph, _ = B.capture_cuda_graph(fwd, warmup=3)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    ks = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    if not ks:
        return None
    span = (ks[-1].time_range.end - ks[0].time_range.start) / REPLAYS
    busy = sum(e.time_range.end - e.time_range.start for e in ks) / REPLAYS
    gaps = collections.Counter()
    for a, b in zip(ks, ks[1:]):
        g = b.time_range.start - a.time_range.end
        if 0 < g < 200:                       # gaps between replays excluded
            gaps[b.name[:60]] += g / REPLAYS
    del graph
    return span, busy, len(ks) / REPLAYS, gaps, per_name(ks)


def per_name(ks):
    out = collections.Counter()
    for e in ks:
        out[e.name[:60]] += (e.time_range.end - e.time_range.start) / REPLAYS
    return out


def eager_kernels(m, x):
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(REPLAYS):
                m(x)
            torch.cuda.synchronize()
    return per_name([e for e in prof.events() if e.device_type == DeviceType.CUDA])


for name in [a for a in sys.argv[1:] if not a.startswith('-')] or ['vim-t']:
    torch.manual_seed(0)
    m = B.build(name, 224, head=True)
    bb = m.backbone
    bb.cuda_graph = False
    x = torch.randn(128, 3, 224, 224, device='cuda')
    cases = [('none', None)] + [c for c in vim_cases(name, bb)
                                if c[0] in ('EViT', 'ToP', 'DynamicViT')]
    for method, red in cases:
        bb.set_token_reduction(red)
        got = graph_timeline(m, x)
        if got is None:
            print(f'=== {name} {method}: no kernel events in the graph replays', flush=True)
            continue
        span, busy, n, gaps, names = got
        print(f'=== {name} {method}: span {span / 1e3:.3f} ms, kernels {busy / 1e3:.3f} ms, '
              f'{n:.0f} kernels, idle {(span - busy) / 1e3:.3f} ms; top gaps before:', flush=True)
        for k, g in gaps.most_common(10):
            print(f'  {g / 1e3:8.3f} ms  {k}')
        eager = eager_kernels(m, x)
        print(f'  eager kernels {sum(eager.values()) / 1e3:.3f} ms; graph - eager per kernel:')
        diff = {k: names.get(k, 0) - eager.get(k, 0) for k in set(names) | set(eager)}
        for k in sorted(diff, key=lambda k: -abs(diff[k]))[:12]:
            print(f'  {diff[k] / 1e3:+8.3f} ms  graph {names.get(k, 0) / 1e3:7.3f}  {k}')
        torch.cuda.empty_cache()
    bb.set_token_reduction(None)
    del m, bb
    torch.cuda.empty_cache()
