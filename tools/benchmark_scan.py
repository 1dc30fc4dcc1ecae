"""Time the selective scan's ``torch`` and ``cpu`` (compiled) backends against the sequential
``reference`` on the CPU.

Forward only, a Vim-T layer shape by default (batch 2, E = 384, N = 16, L = 197, fp32). The
backends run in the same process on the same inputs, interleaved, after a warm-up; the median
of the repeats and the spread are reported, and the ratios ``reference / torch`` and
``torch / cpu`` (> 1 means the second is faster). The ``cpu`` row is left out (named) when the
compiled kernels are not built. Results go to a JSON file (``--out``).

Example::

    python tools/benchmark_scan.py --out benchmarks/scan_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

import amvim_mm.ops as ops
from amvim_mm.ops import cpu_ops


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--batch', type=int, default=2)
    p.add_argument('--dim', type=int, default=384, help='E (d_inner); Vim-T: 384')
    p.add_argument('--dstate', type=int, default=16, help='N; Vim: 16')
    p.add_argument('--length', type=int, default=197, help='L; Vim-T at 224: 197')
    p.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
    p.add_argument('--repeats', type=int, default=30, help='timed calls per backend')
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--threads', type=int, default=None,
                   help='torch.set_num_threads (default: leave torch\'s default)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default='benchmarks/scan_cpu.json')
    return p.parse_args(argv)


def make_inputs(args: argparse.Namespace) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    b, e, n, l = args.batch, args.dim, args.dstate, args.length

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    # like a Vim layer: A = -exp(A_log) with A_log = log(1..N), dt_bias = softplus^-1(dt)
    a_log = torch.log(torch.arange(1, n + 1, dtype=torch.float32)).expand(e, n)
    dt = torch.exp(torch.rand(e, generator=g) * (torch.log(torch.tensor(0.1)) -
                                                  torch.log(torch.tensor(1e-3))) +
                   torch.log(torch.tensor(1e-3)))
    x = dict(u=rnd(b, e, l).to(dtype), delta=rnd(b, e, l).to(dtype), A=-torch.exp(a_log),
             B=rnd(b, n, l).to(dtype), C=rnd(b, n, l).to(dtype), D=torch.ones(e),
             z=rnd(b, e, l).to(dtype), delta_bias=dt + torch.log(-torch.expm1(-dt)))
    return x


def cpu_model() -> str:
    """The CPU's model name (Linux), else ``platform.processor()``."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def time_calls(fns: Dict[str, Callable[[], torch.Tensor]], repeats: int,
               warmup: int) -> Dict[str, List[float]]:
    """Interleaved timing (seconds per call) so that machine noise hits both alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = make_inputs(args)
    kw = dict(D=x['D'], z=x['z'], delta_bias=x['delta_bias'], delta_softplus=True)
    pos = (x['u'], x['delta'], x['A'], x['B'], x['C'])
    fns = {
        'reference': lambda: ops.selective_scan_ref(*pos, **kw),
        'torch': lambda: ops.selective_scan_torch(*pos, **kw),
    }
    cpu_ok, cpu_why = cpu_ops.available()
    if cpu_ok:
        fns['cpu'] = lambda: ops.selective_scan_fn(*pos, **kw, backend='cpu')
    errs = {}
    with torch.inference_mode():
        y_ref = fns['reference']()
        for name in fns:
            if name != 'reference':
                errs[name] = ((fns[name]().double() - y_ref.double()).abs().max() /
                              y_ref.double().abs().max()).item()
        times = time_calls(fns, args.repeats, args.warmup)
        err = errs['torch']

    stats = {}
    for name, ts in times.items():
        ms = [t * 1e3 for t in ts]
        stats[name] = dict(median_ms=statistics.median(ms), min_ms=min(ms), max_ms=max(ms),
                           stdev_ms=statistics.stdev(ms) if len(ms) > 1 else 0.0)
    ratio = stats['reference']['median_ms'] / stats['torch']['median_ms']
    result = dict(
        op='selective_scan forward (delta_softplus, D, z, delta_bias)',
        shape=dict(batch=args.batch, E=args.dim, N=args.dstate, L=args.length),
        dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
        backends=stats,
        speedup_torch_over_reference=ratio,
        max_rel_err_torch_vs_reference=err,
        speedup_cpu_over_torch=(stats['torch']['median_ms'] / stats['cpu']['median_ms']
                                if cpu_ok else None),
        max_rel_err_cpu_vs_reference=errs.get('cpu'),
        cpu_backend='built' if cpu_ok else cpu_why,
        env=dict(torch=torch.__version__, python=platform.python_version(),
                 machine=platform.machine(), cpu_model=cpu_model(),
                 cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
                 loadavg_1_5_15=list(os.getloadavg()) if hasattr(os, 'getloadavg') else None),
        command=' '.join(['python', sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
    )
    for name, s in stats.items():
        print(f'{name:>9}: median {s["median_ms"]:8.2f} ms  (min {s["min_ms"]:.2f}, '
              f'max {s["max_ms"]:.2f}, stdev {s["stdev_ms"]:.2f})')
    print(f'speed-up torch over reference: {ratio:.2f}x  (max rel err {err:.2e}, '
          f'{torch.get_num_threads()} threads, load {result["env"]["loadavg_1_5_15"]})')
    if cpu_ok:
        print(f'speed-up cpu (compiled) over torch: {result["speedup_cpu_over_torch"]:.2f}x  '
              f'(max rel err vs reference {errs["cpu"]:.2e})')
    else:
        print(f'cpu (compiled) backend left out: {cpu_why}')
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + '\n')
    print(f'wrote {out}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
