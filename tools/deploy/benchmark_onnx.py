"""CPU latency of an exported model in ONNX Runtime next to the same model in PyTorch.

    python tools/deploy/benchmark_onnx.py CONFIG CHECKPOINT MODEL.onnx [--batch 1 8]
        [--rounds 5] [--iters 10] [--threads T] [--reduce ... as tools/test.py]
    python tools/deploy/benchmark_onnx.py --models vim-t vmamba-t plainmamba-l1 vil-t deit-t
        [--res 224] [--batch 1] [--rounds 5] [--iters 3] [--threads T] [--tome R]
        [--out-dir DIR]

The second form exports every named family's ImageNet classifier (random weights) and DeiT-T,
checks each graph once against PyTorch and times all of them in one run, ONNX Runtime and our
PyTorch CPU path in interleaved rounds (:mod:`amvim_mm.deploy.bench_families`); it prints a
table and writes ``onnx_families.json`` / ``.md`` (and the graphs) to ``--out-dir``.

Both run in this process on the same threads (``--threads``, default: torch's count, given to
ONNX Runtime's intra-op pool and to ``torch.set_num_threads``), on the same random images at the
ONNX model's image size. The PyTorch side is the project's default CPU path (the built model in
eval mode under ``torch.inference_mode``: the runtime's CPU kernels). Each round times ``--iters``
calls of ONNX Runtime, then of PyTorch, per batch size (interleaved, so that a change of the
machine's load hits both); one warm-up call each first. Prints per batch size the median over
rounds of the time per call and per image and the ratio PyTorch / ONNX Runtime (> 1: ONNX Runtime
is faster).
"""
import argparse
import statistics
import sys
import time

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7

from amvim_mm.apis.cli import positive_int, run_cli
from amvim_mm.deploy.ort import ort_session, run_onnx
from amvim_mm.deploy.tasks import TaskForward, add_model_args, load_task_model
from amvim_mm.errors import ConfigError


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument('onnx', help='the exported model (tools/deploy/export_onnx.py)')
    p.add_argument('--batch', nargs='+', type=int, default=[1, 8], help='batch sizes')
    p.add_argument('--rounds', type=int, default=5, help='interleaved rounds')
    p.add_argument('--iters', type=int, default=10, help='timed calls per round and side')
    p.add_argument('--threads', type=positive_int, default=None,
                   help='CPU threads of both runtimes')
    args = p.parse_args(argv)
    if min(args.batch) < 1 or args.rounds < 1 or args.iters < 1:
        p.error('--batch, --rounds and --iters take positive integers')
    return args


def timed(fn, iters: int) -> float:
    """Seconds per call of ``fn`` over ``iters`` calls."""
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def measure(forward, session, images, rounds: int, iters: int):
    """{batch: {'onnxruntime': [s per call per round], 'pytorch': [...]}} (interleaved)."""
    import torch
    arrays = {b: x.numpy() for b, x in images.items()}
    sides = {'onnxruntime': lambda b: run_onnx(session, arrays[b]),
             'pytorch': lambda b: forward(images[b])}
    out = {b: {s: [] for s in sides} for b in images}
    with torch.inference_mode():
        for b in images:
            for fn in sides.values():
                fn(b)   # warm-up: first-call allocations and caches
        for _ in range(rounds):
            for b in images:
                for side, fn in sides.items():
                    out[b][side].append(timed(lambda: fn(b), iters))
    return out


def table(results) -> str:
    rows = ['| batch | ONNX Runtime ms/call | PyTorch ms/call | ONNX Runtime ms/image | '
            'PyTorch ms/image | PyTorch / ONNX Runtime |', '|---|---|---|---|---|---|']
    for b, sides in results.items():
        ort_s = statistics.median(sides['onnxruntime'])
        pt_s = statistics.median(sides['pytorch'])
        rows.append(f'| {b} | {ort_s * 1e3:.2f} | {pt_s * 1e3:.2f} | {ort_s * 1e3 / b:.2f} | '
                    f'{pt_s * 1e3 / b:.2f} | {pt_s / ort_s:.2f} |')
    return '\n'.join(rows)


def parse_family_args(argv):
    p = argparse.ArgumentParser(description='every family through ONNX Runtime, PyTorch and '
                                            'DeiT-T in one run')
    p.add_argument('--models', nargs='+', required=True,
                   help='bench model names (vim-t, vmamba-t, plainmamba-l1, vil-t, ...) and '
                        'deit-t')
    p.add_argument('--res', type=positive_int, default=224, help='image size')
    p.add_argument('--batch', type=positive_int, default=1, help='batch (fixed in the graphs)')
    p.add_argument('--rounds', type=positive_int, default=5, help='interleaved rounds')
    p.add_argument('--iters', type=positive_int, default=3,
                   help='timed calls per round, model and side')
    p.add_argument('--threads', type=positive_int, default=None,
                   help='CPU threads of both runtimes')
    p.add_argument('--tome', type=float, default=None, metavar='R',
                   help='also each of our models with ToMe at ratio R (its export\'s speed-up '
                        'against its FLOPs ratio)')
    p.add_argument('--out-dir', default='work_dirs/deploy/families',
                   help='the graphs and onnx_families.json / .md')
    return p.parse_args(argv)


def families_main(argv) -> int:
    import json
    import os
    from amvim_mm.bench.measure import table as md_table
    from amvim_mm.deploy.bench_families import COLUMNS, run_families
    from amvim_mm.engine.fileio import atomic_write_bytes
    args = parse_family_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = run_families(args.models, args.out_dir, res=args.res, batch=args.batch,
                        rounds=args.rounds, iters=args.iters, threads=args.threads,
                        tome=args.tome, log=lambda m: print(m, file=sys.stderr, flush=True))
    command = 'python tools/deploy/benchmark_onnx.py ' + ' '.join(argv)
    md = (f'`{command}`\n\n{args.res}x{args.res}, batch {args.batch}, {rows[0]["threads"]} '
          f'thread(s), {args.rounds} interleaved rounds x {args.iters} calls, medians (ms per '
          f'call)\n\n' + md_table(rows, COLUMNS))
    atomic_write_bytes(json.dumps(dict(command=command, rows=rows), indent=1).encode(),
                       os.path.join(args.out_dir, 'onnx_families.json'))
    atomic_write_bytes(md.encode(), os.path.join(args.out_dir, 'onnx_families.md'))
    print(md)
    return 0


def main(argv=None) -> int:
    import torch
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--models' in argv:
        return families_main(argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = args.threads or torch.get_num_threads()
    session = ort_session(args.onnx, threads, spin=False)
    shape = session.get_inputs()[0].shape
    fixed = shape[0] if isinstance(shape[0], int) else None
    if fixed is not None and any(b != fixed for b in args.batch):
        asked = ' '.join(map(str, args.batch))
        raise ConfigError(f'the ONNX model was exported with a fixed batch of {fixed}; export '
                          f'with a dynamic deploy config for --batch {asked}')
    cfg, model = load_task_model(args)
    forward = TaskForward(model, cfg.default_scope, (shape[2], shape[3])).eval()
    gen = torch.Generator().manual_seed(0)
    images = {b: torch.randn(b, 3, shape[2], shape[3], generator=gen) for b in args.batch}
    results = measure(forward, session, images, args.rounds, args.iters)
    print(f'{args.onnx}: {shape[2]}x{shape[3]}, {threads} thread(s), {args.rounds} rounds x '
          f'{args.iters} calls, medians over rounds')
    print(table(results))
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
