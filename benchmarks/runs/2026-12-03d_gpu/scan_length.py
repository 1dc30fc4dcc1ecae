"""mamba-ssm's selective scan at PlainMamba-L3's reduced lengths (one H200, bf16 inputs, CUDA
graph replays): the four snake directions grouped as PlainMamba calls it, batch 128,
K * E = 4 * 896 channels, N = 16, B / C per direction (B, 4, N, L). The kernel runs one chunk
of kNThreads x kNItems steps per sequence (<= 128: 32 x 4, <= 256: 32 x 8, ...), so its work
follows the padded chunk, not L. Run on the GPU machine after `bash tools/gpu/run.sh build-scan`
with PYTHONPATH=.gpu_build/site:."""
import torch

from amvim_mm.ops.backends import mamba_selective_scan

scan = mamba_selective_scan()[0]
assert scan is not None, mamba_selective_scan()[1]
B, K, E, N = 128, 4, 896, 16
rows = []
for L in (196, 117, 70, 42, 128, 129, 64):
    torch.manual_seed(0)
    dev = dict(device='cuda', dtype=torch.bfloat16)
    u = torch.randn(B, K * E, L, **dev)
    delta = torch.randn(B, K * E, L, **dev) * 0.1
    A = -torch.rand(K * E, N, device='cuda') - 0.5
    Bm = torch.randn(B, K, N, L, **dev)
    Cm = torch.randn(B, K, N, L, **dev)
    D = torch.ones(K * E, device='cuda')
    bias = torch.zeros(K * E, device='cuda')

    def run():
        return scan(u, delta, A, Bm, Cm, D, None, delta_bias=bias, delta_softplus=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 20)
    ms = sorted(times)[2]
    rows.append((L, ms))
    print(f'L {L:4d}: {ms:.3f} ms, {ms / L * 1e3:.2f} us per step', flush=True)
base = dict(rows)[196]
print('ratio to L = 196 (time / tokens):', {L: (round(base / ms, 3), round(196 / L, 3))
                                            for L, ms in rows})
