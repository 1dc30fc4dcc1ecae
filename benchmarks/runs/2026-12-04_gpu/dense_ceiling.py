"""Dense ToMe in the default path and what any backbone-only reduction can reach there.

The ADE20K UperNet Vim-T config (the dense suite's model, random weights), fp32 as mmseg's test
loop runs our configs (no AMP), the backbone's CUDA graphs on (the default), through mmseg's own
``EncoderDecoder.inference`` + argmax (what the dense suite times): slide 512 at batch 1 and whole
512 at batch 8. Variants, timed in interleaved rounds (one round = every variant once, medians
over rounds, so slow drifts of the host hit all alike):

- ``none``: no reduction; ``tome 0.46`` / ``tome 0.17``: ToMe with dense restore;
- ``free backbone``: the backbone replaced by a module that returns the unreduced feature maps
  computed beforehand: the pipeline outside the backbone (neck, heads, resize, argmax, mmseg's
  host work), i.e. the time of a reduction that made the backbone cost nothing;
- ``ideal 0.46``: the real backbone, unreduced, on an image with as many patches as ToMe 0.46
  keeps on average over the blocks, its maps resized (nearest) to the full grid: a reduction
  without matching or merging costs.

Also the backbone alone (graph replays) and, at batch 8 with graphs off, the CUDA time of the
whole inference by kernel (torch.profiler), unreduced and ToMe 0.46. Run on the GPU machine from
the repository root with PYTHONPATH as tools/gpu/run.sh sets it for bench-dense."""
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from amvim_mm.analysis.flops import backbone_flops
from amvim_mm.bench.dense.config import FULL
from amvim_mm.bench.dense.models import build_ade
from amvim_mm.models.reduction.reducers import build_reducer

# built once: a backbone's graph key holds its reducer, so every round finds its graphs
TOME = {'tome 0.46': build_reducer(dict(type='ToMe', ratio=0.46)),
        'tome 0.17': build_reducer(dict(type='ToMe', ratio=0.17))}


class Frozen(nn.Module):
    """Returns fixed feature maps (a backbone that costs nothing)."""

    def __init__(self, outs):
        super().__init__()
        self.outs = outs

    def forward(self, x):
        return self.outs


class Smaller(nn.Module):
    """The real backbone on a smaller image, its maps resized to the full grid."""

    def __init__(self, bb, side, grid):
        super().__init__()
        self.bb, self.side, self.grid = bb, side, grid

    def forward(self, x):
        small = F.interpolate(x, size=(self.side, self.side), mode='bilinear')
        return tuple(F.interpolate(o, size=self.grid, mode='nearest') for o in self.bb(small))


def per_call(fn, iters):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main():
    torch.manual_seed(0)
    net, _ = build_ade('vim', FULL, '.', 'cuda')
    net.eval()
    bb = net.backbone
    bb.cuda_graph = None            # the default (AMVIM_CUDA_GRAPH unset: on)
    full = backbone_flops(bb, 512, None)
    for name, red in TOME.items():
        got = backbone_flops(bb, 512, red)
        print(f'{name}: FLOPs ratio {full["gflops"] / got["gflops"]:.3f} '
              f'({full["gflops"]:.2f} / {got["gflops"]:.2f} G); tokens per block {got["tokens"]}')
    tokens = backbone_flops(bb, 512, TOME['tome 0.46'])['tokens']
    mean = statistics.mean(tokens)
    side = int(round(math.sqrt(mean))) * 16
    print(f'ideal 0.46: mean tokens {mean:.1f} -> unreduced image {side} x {side} '
          f'({(side // 16) ** 2} patches)')
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    for mode, batch, iters in (('slide', 1, 30), ('whole', 8, 10)):
        net.test_cfg['mode'] = mode
        x = torch.randn(batch, 3, 512, 512, device='cuda')
        metas = [dict(img_shape=(512, 512), ori_shape=(512, 512), pad_shape=(512, 512))
                 for _ in range(batch)]
        bb.set_token_reduction(None)
        feats = tuple(o.clone() for o in bb(x))
        grid = feats[0].shape[-2:]
        variants = {'none': (bb, None), **{k: (bb, v) for k, v in TOME.items()},
                    'free backbone': (Frozen(feats), None),
                    'ideal 0.46': (Smaller(bb, side, grid), None)}

        def infer():
            return net.inference(x, metas).argmax(1)

        def bbonly():
            return net.backbone(x)
        times = {k: [] for k in variants}
        btimes = {k: [] for k in ('none', 'tome 0.46')}
        for r in range(rounds + 1):                      # round 0: warm-up and captures
            for k, (module, red) in variants.items():
                net.backbone = module
                bb.set_token_reduction(red)
                t = per_call(infer, 3 if r == 0 else iters)
                if r:
                    times[k].append(t)
                if k in btimes:
                    t = per_call(bbonly, 3 if r == 0 else iters)
                    if r:
                        btimes[k].append(t)
            net.backbone = bb
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        spread = {k: 100 * (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
        print(f'\n{mode} 512, batch {batch}, fp32, default path, {rounds} interleaved rounds of '
              f'{iters} calls: inference + argmax ms per call (spread %), ratio none / variant')
        for k in variants:
            print(f'  {k:14s} {med[k]:8.3f} ms ({spread[k]:4.1f} %)  {med["none"] / med[k]:.3f}')
        for k, v in btimes.items():
            print(f'  backbone alone, {k}: {statistics.median(v) * 1e3:.3f} ms')
        bb.set_token_reduction(None)
    # batch 8, graphs off: CUDA time by kernel
    net.test_cfg['mode'] = 'whole'
    x = torch.randn(8, 3, 512, 512, device='cuda')
    metas = [dict(img_shape=(512, 512), ori_shape=(512, 512), pad_shape=(512, 512))] * 8
    bb.cuda_graph = False
    tables = {}
    for k in ('none', 'tome 0.46'):
        bb.set_token_reduction(TOME.get(k))
        for _ in range(3):
            net.inference(x, metas).argmax(1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                net.inference(x, metas).argmax(1)
            torch.cuda.synchronize()
        tables[k] = {e.key[:80]: (e.self_device_time_total / 5e3, e.count // 5)
                     for e in prof.key_averages() if e.self_device_time_total}
    base, got = tables['none'], tables['tome 0.46']
    print(f'\nwhole 512 b8 inference, graphs off, CUDA time: '
          f'{sum(t for t, _ in base.values()):.3f} -> {sum(t for t, _ in got.values()):.3f} ms')
    for k, (t, c) in sorted(base.items(), key=lambda kv: -kv[1][0])[:25]:
        g = got.get(k, (0, 0))
        print(f'  {t:8.3f} -> {g[0]:8.3f} ms  {c:4d} -> {g[1]:4d}  {k}')
    print('  only with ToMe:')
    for k, (t, c) in sorted(got.items(), key=lambda kv: -kv[1][0]):
        if k not in base:
            print(f'  {0:8.3f} -> {t:8.3f} ms  {0:4d} -> {c:4d}  {k}')


if __name__ == '__main__':
    with torch.no_grad():
        main()
