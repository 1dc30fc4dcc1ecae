"""PlainMamba-L3's scan of one layer on an H200 (batch 128, E = 896, N = 16, R = 28, bf16
inputs, CUDA graph replays, median of 5 x 20): the snake-scan kernel
(:func:`amvim_mm.ops.plain_scan.snake_scan`, u read at the visited tokens, the four directions
summed in storage order) per launch configuration, unaligned and ToP-aligned, against
mamba-ssm's grouped scan as the unfused mixer calls it (padded to its chunk; without the
cross-scan copy and the cross-merge, which the kernel includes; only where mamba-ssm is built);
and the aligned scan's raster prefix-sum kernel per (BLOCK_T, BLOCK_E, num_warps). Run on the
GPU machine after `bash tools/gpu/run.sh build-scan` (or `none`: no mamba-ssm column) with
PYTHONPATH=.gpu_build/site:."""
import torch

from amvim_mm import runtime
from amvim_mm.models.backbones.plain_mamba_scan import snake_cell_tables
from amvim_mm.ops.plain_scan import snake_scan
from amvim_mm.ops.backends import mamba_selective_scan
from amvim_mm.ops.plain_aligned import aligned_prefix
from amvim_mm.ops.selective_scan import selective_scan_fn

B, K, E, N, R, H, W = 128, 4, 896, 16, 28, 14, 14
CONFIGS = [(16, 1), (32, 1), (32, 2), (64, 2), (64, 4), (128, 4)]


def timed(fn):
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
        for _ in range(20):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 20)
    return sorted(times)[2]


def main():
    dev = dict(device='cuda', dtype=torch.bfloat16)
    steps_tab, codes_tab = snake_cell_tables(H, W, 'cuda')
    A = -torch.rand(E, N, device='cuda') - 0.5
    bias = torch.rand(E, device='cuda') - 4
    D = torch.ones(E, device='cuda')
    dir_bs = torch.randn(5, N, device='cuda') * 0.02
    print('L | ' + ' | '.join(f'snake {c}' for c in CONFIGS) + ' | snake aligned (64, 2) | '
          'mamba-ssm grouped')
    for L in (196, 117, 70, 42):
        torch.manual_seed(L)
        cells = torch.randperm(H * W, device='cuda')[:L].sort().values      # kept raster cells
        rank = steps_tab[:, cells]                                           # (K, L)
        perm = rank.argsort(-1)[:, None]                                     # (K, 1, L)
        codes = torch.gather(codes_tab[:, cells], 1, perm[:, 0])
        xc = torch.randn(B, L, E, **dev)
        dt = torch.randn(B, L, E, **dev) * 0.5
        x_dbl = torch.randn(B, L, R + 2 * N, **dev)
        q = torch.randint(-1, L, (B, K, L), device='cuda', dtype=torch.int32)
        steps = rank.sort(-1).values.unsqueeze(0).expand(B, -1, -1)
        prefix = torch.rand(B, H * W + 1, E, device='cuda', dtype=torch.float64).cumsum(1)
        row = []
        for cfg in CONFIGS:
            with runtime.override(snake_config=cfg):
                row.append(timed(lambda: snake_scan(xc, dt, x_dbl, perm, codes, dir_bs, A, bias,
                                                    D, R)))
        row.append(timed(lambda: snake_scan(xc, dt, x_dbl, perm, codes, dir_bs, A, bias, D, R,
                                            q=q, steps=steps, prefix=prefix, align='bias')))
        if mamba_selective_scan()[0] is None:
            print(f'{L} | ' + ' | '.join(f'{ms:.3f}' for ms in row) + ' | (not built)')
            continue
        u = torch.randn(B, K * E, L, **dev)
        delta = torch.randn(B, K * E, L, **dev) * 0.1
        Bk = torch.randn(B, K, N, L, **dev)
        Ck = torch.randn(B, K, N, L, **dev)
        AK, DK, bK = A.repeat(K, 1), D.repeat(K), bias.repeat(K)
        row.append(timed(lambda: selective_scan_fn(u, delta, AK, Bk, Ck, DK, None,
                                                   delta_bias=bK, delta_softplus=True,
                                                   backend='cuda')))
        print(f'{L} | ' + ' | '.join(f'{ms:.3f}' for ms in row), flush=True)


PREFIX_CONFIGS = [(64, 64, 4), (64, 32, 4), (32, 32, 4), (32, 32, 2), (16, 32, 2), (32, 16, 2),
                  (16, 16, 1), (32, 64, 8)]


def prefix():
    print('prefix kernel, L survivors of 196 | ' + ' | '.join(map(str, PREFIX_CONFIGS)))
    for L in (117, 70, 42):
        torch.manual_seed(L)
        pos = torch.stack([torch.randperm(H * W, device='cuda')[:L].sort().values
                           for _ in range(B)])
        dt = torch.randn(B, L, E, device='cuda', dtype=torch.bfloat16)
        b1 = torch.rand(E, device='cuda') - 4
        row = [timed(lambda: aligned_prefix(dt, b1, pos, H * W, config=c))
               for c in PREFIX_CONFIGS]
        print(f'{L} | ' + ' | '.join(f'{ms:.3f}' for ms in row), flush=True)


if __name__ == '__main__':
    with torch.no_grad():
        prefix()
        main()
