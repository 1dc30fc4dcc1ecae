"""Where dense ToMe's time goes: the ADE20K UperNet Vim-T config (dense suite's model, random
weights) on one 512 crop, fp32 as mmseg's test loop runs it, batch 1 and 8. Per batch: the
backbone alone and backbone + decode head, unreduced and ToMe 0.46 (dense restore), in the
default path (the backbone's CUDA graphs on), CUDA-event medians; then at batch 1 the backbone's
kernels (graphs off, torch.profiler CUDA time), ToMe minus unreduced by kernel name. Run on the
GPU machine from the repository root with PYTHONPATH as tools/gpu/run.sh sets it."""
import torch
from torch.profiler import ProfilerActivity, profile

from amvim_mm.bench.dense.config import FULL
from amvim_mm.bench.dense.models import build_ade


def median_ms(fn, iters=20, repeats=5):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return sorted(times)[len(times) // 2]


def kernels(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return {e.key[:70]: (e.self_device_time_total / 5e3, e.count // 5)
            for e in prof.key_averages() if e.self_device_time_total}


def main():
    torch.manual_seed(0)
    net, _ = build_ade('vim', FULL, '.', 'cuda')
    net.eval()
    bb = net.backbone
    for batch in (1, 8):
        x = torch.randn(batch, 3, 512, 512, device='cuda')
        res = {}
        for red in (None, dict(type='ToMe', ratio=0.46)):
            bb.set_token_reduction(red)
            bb.cuda_graph = True
            feats = bb(x)
            res[red is None] = (median_ms(lambda: bb(x)),
                                median_ms(lambda: net.decode_head(bb(x))),
                                median_ms(lambda: net.decode_head(feats)))
        (rb, rw, rh), (ub, uw, uh) = res[False], res[True]
        print(f'batch {batch}: backbone {ub:.3f} -> {rb:.3f} ms ({ub / rb:.3f}x); backbone + '
              f'decode head {uw:.3f} -> {rw:.3f} ms ({uw / rw:.3f}x); head alone {uh:.3f} / '
              f'{rh:.3f} ms', flush=True)
    x = torch.randn(1, 3, 512, 512, device='cuda')
    bb.cuda_graph = False
    bb.set_token_reduction(None)
    base = kernels(lambda: bb(x))
    bb.set_token_reduction(dict(type='ToMe', ratio=0.46))
    got = kernels(lambda: bb(x))
    tb, tr = sum(t for t, _ in base.values()), sum(t for t, _ in got.values())
    print(f'batch 1 backbone CUDA time (graphs off): {tb:.3f} -> {tr:.3f} ms; kernels '
          f'{sum(c for _, c in base.values())} -> {sum(c for _, c in got.values())}')
    keys = set(base) | set(got)
    diff = sorted(((got.get(k, (0, 0))[0] - base.get(k, (0, 0))[0], k) for k in keys))
    for d, k in diff[:8] + diff[-16:]:
        print(f'  {d:+8.3f}  {got.get(k, (0, 0))[1]:4d}/{base.get(k, (0, 0))[1]:4d}  {k}')


if __name__ == '__main__':
    with torch.no_grad():
        main()
