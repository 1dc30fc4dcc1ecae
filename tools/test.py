"""Test a trained model (mIoU / AP / Top-1 through the libraries' metrics).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options k=v ...]
                         [--reduce tome|random --ratio R] [--launcher ...]

CHECKPOINT is loaded strictly (missing/unexpected keys are reported); official Vim ImageNet
files are converted on the fly for classification configs. ``--reduce`` switches training-free
token reduction on for the test (AMVim protocol at the given ratio). A bad config value,
checkpoint or data path ends with a one-line error (exit 2).
"""
import argparse
import os
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from mmengine.config import DictAction

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.prune_eval import METHODS
from amvim_mm.apis.runner import (add_token_reduction_hook, load_config, load_model_weights,
                                  make_runner)



def parse_args():
    p = argparse.ArgumentParser(description='Test a model')
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('--work-dir')
    p.add_argument('--reduce', choices=sorted(METHODS), help='token reduction method')
    p.add_argument('--ratio', type=float, default=None, help='reduction ratio in [0, 1)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args()
    if (args.reduce is None) != (args.ratio is None):
        p.error('--reduce and --ratio go together')
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main():
    args = parse_args()
    if not os.path.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg = load_config(args.config, args.cfg_options, args.work_dir, args.launcher)
    cfg.load_from = None
    if args.reduce:
        add_token_reduction_hook(cfg, dict(type=METHODS[args.reduce], ratio=args.ratio),
                                 phases=('test', ))
    runner = make_runner(cfg)
    load_model_weights(runner.model, args.checkpoint, strict=True)
    metrics = runner.test()
    print({k: round(float(v), 4) if isinstance(v, (int, float)) or hasattr(v, 'item') else v
           for k, v in metrics.items()})


if __name__ == '__main__':
    sys.exit(run_cli(main))
