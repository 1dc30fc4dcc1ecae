"""ToMe's matching + merge plan at a dense crop's length (512 x 512: 1024 patch tokens and a
class token in the middle, Vim-T width 192, 48 merges, fp32 streams), batch 1 and 8, CUDA
graph replays (median of 5 x 50): the blocked route of :func:`amvim_mm.ops.token_merge.
tome_match` per best-match launch configuration (BLOCK_A, BLOCK_B, BLOCK_D, num_warps), and
the route it replaced (``ToMe.select``'s PyTorch ops + :func:`plan_merge`). Run on the GPU
machine from the repository root with PYTHONPATH as tools/gpu/run.sh sets it."""
import torch

import amvim_mm.ops.token_merge as tm
from amvim_mm.models.layout.scan_context import ScanContext
from amvim_mm.models.reduction.reducers import ToMe
from amvim_mm.models.reduction.state import Streams, init_reduction_state
from amvim_mm.token_layout import cls_index_for

CONFIGS = [(32, 128, 64, 4), (32, 128, 64, 8), (64, 128, 64, 8), (32, 64, 64, 4),
           (16, 128, 64, 4), (64, 64, 64, 4), (16, 64, 64, 2), (32, 256, 32, 8)]


def us(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(50):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 50 * 1e3)
    return sorted(times)[2]


def main():
    n, cls, D, k = 1024, 512, 192, 48
    print('batch | ' + ' | '.join(map(str, CONFIGS)) + ' | select + plan_merge (us)')
    for B in (1, 8):
        torch.manual_seed(B)
        h = torch.randn(B, n + 1, D, device='cuda')
        r = torch.randn_like(h)
        ctx = init_reduction_state(ScanContext((32, 32), cls_index=cls), B, 'cuda')
        layer = torch.nn.Module()
        layer.norm = torch.nn.Module()
        layer.norm.weight = torch.nn.Parameter(torch.rand(D, device='cuda') + 0.5)
        state = (ctx.pos, ctx.size, ctx.source)
        row = []
        for cfg in CONFIGS:
            tm.BLOCKED_MATCH_CONFIG = cfg
            try:
                row.append(us(lambda: tm.tome_match(h, r, layer.norm.weight, n, cls, k,
                                                    plan_state=state)))
            except Exception as e:   # noqa: BLE001  (e.g. out of shared memory)
                print(f'{cfg}: {type(e).__name__}: {str(e)[:120]}', flush=True)
                row.append(float('nan'))
        tome = ToMe(r=k, locations=(0, ))

        def old():
            rem, dst, _ = tome.select(0, k, Streams(h, r), ctx, layer)
            return tm.plan_merge(*state, rem, dst, cls_index_for(n - k, True))
        row.append(us(old))
        print(f'{B} | ' + ' | '.join(f'{t:.1f}' for t in row), flush=True)


if __name__ == '__main__':
    with torch.no_grad():
        main()
