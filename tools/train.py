"""Train a model from a config (mmseg, mmdet or mmpretrain; the config's default_scope decides).

Same flags as the libraries' own train.py:
    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
                                 [--cfg-options k=v ...] [--launcher none|pytorch|slurm|mpi]
Multi-GPU: torchrun --nproc_per_node=N tools/train.py CONFIG --launcher pytorch
Checkpoints are written atomically; --resume with no path resumes the latest complete one of the
work dir. A bad config value, checkpoint or data path ends with a one-line error (exit 2).
"""
import argparse
import os
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from mmengine.config import DictAction

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.runner import (check_data_roots, enable_amp, load_config, make_runner,
                                  train_loaders)
from amvim_mm.engine.checkpoint_hook import latest_checkpoint


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Train a model')
    p.add_argument('config', help='train config file path')
    p.add_argument('--work-dir', help='the dir to save logs and models')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from the given checkpoint, or from the latest one in the work '
                        'dir when no path is given')
    p.add_argument('--amp', action='store_true', help='mixed precision training (bf16)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override settings of the config, xxx=yyy format')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, args.work_dir, args.launcher)
    check_data_roots(cfg, train_loaders(cfg), args.config)
    if args.amp:
        enable_amp(cfg)
    if args.resume == 'auto':
        cfg.resume = True
        # the newest complete checkpoint (also when mmengine's own hook left last_checkpoint
        # naming a deleted file); none: training starts from the beginning
        cfg.load_from = latest_checkpoint(cfg.work_dir)
    elif args.resume is not None:
        if not os.path.isfile(args.resume):
            raise FileNotFoundError(f'--resume: checkpoint not found: {args.resume}')
        cfg.resume = True
        cfg.load_from = args.resume
    runner = make_runner(cfg)
    runner.train()


if __name__ == '__main__':
    sys.exit(run_cli(main))
