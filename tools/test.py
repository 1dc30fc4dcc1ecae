"""Test a trained model (mIoU / AP / Top-1 through the libraries' metrics).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options k=v ...]
        [--reduce tome|random|evit|top --ratio R [--seed S] [--locations B ...]
         | --reduce learned] [--launcher ...]

CHECKPOINT (a path, a URL or a ``torchvision://``-style name, read from torch.hub's cache
through the allow-list loader) is loaded strictly (missing/unexpected keys are reported); official Vim ImageNet
files are converted on the fly for classification configs. A bad config value, checkpoint or
data path, or a bad combination of the options below, ends with a one-line error (exit 2).

``--reduce M`` switches training-free token reduction on for the test with the methods of
``tools/prune_eval.py --methods`` and the same mapping (``amvim_mm.apis.sweep.methods``),
set on the built backbone as the sweep sets it, so the printed metric is that of the sweep's
(M, R) cell: ``tome`` / ``random`` at the ratio (AMVim protocol; ``random`` draws with
``--seed``, default 0, the sweep's default ``--seeds``), ``evit`` / ``top`` at the keep rate
that realises the nearest ratio after ``--locations`` (default ToP-ViM's Tiny blocks scaled to
the depth). ``--ratio 0`` means no reduction. ``--reduce learned`` tests the learned reducer
the config carries (e.g. a ``*_dynamicvit.py`` config) at the ratio it was fine-tuned for, so
it takes no ``--ratio``; the other methods replace that reducer. With ``--reduce`` a
``TokenReductionHook`` of the config is not used.

``--launcher pytorch|slurm|mpi`` (``torchrun --nproc_per_node=N tools/test.py ... --launcher
pytorch``): the test loop is sharded across the processes and the metric computed on rank 0
from every image, as the libraries' own test tools do; the process group is started by
:func:`amvim_mm.apis.dist.init_launcher` (gloo on a CPU), the model is not wrapped in DDP.
"""
import argparse
import os
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from mmengine.config import DictAction

from amvim_mm.apis import dist
from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.sweep.methods import (LEARNED, METHODS, cell_reducer, check_reduction_args,
                                         config_has_learned_reducer, learned_reducer)
from amvim_mm.apis.runner import (check_data_roots, drop_token_reduction_hooks, identify_images,
                                  load_config, load_model_weights, make_runner)
from amvim_mm.engine.hooks import find_reducible_backbone
from amvim_mm.errors import ConfigError
from amvim_mm.utils.remote_checkpoint import scheme_of


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Test a model')
    p.add_argument('config')
    p.add_argument('checkpoint')
    p.add_argument('--work-dir')
    p.add_argument('--reduce', choices=list(METHODS),
                   help='token reduction method (those of prune_eval --methods)')
    p.add_argument('--ratio', type=float, default=None,
                   help='reduction ratio in [0, 1) (0: no reduction); not with learned')
    p.add_argument('--seed', type=int, default=None,
                   help='--reduce random: the seed of the draws (default 0)')
    p.add_argument('--locations', nargs='+', type=int, default=None, metavar='BLOCK',
                   help='--reduce evit/top: the blocks after which they prune (default: '
                        'ToP-ViM\'s Tiny schedule scaled to the depth)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    check_reduction_args(args.reduce, args.ratio, args.seed, args.locations)
    if scheme_of(args.checkpoint) is None and not os.path.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    dist.init_launcher(args.launcher)
    try:
        return _test(args)
    finally:
        dist.shutdown()


def _test(args) -> int:
    # the process group is ours: the runner shards and gathers through it without DDP
    cfg = load_config(args.config, args.cfg_options, args.work_dir)
    check_data_roots(cfg, ('test_dataloader', ), args.config)
    cfg.load_from = None
    if args.reduce == LEARNED and not config_has_learned_reducer(cfg):
        raise ConfigError(f'--reduce learned needs a config whose backbone carries a learned '
                          f'reducer, e.g. configs/demo/*_dynamicvit.py with its fine-tuned '
                          f'checkpoint; {args.config} has none')
    dropped = drop_token_reduction_hooks(cfg) if args.reduce else []
    identify_images(cfg)     # random pruning draws per image, whatever the batch size
    runner = make_runner(cfg)
    load_model_weights(runner.model, args.checkpoint, strict=True)
    if args.reduce:
        backbone = find_reducible_backbone(runner.model)
        reducer = cell_reducer(backbone, args.reduce, args.ratio, args.locations,
                               args.seed or 0, learned=learned_reducer(backbone))
        backbone.set_token_reduction(reducer)
        shown = reducer.config() if hasattr(reducer, 'config') else reducer
        if dist.is_main():
            print(f'--reduce {args.reduce}: test with token reduction {shown}'
                  + (" (the config's TokenReductionHook is not used)" if dropped else ''),
                  flush=True)
    metrics = runner.test()
    if dist.is_main():
        print({k: round(float(v), 4) if isinstance(v, (int, float)) or hasattr(v, 'item')
               else v for k, v in metrics.items()})
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
