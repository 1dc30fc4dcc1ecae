"""Why the ToMe 0.46 backbone replay at 512 (fp32) takes longer than its kernels.

Call 1 (dense_ceiling.py): at batch 8 the UperNet Vim-T backbone's CUDA-graph replay took
6.16 ms with ToMe 0.46 although its kernels (profiled eagerly, graphs off) sum to about 4.1 ms;
unreduced 9.06 ms against ~8.9 ms of kernels. Here, per batch (1, 8) and reduction (none, ToMe
0.46, the reducer built once so every call finds its graph): the backbone call as users make it
(wall per call), the same without the finiteness check's host sync, the captured graph replayed
alone, the kernels of an eager forward (graphs off) and the kernels inside graph replays
(torch.profiler), and the host time of one call's wrapper (key, survey, check) with the GPU idle.
Run on the GPU machine from the repository root with PYTHONPATH as for bench-dense."""
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from amvim_mm.bench.dense.config import FULL
from amvim_mm.bench.dense.models import build_ade
from amvim_mm.models.reduction.reducers import build_reducer


def wall(fn, iters=30, repeats=5):
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / iters * 1e3)
    return statistics.median(out)


def kernels(fn, n=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.self_device_time_total]
    return (sum(e.self_device_time_total for e in ev) / n / 1e3, sum(e.count for e in ev) // n,
            {e.key[:60]: e.self_device_time_total / n / 1e3 for e in ev})


def main():
    torch.manual_seed(0)
    net, _ = build_ade('vim', FULL, '.', 'cuda')
    net.eval()
    bb = net.backbone
    tome = build_reducer(dict(type='ToMe', ratio=0.46))
    for batch in (1, 8):
        x = torch.randn(batch, 3, 512, 512, device='cuda')
        for name, red in (('none', None), ('tome 0.46', tome)):
            bb.set_token_reduction(red)
            bb.cuda_graph = None
            bb.check_finite_input = True
            for _ in range(3):
                bb(x)
            w = wall(lambda: bb(x))
            bb.check_finite_input = False
            w_nocheck = wall(lambda: bb(x))
            bb.check_finite_input = True
            entry = next(reversed(bb._graphs.graphs.values()))
            g = wall(entry.graph.replay)
            # host time of a call's wrapper: GPU idle before, no sync inside the timing
            host = []
            for _ in range(20):
                torch.cuda.synchronize()
                t = time.perf_counter()
                bb(x)
                host.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
            gk, gn, gtab = kernels(entry.graph.replay)
            bb.cuda_graph = False
            e = wall(lambda: bb(x), iters=10)
            ek, en, etab = kernels(lambda: bb(x))
            print(f'batch {batch} {name}: call {w:.3f} ms, without the finite check {w_nocheck:.3f}, '
                  f'graph replay alone {g:.3f}, host per call (GPU idle before) '
                  f'{statistics.median(host):.3f}; eager call {e:.3f}; kernels eager {ek:.3f} ms '
                  f'({en}), inside replays {gk:.3f} ms ({gn})', flush=True)
            diff = sorted(((gtab.get(k, 0) - etab.get(k, 0), k) for k in set(gtab) | set(etab)))
            for d, k in diff[:4] + diff[-8:]:
                print(f'    replay - eager {d:+.3f} ms  {k}')
    bb.cuda_graph = None


if __name__ == '__main__':
    with torch.no_grad():
        main()
