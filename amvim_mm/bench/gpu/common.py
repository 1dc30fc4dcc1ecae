"""What the GPU suite's parts share: the progress log, one failing case recorded instead of
raised, speed-up rows, the reduction variants' switch, the mixer switches, CUDA-graph timing
and kernel profiles."""
from __future__ import annotations

import torch

from amvim_mm import runtime

from .. import measure as B

RATIOS = (0.0, 0.17, 0.27, 0.36, 0.46)
MIXERS = {'fused': True, 'unfused': False}


def variant_env(variant):
    """The reduction variant's switch: 'torch-match' matches and orders reduced paths with
    PyTorch ops (AMVIM_FUSED_REDUCTION_KERNELS=0), 'default' with the Triton kernels."""
    return runtime.override(reduction_kernels=variant != 'torch-match')


def log(msg):
    print(msg, flush=True)


def graph_us(fn) -> float:
    """Microseconds per call of ``fn``, timed as CUDA-graph replays (eager calls of a Triton
    kernel are bound by its Python launch, whatever the kernel: benchmarks/README.md)."""
    graph, _ = B.capture_cuda_graph(fn, warmup=3)
    times = [B._timer(graph.replay, 200, 'cuda') for _ in range(3)]
    return round(sorted(times)[1] * 1e6, 2)


def bf16_profile(m, x, rows: int, width: int) -> str:
    """The top CUDA kernels of one bf16 forward of ``m`` on ``x`` (after 3 warm-up calls)."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            m(x)
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by='cuda_time_total', row_limit=rows,
                                     max_name_column_width=width)


def add_speedup(r: dict, base: dict) -> None:
    """Add the speed-up over ``base``, the FLOPs ratio and their quotient to row ``r`` (when
    both were measured)."""
    if r.get('img_per_s') and base.get('img_per_s'):
        r['speedup'] = round(r['img_per_s'] / base['img_per_s'], 3)
        r['flops_ratio'] = round(base['gflops'] / r['gflops'], 3)
        r['speedup_over_ideal'] = round(r['speedup'] / r['flops_ratio'], 3)


def attempt(fn, *args, **kwargs):
    """A measurement, or ``{'error': ...}`` (one failing case must not lose the run)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:   # noqa: BLE001  (recorded in the results, named in the log)
        torch.cuda.empty_cache()
        return dict(error=f'{type(e).__name__}: {str(e).splitlines()[0][:300]}')
