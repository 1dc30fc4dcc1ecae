"""The sweep's own costs on an ADE20K-shaped synthetic set: cell by cell vs one pass, and where
a cell's time goes (amvim_mm/bench/sweep.py).

    python tools/benchmark_sweep.py [--config CFG] [--images 200] [--work DIR] [--out FILE]
        [--methods tome random evit top] [--ratios 0 0.17 0.27 0.46] [--seeds 0 1 2]
        [--modes pass cell] [--batches 100] [--warmup 8]

Writes FILE (JSON: the modes' wall seconds per cell, their metrics compared, the per-stage
breakdown of an unreduced and a ToMe 0.46 evaluation) and prints it. The model is the config's
with its own random initialisation (timing needs no trained weights). On a GPU the wall
seconds of one process are its GPU-seconds.
"""
import argparse
import json
import os
import os.path as osp
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7

from amvim_mm.apis.cli import run_cli
from amvim_mm.bench.sweep import breakdown, make_ade_like, random_checkpoint, time_modes

DEFAULT_CONFIG = 'configs/vim/vim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code.py'


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--config', default=DEFAULT_CONFIG)
    p.add_argument('--images', type=int, default=200)
    p.add_argument('--classes', type=int, default=150)
    p.add_argument('--work', default='work_dirs/benchmark_sweep')
    p.add_argument('--out', default=None, help='JSON file (default WORK/sweep.json)')
    p.add_argument('--methods', nargs='+', default=['tome', 'random', 'evit', 'top'])
    p.add_argument('--ratios', nargs='+', type=float, default=[0, 0.17, 0.27, 0.46])
    p.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    p.add_argument('--modes', nargs='*', default=['pass', 'cell'], choices=['pass', 'cell'])
    p.add_argument('--batches', type=int, default=100, help='breakdown: batches per reduction')
    p.add_argument('--warmup', type=int, default=8,
                   help='modes: an untimed sweep of the first N images before (kernel compilation)')
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    data = make_ade_like(osp.join(args.work, 'ade_like'), args.images, classes=args.classes)
    ckpt = random_checkpoint(args.config, osp.join(args.work, 'random_init.pth'))
    result = dict(config=args.config, images=args.images)
    if args.batches:
        result['breakdown'] = breakdown(args.config, ckpt, data, args.batches)
        print(json.dumps(result['breakdown'], indent=1), flush=True)
    if args.modes:
        result['modes'] = time_modes(args.config, ckpt, data, args.work, args.methods,
                                     args.ratios, args.seeds, args.modes,
                                     args.warmup)
    out = args.out or osp.join(args.work, 'sweep.json')
    with open(out, 'w') as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != 'breakdown'}, indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
