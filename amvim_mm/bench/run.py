"""What ``tools/benchmark.py`` runs: the cpu, gpu or dense suite, then its results file
(``benchmark_<suite>.json``) and markdown (``benchmark_<suite>.md``) in ``--out-dir``."""
from __future__ import annotations

import json
import os
import os.path as osp
import sys
from argparse import Namespace

import torch

from amvim_mm.errors import ConfigError

from . import cpu as CB
from . import dense as DB
from . import measure as B
from . import official_vim as OV
from . import official_vil as OVIL
from . import official_vmamba as OVM
from .gpu import GPU_PARTS
from .gpu.common import log
from .markdown import results_markdown

#: the options of the dense suite only (``args`` attributes)
DENSE_OPTIONS = ('workloads', 'whole_sizes', 'budget_s', 'repeats', 'warmup', 'train_iters',
                 'infer_iters', 'infer_modes', 'impls', 'dense_dtype', 'dense_models', 'methods',
                 'ratios')


def cpu_suite(args: Namespace) -> dict:
    """The CPU suite (:mod:`amvim_mm.bench.cpu`)."""
    return CB.run_cpu_suite(args.cpu_threads, iters=args.cpu_iters, repeats=args.cpu_repeats,
                            rows=CB.ROW_SETS[args.cpu_rows], log=log)


def _dense_options(args: Namespace) -> dict:
    """The dense suite's options; a one-line :class:`ConfigError` when one is given to another
    suite."""
    opts = {k: getattr(args, k) for k in DENSE_OPTIONS}
    if args.suite != 'dense':
        given = [k for k, v in opts.items() if v is not None] + (['smoke'] if args.smoke else [])
        if given:
            raise ConfigError(f'--{given[0].replace("_", "-")} belongs to --suite dense')
    return opts


def _timed_suite(args: Namespace, command: str) -> dict:
    """Run the cpu suite or the chosen gpu parts; the result dict (command, environment and
    one entry per part)."""
    if args.official_vim:
        OV.official_module(args.official_vim)   # a wrong path fails now, not after the tunes
    if args.official_vmamba:
        OVM.official_module(args.official_vmamba)
    if args.official_vil:
        OVIL.official_package(args.official_vil)
    os.makedirs(args.out_dir, exist_ok=True)
    result = dict(command=command, environment=B.environment())
    log(f'environment: {result["environment"]}')
    if args.suite == 'cpu':
        result['cpu'] = cpu_suite(args)
    else:
        for part, title, fn in GPU_PARTS:    # in this order (tunes first: later parts use them)
            if part in args.parts:
                if title:
                    log(f'{part}: {title}')
                result[part.replace('-', '_')] = fn(args)
    return result


def run_benchmark(args: Namespace, command: str, root: str) -> int:
    """Run the suite ``args.suite`` with the options of ``tools/benchmark.py``; ``command``
    is recorded in the results, ``root`` is the checkout (the dense suite reads its configs).
    Writes the results to ``args.out_dir`` and prints the markdown; the exit status."""
    dense_opts = _dense_options(args)
    if args.suite == 'dense':
        dense_opts['models'] = dense_opts.pop('dense_models')
        result = DB.run_dense(out_dir=args.out_dir, root=root, command=command,
                              smoke=args.smoke, log=log, **dense_opts)
        print(DB.markdown(result))
        return 0
    if args.suite == 'gpu' and not torch.cuda.is_available():
        print('error: --suite gpu needs a CUDA device', file=sys.stderr)
        return 2
    result = _timed_suite(args, command)
    with open(osp.join(args.out_dir, f'benchmark_{args.suite}.json'), 'w') as f:
        json.dump(result, f, indent=2)
    md = results_markdown(args.suite, result)
    with open(osp.join(args.out_dir, f'benchmark_{args.suite}.md'), 'w') as f:
        f.write(md + '\n')
    print(md)
    return 0
