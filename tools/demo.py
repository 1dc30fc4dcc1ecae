"""The README's main job: how well do Vim, AMVim and PlainMamba survive token reduction? (CPU)

Three tasks on the built-in toy shapes (segmentation: mIoU, detection: COCO box AP,
classification: top-1), each with a Vim and an AMVim demo model (and, for segmentation, a
PlainMamba one and a Vim with Segmenter's mask head on its kept tokens) trained with several
seeds (SEEDS); no downloads.
Steps (each shown as it runs):
  1. check the environment;
  2. generate the three versions of the toy-shapes data (cached in data/);
  3. take the 32 demo checkpoints that the project's own demo training produced
     (checkpoints/demo, checked against checkpoints/demo/SHA256SUMS), or train the missing ones
     with tools/train.py (an interrupted training resumes; --train retrains all; about 6-9 min
     each on one core);
  4. run tools/prune_eval.py per task on its checkpoints with ToMe, random pruning (three
     pruning seeds, masks drawn per image), EViT and ToP at ratios 0 / 0.27 / 0.46, and print
     per task the robustness AUC of every architecture with each one's difference to Vim and
     its verdict, then the table per cell (mean over the training seeds, 95 % intervals
     over seeds and images, absolute and relative drops, differences to Vim with verdicts
     Holm-adjusted in one family per task, intervals at the verdicts' levels;
     docs/statistics.md); JSON, per-checkpoint tables and plots go to --out-dir (default
     outputs/demo), a summary to OUT/summary.md.

    python tools/demo.py [--train] [--jobs N] [--out-dir DIR] [--quick] [--families vil amvil]
    python tools/demo.py --data-only     # step 2 alone: the data of the demo configs, seconds

``--families vil amvil`` adds the Vision-LSTM demo models (ViL, AMViL) to the segmentation
task; their checkpoints are not shipped, so the first such run trains them (ten trainings).

Threads: one child process at a time gets every core (OMP_NUM_THREADS = cores); with
``--jobs N`` trainings run N at a time with cores // N threads each (two torch processes that
both spin on all cores run many times slower). Each sweep evaluates one model per core at a
time (``prune_eval --jobs cores``, one thread each: the demo's batches of 8 small images do
not spread over threads well; one process with ``--quick``); the tables are the same as one
process's. ``--quick`` is the shortened end-to-end run used by the tests (tiny data, a few
training iterations, one seed, two ratios): its numbers mean nothing.
"""
import argparse
import hashlib
import os
import os.path as osp
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: training seeds per architecture and task: five for segmentation (the main task); three for
#: detection and classification (their fourth and fifth seeds are not trained yet)
SEEDS = {'segmentation': (0, 1, 2, 3, 4), 'detection': (0, 1, 2), 'classification': (0, 1, 2)}
#: random pruning's seeds (an image's value is its mean over them)
PRUNING_SEEDS = (0, 1, 2)
# task -> (data root, generator name, its sizes, metric, models: (name, config))
TASKS = {
    'segmentation': ('data/toy_shapes', 'make_toy_shapes', dict(num_train=400, num_val=100),
                     'mIoU', [
                         ('vim-demo', 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_'
                                      'toyshapes-64x64.py'),
                         ('amvim-demo', 'configs/demo/amvim-demo_pyramid_upernet_1xb8-2k_'
                                        'toyshapes-64x64.py'),
                         ('plainmamba-demo', 'configs/demo/plainmamba-demo_pyramid_upernet_'
                                             '1xb8-2k_toyshapes-64x64.py'),
                         # Segmenter's mask transformer on Vim's kept tokens (no restore
                         # before the head): its drop next to the UperNets'
                         ('vim-demo-segmenter', 'configs/demo/vim-demo_segmenter-mask_1xb8-2k_'
                                                'toyshapes-64x64.py')]),
    'detection': ('data/toy_shapes_coco', 'make_toy_shapes_coco',
                  dict(num_train=400, num_val=100), 'box AP', [
                      ('vim-demo-det', 'configs/demo/vim-demo_sfp_retinanet_1xb8-2k_'
                                       'toyshapes-64x64.py'),
                      ('amvim-demo-det', 'configs/demo/amvim-demo_sfp_retinanet_1xb8-2k_'
                                         'toyshapes-64x64.py')]),
    'classification': ('data/toy_shapes_cls', 'make_toy_shapes_cls',
                       dict(num_train=2000, num_val=100), 'top-1', [
                           ('vim-demo-cls', 'configs/demo/vim-demo_linear_1xb8-2k_'
                                            'toyshapes-64x64.py'),
                           ('amvim-demo-cls', 'configs/demo/amvim-demo_linear_1xb8-2k_'
                                              'toyshapes-64x64.py')]),
}
#: families the segmentation task adds on request (``--families``): their demo checkpoints are
#: not shipped, so the first run trains them (five seeds each, about 6-9 min a training on one
#: core): outside the default demo's 10-minute budget
EXTRA_FAMILIES = {
    'vil': ('vil-demo', 'configs/demo/vil-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
    'amvil': ('amvil-demo', 'configs/demo/amvil-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
}
# the dataloaders whose data_root --quick points at its own small data
DATA_KEYS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
CKPT_DIR = 'checkpoints/demo'
SUMS = osp.join(CKPT_DIR, 'SHA256SUMS')


def task_models(task: str, families=()) -> list:
    """The (name, config) pairs of ``task``: its own, plus for segmentation the demo models of
    ``families`` (names of :data:`EXTRA_FAMILIES`)."""
    models = list(TASKS[task][4])
    if task == 'segmentation':
        models += [EXTRA_FAMILIES[f] for f in families]
    return models


def step(msg: str) -> None:
    print(f'\n== {msg}', flush=True)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


def read_sums() -> dict:
    if not osp.isfile(SUMS):
        return {}
    out = {}
    with open(SUMS) as f:
        for line in f:
            if line.strip() and not line.startswith('#'):
                digest, name = line.split()
                out[name] = digest
    return out


def write_sums(sums: dict) -> None:
    from amvim_mm.engine.fileio import atomic_write_bytes
    text = ('# sha256 of the demo checkpoints; made by `python tools/demo.py --train` '
            '(python tools/train.py CONFIG --cfg-options randomness.seed=S, weights exported)\n'
            + ''.join(f'{v}  {k}\n' for k, v in sorted(sums.items())))
    atomic_write_bytes(text.encode(), SUMS)


def export_weights(src: str, dst: str, config: str, command: str) -> None:
    """Keep only the model weights (and provenance) of a training checkpoint, with the weights'
    SHA-256 in ``meta`` so that every later load of the file verifies them (not only this
    script's SHA256SUMS check)."""
    import io

    import torch

    from amvim_mm.engine.fileio import atomic_write_bytes
    from amvim_mm.utils.safe_load import load_checkpoint_file, mark_weights
    ck = load_checkpoint_file(src)
    meta = mark_weights(dict(config=config, command=command, iter=ck.get('meta', {}).get('iter')),
                        ck['state_dict'])
    buf = io.BytesIO()
    torch.save(dict(state_dict=ck['state_dict'], meta=meta), buf)
    atomic_write_bytes(buf.getvalue(), dst)


def child_env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env['PYTHONPATH'] = ROOT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
    return env


def train(name: str, config: str, work_dir: str, seed: int, threads: int,
          extra_opts=()) -> str:
    cmd = [sys.executable, 'tools/train.py', config, '--work-dir', work_dir,
           '--cfg-options', f'randomness.seed={seed}', *extra_opts]
    if osp.isfile(osp.join(work_dir, 'last_checkpoint')):
        cmd.append('--resume')        # an interrupted training continues where it stopped
    print('   $ ' + ' '.join(cmd), flush=True)
    t = time.time()
    log = osp.join(work_dir + '.log')
    os.makedirs(osp.dirname(log), exist_ok=True)
    with open(log, 'w') as f:
        rc = subprocess.call(cmd, cwd=ROOT, env=child_env(threads), stdout=f,
                             stderr=subprocess.STDOUT)
    if rc:
        raise RuntimeError(f'training {name} seed {seed} failed (exit {rc}); see {log}')
    print(f'   trained {name} seed {seed} in {time.time() - t:.0f} s', flush=True)
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return f.read().strip()


def ckpt_path(name: str, seed: int) -> str:
    return osp.join(CKPT_DIR, f'{name}-seed{seed}_toyshapes-64x64.pth')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--train', action='store_true', help='retrain all demo checkpoints')
    p.add_argument('--jobs', type=int, default=1, help='trainings run at the same time')
    p.add_argument('--out-dir', default='outputs/demo')
    p.add_argument('--quick', action='store_true', help='shortened run for tests')
    p.add_argument('--data-only', action='store_true',
                   help='only generate the toy-shapes data (step 2: data/toy_shapes*, what '
                        'the configs in configs/demo read; with --quick tiny sets under '
                        '--out-dir) and exit')
    p.add_argument('--families', nargs='+', default=[], choices=sorted(EXTRA_FAMILIES),
                   help='add these families to the segmentation task (their checkpoints '
                        'are trained on the first run: long)')
    args = p.parse_args(argv)
    os.chdir(ROOT)
    if args.data_only:
        step('built-in toy-shapes data (segmentation, detection, classification)')
        try:
            make_data(args.quick, args.out_dir)
        except ImportError as err:   # not the set-up's environment
            print(f'error: {err}; run it with the set-up\'s .venv/bin/python (`bash run.sh '
                  'demo` creates .venv)', file=sys.stderr)
            return 2
        print('   done' + ('' if args.quick else ': tools/train.py and tools/test.py find it '
                             'for the configs in configs/demo, run from the repository root'))
        return 0
    t0 = time.time()
    cores = os.cpu_count() or 1
    jobs = max(1, min(args.jobs, cores))

    step('1/4 environment check')
    rc = subprocess.call([sys.executable, 'tools/check_env.py', '--quiet'],
                         env=child_env(cores))
    if rc:
        print('environment check failed: run `bash tools/setup_env.sh`', file=sys.stderr)
        return rc
    print('   ok')

    step('2/4 built-in toy-shapes data (segmentation, detection, classification)')
    opts = make_data(args.quick, args.out_dir)

    step('3/4 demo checkpoints (Vim, AMVim, PlainMamba, Vim + Segmenter head; seeds ' +
         ('0' if args.quick else '; '.join(f'{t} {", ".join(map(str, s))}'
                                           for t, s in SEEDS.items())) + ')')
    seeds_of = {t: (0, ) if args.quick else SEEDS[t] for t in TASKS}
    ckpts = checkpoints(args, seeds_of, opts, cores, jobs)
    if ckpts is None:
        return 1

    step('4/4 training-free token reduction sweeps (tools/prune_eval.py), one per task')
    rc = sweeps(args, seeds_of, ckpts, opts, cores)
    if rc:
        return rc
    print(f'\ndemo finished in {time.time() - t0:.0f} s; outputs in {osp.abspath(args.out_dir)} '
          f'(summary: {osp.join(args.out_dir, "summary.md")})')
    return 0


def make_data(quick: bool, out_dir: str) -> dict:
    """Generate the three data sets (``--quick``: tiny ones under ``out_dir``); per task the
    ``--cfg-options`` pointing the configs at them."""
    import amvim_mm.datasets as D
    roots, opts = {}, {}
    for task, (root, maker, sizes, _, _) in TASKS.items():
        if quick:
            root = osp.join(out_dir, osp.basename(root))
            sizes = dict(num_train=16, num_val=8)
        getattr(D, maker)(root, **sizes)
        roots[task] = root
        opts[task] = [f'{k}.dataset.data_root={root}' for k in DATA_KEYS]
        print(f'   {task}: {root} ({sizes["num_train"]} train / {sizes["num_val"]} val '
              'images, 64x64)')
    if quick:
        # the detection metric reads its own copy of the annotations
        opts['detection'].append(f'val_evaluator.ann_file={roots["detection"]}/annotations/'
                                 'instances_val2017.json')
        opts['detection'].append(f'test_evaluator.ann_file={roots["detection"]}/annotations/'
                                 'instances_val2017.json')
    return opts


def checkpoints(args, seeds_of: dict, opts: dict, cores: int, jobs: int):
    """Every demo checkpoint, trained where missing (``--train``: all; ``--quick``: a few
    iterations) and checked against SHA256SUMS: {(task, name, seed): path}; None (with the
    message printed) when one does not match."""
    sums = read_sums()
    jobs_todo, ckpts = [], {}
    for task in TASKS:
        for name, config in task_models(task, args.families):
            for seed in seeds_of[task]:
                if args.quick:
                    path = osp.join(args.out_dir, f'{name}-seed{seed}_quick.pth')
                    work = osp.join(args.out_dir, 'train', f'{name}-seed{seed}')
                    extra = [*opts[task], 'train_cfg.max_iters=4', 'train_cfg.val_interval=4',
                             'default_hooks.checkpoint.interval=4']
                    jobs_todo.append((task, name, config, seed, work, path, extra))
                else:
                    path = ckpt_path(name, seed)
                    work = osp.join('work_dirs', 'demo', f'{name}-seed{seed}')
                    if args.train or not osp.isfile(path):
                        if args.train and osp.isdir(work):
                            shutil.rmtree(work)
                        jobs_todo.append((task, name, config, seed, work, path, []))
                ckpts[(task, name, seed)] = path

    def run_job(job):
        task, name, config, seed, work, path, extra = job
        last = train(name, config, work, seed, max(1, cores // jobs), extra)
        cmd = (f'python tools/train.py {config} --work-dir {work} --cfg-options '
               f'randomness.seed={seed}')
        export_weights(last, path, config, cmd)
        return osp.basename(path), sha256(path)

    if jobs_todo:
        print(f'   training {len(jobs_todo)} checkpoint(s), {jobs} at a time, '
              f'{max(1, cores // jobs)} thread(s) each', flush=True)
        with ThreadPoolExecutor(jobs) as ex:
            for base, digest in ex.map(run_job, jobs_todo):
                if not args.quick:
                    sums[base] = digest
                    write_sums(sums)
    if not args.quick:
        for (task, name, seed), path in ckpts.items():
            digest, want = sha256(path), sums.get(osp.basename(path))
            if want != digest:
                print(f'   {path}: sha256 {digest[:12]}... does not match SHA256SUMS '
                      f'({(want or "missing")[:12]}...); run `python tools/demo.py --train`',
                      file=sys.stderr)
                return None
        print(f'   {len(ckpts)} checkpoints in {CKPT_DIR}, sha256 verified')
    return ckpts


def sweeps(args, seeds_of: dict, ckpts: dict, opts: dict, cores: int) -> int:
    """``tools/prune_eval.py`` per task on its checkpoints; prints and summarises the AUC and
    per-cell tables (OUT/summary.md); the exit code of the first failed sweep, else 0."""
    ratios = ['0', '0.46'] if args.quick else ['0', '0.27', '0.46']
    methods = ['tome'] if args.quick else ['tome', 'random', 'evit', 'top']
    summary = ['# Demo: token reduction on the toy shapes', '',
               f'Ratios {", ".join(ratios)}; methods {", ".join(methods)}; training seeds per '
               'architecture: ' + '; '.join(f'{t} {", ".join(map(str, s))}'
                                            for t, s in seeds_of.items())
               + '; 95 % intervals over validation images and training seeds '
               '(docs/statistics.md); realised ratios next to the asked ones.', '']
    for task, (_, _, _, metric, _) in TASKS.items():
        pe_args, names, groups = [], [], []
        models = task_models(task, args.families)
        for name, config in models:
            for seed in seeds_of[task]:
                pe_args += [config, ckpts[(task, name, seed)]]
                names.append(f'{name}-s{seed}')
                groups.append(name)
        out = osp.join(args.out_dir, task)
        pe_args += ['--methods', *methods, '--ratios', *ratios, '--out-dir', out,
                    '--names', *names, '--groups', *groups, '--seeds', *map(str, PRUNING_SEEDS),
                    # --quick's cells take a second or two: a worker's start-up costs more
                    '--threads', str(cores), '--jobs', '1' if args.quick else str(cores),
                    '--cfg-options', *opts[task][1:]]
        if args.quick:
            results = osp.join(out, 'results.json')
            if osp.isfile(results):
                os.remove(results)
        rc, log = run_sweep_tool(task, metric, pe_args, out, cores)
        if rc:
            return rc
        summary += task_tables(task, metric, [n for n, _ in models], out, log)
    from amvim_mm.engine.fileio import atomic_write_bytes
    atomic_write_bytes('\n'.join(summary).encode(), osp.join(args.out_dir, 'summary.md'))
    return 0


def run_sweep_tool(task: str, metric: str, pe_args, out: str, cores: int):
    """Run ``tools/prune_eval.py`` with its output in OUT/prune_eval.log: (exit code, log);
    on a failure the log's tail and one line go to stderr."""
    print(f'\n   {task} ({metric}):\n   $ python tools/prune_eval.py ' + ' '.join(pe_args),
          flush=True)
    os.makedirs(out, exist_ok=True)
    log = osp.join(out, 'prune_eval.log')
    with open(log, 'w') as f:
        rc = subprocess.call([sys.executable, 'tools/prune_eval.py', *pe_args],
                             env=child_env(cores), stdout=f, stderr=subprocess.STDOUT)
    if rc:
        with open(log) as f:
            print(''.join(f.readlines()[-20:]), file=sys.stderr)
        print(f'prune_eval failed for {task} (exit {rc}); log: {log}', file=sys.stderr)
    return rc, log


def task_tables(task: str, metric: str, groups, out: str, log: str) -> list:
    """Print a task's AUC and per-cell tables; its section of the summary
    (:func:`amvim_mm.apis.sweep.summary_lines`, as prune_eval's own summary.md)."""
    from amvim_mm.apis.sweep import auc_table, cell_table, load_results, summary_lines
    data = load_results(osp.join(out, 'results.json'))
    print(auc_table(data, groups, metric) + '\n\n' + cell_table(data, groups, metric)
          + f'\n   (all rows, per checkpoint and per group: {log})', flush=True)
    return summary_lines(data, f'{task} ({metric})', metric=metric, groups=groups,
                         checkpoints=False)


if __name__ == '__main__':
    sys.exit(main())
