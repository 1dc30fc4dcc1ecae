"""Do reducers decide the same in fp32 and bf16? Decision agreement and metric difference.

    python tools/precision_check.py CONFIG CHECKPOINT [--methods tome] [--ratios 0.27 0.46] \
        [--precisions fp32 bf16] [--out FILE.json] [--threads N] [--cfg-options ...]

For each method and ratio the test set runs once per precision (each test step under
autocast); the table gives the metric, its difference from the first precision and the share
of reduction decisions (merge / prune edges, in grid positions) that agree with it.
"""
import argparse
import json
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from mmengine.config import DictAction

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.sweep import (LEARNED, METHODS, PRECISIONS, PRIMARY_METRICS,
                                 reduction_config)
from amvim_mm.errors import ConfigError


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config')
    p.add_argument('checkpoint')
    # the learned reducer runs at its own ratio, not at --ratios: compare it with prune_eval's
    # --precision rows instead
    p.add_argument('--methods', nargs='+', default=['tome'],
                   choices=[m for m in METHODS if m != LEARNED])
    p.add_argument('--ratios', nargs='+', type=float, default=[0.27, 0.46])
    p.add_argument('--precisions', nargs='+', default=['fp32', 'bf16'], choices=PRECISIONS)
    p.add_argument('--out', help='write the rows as JSON')
    p.add_argument('--threads', type=int, default=None, help='torch.set_num_threads')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    return p.parse_args(argv)


def _main(argv=None) -> int:
    import torch

    from amvim_mm.analysis.precision import compare_precisions
    from amvim_mm.apis.runner import load_config, load_model_weights, make_runner
    from amvim_mm.engine.fileio import atomic_write_bytes
    from amvim_mm.engine.hooks import find_reducible_backbone
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for r in args.ratios:
        if not 0 < r < 1:
            raise ConfigError(f'ratio {r} is outside (0, 1)')
    cfg = load_config(args.config, args.cfg_options, work_dir='work_dirs/precision_check')
    cfg.test_cfg = dict(type='AmpTestLoop', precision='fp32')
    cfg.log_level = 'ERROR'
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=10**9)
    runner = make_runner(cfg)
    load_model_weights(runner.model, args.checkpoint, strict=True)
    bb = find_reducible_backbone(runner.model)
    M, depth = bb.reduction_domain()
    key = PRIMARY_METRICS[cfg.default_scope]
    rows = []
    for method in args.methods:
        for ratio in args.ratios:
            red = reduction_config(method, ratio, M, depth)
            for row in compare_precisions(runner, bb, red, key, args.precisions):
                rows.append(dict(method=method, ratio=ratio, **row))
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    print(f'| method | ratio | precision | {key} | delta | edge agreement | step agreement |')
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        ag = '' if 'edge_agreement' not in r else f"{100 * r['edge_agreement']:.2f} %"
        st = '' if 'step_agreement' not in r else f"{100 * r['step_agreement']:.2f} %"
        d = '' if 'delta' not in r else f"{r['delta']:+.2f}"
        print(f"| {r['method']} | {r['ratio']} | {r['precision']} | {r['metric']:.2f} | {d} | "
              f'{ag} | {st} |')
    print(f'device: {dev}, torch {torch.__version__}')
    if args.out:
        data = dict(config=args.config, checkpoint=args.checkpoint, device=dev,
                    torch=torch.__version__, rows=rows,
                    command='python tools/precision_check.py ' + ' '.join(argv or sys.argv[1:]))
        atomic_write_bytes(json.dumps(data, indent=2).encode(), args.out)
    return 0


def main(argv=None) -> int:
    return run_cli(lambda: _main(argv))


if __name__ == '__main__':
    sys.exit(main())
