"""Training-free token-reduction sweep for one or several models side by side.

    python tools/prune_eval.py CONFIG CHECKPOINT [CONFIG CHECKPOINT ...] \
        --methods tome random evit top --ratios 0 0.17 0.27 0.36 0.46 [--out-dir DIR] \
        [--names A B] [--precision fp32|bf16|fp16] [--seeds 0 1 2] [--locations 9 19] \
        [--flops-convention mamba|mmengine|localmamba] [--measure-speed]

Prints the verdicts first (with --groups: each architecture's robustness AUC and the
Holm-adjusted differences between architectures, docs/statistics.md), then the architectures'
table and the per-checkpoint table (metric with its 95 % bootstrap interval over images, drop vs
ratio 0 with its paired interval, GFLOPs, realised ratio, img/s with --measure-speed). Writes to
DIR: results.json, per_image/ (the per-image statistics behind the intervals), summary.md (the
verdicts, every cell, what each interval rests on), checkpoint_differences.md (each pair of
checkpoints on the same images, unadjusted; on the screen too without --groups),
prune_eval.png (metric vs realised ratio; per architecture with its checkpoints thin under
--groups), prune_eval_forest.png (every architecture difference with its interval at the
verdict's level and the equivalence margin as a band) and prune_eval_warnings.log (the
libraries' warnings, kept off the progress bar; --verbose shows them). ToMe and random pruning take the ratio directly (AMVim
protocol); EViT and ToP prune after --locations (default: ToP-ViM's Tiny blocks scaled to the
depth) at the keep rate that realises the nearest ratio. Random pruning runs once per --seeds
entry (mean, spread and intervals over the seeds' mean). --precision runs each test step under
autocast to that dtype (ToMe's matching stays fp32).
An interrupted sweep keeps what it finished; running the same command again resumes it.
Rows are reused only for the same checkpoint file content and loaded config (sha256 of both,
stored in each row); rows of the same model name from another checkpoint or config are
recomputed and replaced. Several sweeps may write into one --out-dir at the same time (e.g. one
per method): every write merges into results.json under a lock, so each keeps the others' rows.

--threads N calls torch.set_num_threads(N) before the sweep. Without it torch keeps its default
(OMP_NUM_THREADS if set, else one thread per core); when several processes share the cores,
give each e.g. --threads 1 (or OMP_NUM_THREADS=1), since spinning OpenMP threads of competing
processes make a sweep many times slower.
--jobs J evaluates J models at a time, each in a worker process with N // J threads (N: --threads
or torch's default), one model after another per worker; the rows are merged into results.json
as one process's are, and the final pass (intervals, table, plots) runs here. On a CPU the
models of a demo-sized sweep evaluate faster side by side on one thread each than one after
another on every core (small batches do not spread over threads well).

Each model's cells are evaluated in one pass over the test data (every batch read and
preprocessed once, each cell's reducer and metric on it); --cell-by-cell runs the config's test
loop once per cell instead (the same rows). --launcher pytorch|slurm|mpi runs the sweep on many
GPUs / nodes as mmseg's tools/test.py does (torchrun --nproc_per_node=8 tools/prune_eval.py ...
--launcher pytorch): every test loop is sharded across the processes, rank 0 gathers the
per-image results and writes the same files a single process would (docs/token_reduction.md,
"A full study on N GPUs").
"""
import argparse
import os
import os.path as osp
import sys

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from mmengine.config import DictAction

from amvim_mm.apis import dist
from amvim_mm.apis.cli import positive_int, run_cli
from amvim_mm.analysis.flops import CONVENTIONS
from amvim_mm.apis.sweep import (METHODS, PRECISIONS, checkpoint_differences, group_table,
                                 markdown_table, plot, plot_forest, run_sweep, summary_markdown,
                                 verdict_table)
from amvim_mm.apis.sweep.run import WARNINGS_LOG
from amvim_mm.engine.fileio import atomic_write_bytes



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('pairs', nargs='+', metavar='CONFIG CHECKPOINT',
                   help='one or more config/checkpoint pairs')
    p.add_argument('--methods', nargs='+', default=['tome', 'random'], choices=list(METHODS))
    p.add_argument('--ratios', nargs='+', type=float, default=[0, 0.17, 0.27, 0.36, 0.46])
    p.add_argument('--out-dir', default='work_dirs/prune_eval')
    p.add_argument('--names', nargs='+', help='display names of the models')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='overrides applied to every config')
    p.add_argument('--precision', default='fp32', choices=PRECISIONS,
                   help='autocast dtype of every test step (recorded in the rows)')
    p.add_argument('--seeds', nargs='+', type=int, default=[0],
                   help='seeds of the random methods (the row is their mean)')
    p.add_argument('--locations', nargs='+', type=int, default=None, metavar='BLOCK',
                   help='EViT/ToP: the blocks after which they prune (default: ToP-ViM\'s '
                        'Tiny schedule, after 0-based blocks 9 and 19 of 24, scaled)')
    p.add_argument('--flops-convention', default='mamba', choices=list(CONVENTIONS),
                   help="'mmengine' matches the libraries' get_flops tools")
    p.add_argument('--measure-speed', action='store_true',
                   help='backbone throughput of every cell on the present device')
    p.add_argument('--groups', nargs='+', metavar='GROUP',
                   help='one group name per model (e.g. vim vim vim amvim amvim amvim for '
                        'three training seeds each): adds the groups\' table with intervals '
                        'over images and models')
    p.add_argument('--margin', type=float, default=None,
                   help='equivalence margin of the verdicts, in the metric\'s unit (default: '
                        '1 point of mIoU / top-1, 0.01 of box AP; docs/statistics.md)')
    p.add_argument('--replicates', type=positive_int, default=1000,
                   help='bootstrap replicates for the intervals')
    p.add_argument('--verbose', action='store_true', help='keep the runners\' logs')
    p.add_argument('--threads', type=positive_int, default=None, metavar='N',
                   help='torch.set_num_threads(N) (default: leave torch\'s default)')
    p.add_argument('--jobs', type=positive_int, default=1, metavar='J',
                   help='evaluate J models at a time in worker processes, each with '
                        'threads // J threads (default 1: one process)')
    p.add_argument('--cell-by-cell', action='store_true',
                   help='run the test loop once per cell instead of one pass over the data '
                        'per model (the same rows)')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                   help='distributed run (torchrun: pytorch), as the libraries\' test tools')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = p.parse_args(argv)
    if len(args.pairs) % 2:
        p.error(f'expected CONFIG CHECKPOINT pairs, got {len(args.pairs)} paths')
    args.models = list(zip(args.pairs[0::2], args.pairs[1::2]))
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None) -> int:
    """The tool; a user error ends as one ``error:`` line and exit code 2."""
    return run_cli(lambda: _sweep(argv))


def _sweep(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        import torch
        torch.set_num_threads(args.threads)
    try:
        data = run_sweep(args.models, args.methods, args.ratios, args.out_dir,
                         names=args.names, cfg_options=args.cfg_options, verbose=args.verbose,
                         precision=args.precision, seeds=args.seeds, locations=args.locations,
                         flops_convention=args.flops_convention,
                         measure_speed=args.measure_speed, replicates=args.replicates,
                         groups=args.groups, jobs=args.jobs, margin=args.margin,
                         launcher=args.launcher, one_pass=not args.cell_by_cell)
        if dist.is_main():
            _report(data, args, argv)
    finally:
        dist.shutdown()
    return 0


def _report(data, args, argv) -> None:
    """Rank 0: the verdicts first on the screen, then the architectures and the checkpoints;
    summary.md, checkpoint_differences.md and the plots next to results.json."""
    for table in (verdict_table(data), group_table(data), markdown_table(data, differences=False)):
        if table:
            print(table + '\n')
    out = args.out_dir
    command = 'python tools/prune_eval.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    files = dict(results=osp.join(out, 'results.json'), summary=osp.join(out, 'summary.md'))
    atomic_write_bytes(summary_markdown(data, command=command).encode(), files['summary'])
    diffs = checkpoint_differences(data)
    if diffs:
        files['checkpoint differences'] = osp.join(out, 'checkpoint_differences.md')
        atomic_write_bytes(diffs.encode(), files['checkpoint differences'])
        if not (data.get('meta') or {}).get('groups'):     # the only comparison there is
            print(diffs.split('\n', 2)[2] + '\n')
    files['plot'] = plot(data, osp.join(out, 'prune_eval.png'))
    forest = plot_forest(data, osp.join(out, 'prune_eval_forest.png'))
    if forest:
        files['forest plot'] = forest
    warned = osp.join(out, WARNINGS_LOG)
    if osp.isfile(warned) and osp.getsize(warned):
        files['library warnings'] = warned
    width = max(map(len, files)) + 1
    for what, path in files.items():
        print(f'{what + ":":<{width}} {path}')
    print(f"FLOPs convention: {data['meta']['convention']}")

if __name__ == '__main__':
    sys.exit(main())
