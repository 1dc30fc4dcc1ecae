"""PlainMamba-L3's scan of one layer on an H200 (batch 128, E = 896, N = 16, R = 28, bf16
inputs, CUDA graph replays, median of 5 x 20): the snake-scan kernel
(:func:`amvim_mm.ops.plain_scan.snake_scan`) unaligned and with ToP's alignment ('bias' gaps:
the survivors inside each gap summed in the scan; 'token' gaps), each sample keeping its own
random L of the 196 cells, the aligned tables (:func:`~amvim_mm.ops.plain_aligned.snake_gap_tables`)
timed inside the aligned call. Run on the GPU machine after `bash tools/gpu/run.sh none` with
PYTHONPATH=.gpu_build/site:."""
import torch

from amvim_mm.models.backbones.plain_mamba_scan import snake_cell_tables
from amvim_mm.ops.plain_aligned import snake_gap_tables
from amvim_mm.ops.plain_scan import snake_scan

B, K, E, N, R, H, W = 128, 4, 896, 16, 28, 14, 14


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
    print('L | unaligned | aligned bias (tables + scan) | aligned token | survivors in gaps '
          'per step')
    for L in (196, 117, 70, 42):
        torch.manual_seed(L)
        cells = torch.stack([torch.randperm(H * W, device='cuda')[:L].sort().values
                             for _ in range(B)])                              # (B, L)
        rank = torch.gather(steps_tab.unsqueeze(0).expand(B, -1, -1), 2,
                            cells.unsqueeze(1).expand(B, K, L))              # (B, K, L)
        order = rank.argsort(-1)
        perm = order.transpose(0, 1).contiguous()                            # (K, B, L)
        steps = torch.gather(rank, 2, order)
        codes = torch.gather(torch.gather(codes_tab.unsqueeze(0).expand(B, -1, -1), 2,
                                          cells.unsqueeze(1).expand(B, K, L)), 2, order)
        xc = torch.randn(B, L, E, **dev)
        dt = torch.randn(B, L, E, **dev) * 0.5
        x_dbl = torch.randn(B, L, R + 2 * N, **dev)
        q, below = snake_gap_tables(cells, steps, H * W)
        inside = (below - torch.cat([below.new_zeros(B, K, 1), below[..., :-1]
                                     + (q[..., :-1] >= 0)], -1)).float().mean()
        def aligned_bias():
            q2, below2 = snake_gap_tables(cells, steps, H * W)
            return snake_scan(xc, dt, x_dbl, perm, codes, dir_bs, A, bias, D, R, q=q2,
                              steps=steps, below=below2, align='bias')

        row = [timed(lambda: snake_scan(xc, dt, x_dbl, perm, codes, dir_bs, A, bias, D, R)),
               timed(aligned_bias),
               timed(lambda: snake_scan(xc, dt, x_dbl, perm, codes, dir_bs, A, bias, D, R,
                                        q=q, steps=steps, align='token'))]
        print(f'{L} | ' + ' | '.join(f'{ms:.3f}' for ms in row) + f' | {inside:.2f}',
              flush=True)


if __name__ == '__main__':
    with torch.no_grad():
        main()
