"""The README's main job: how well do Vim and AMVim survive token reduction? (CPU, no downloads)

Steps (each shown as it runs):
  1. check the environment;
  2. generate the built-in toy-shapes segmentation set in the ADE20K layout (cached in
     data/toy_shapes);
  3. take the demo Vim and AMVim checkpoints that the project's own demo training produced
     (checkpoints/demo, checked against checkpoints/demo/SHA256SUMS), or train them with
     tools/train.py when they are missing or with --train (about 10 min each on 2 cores);
  4. run tools/prune_eval.py on both with ToMe and random pruning at ratios
     0 / 0.17 / 0.27 / 0.36 / 0.46 and print the side-by-side table; the JSON and the plot are
     written to --out-dir (default outputs/demo).

    python tools/demo.py [--train] [--out-dir DIR] [--quick]

``--quick`` is the shortened end-to-end run used by the tests (a few images, a few training
iterations, two ratios): seconds, and its numbers mean nothing.
"""
import argparse
import hashlib
import os
import os.path as osp
import subprocess
import sys
import time

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MODELS = (
    ('vim-demo', 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
    ('amvim-demo', 'configs/demo/amvim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
)
CKPT_DIR = 'checkpoints/demo'
SUMS = osp.join(CKPT_DIR, 'SHA256SUMS')


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


def export_weights(src: str, dst: str, config: str, command: str) -> None:
    """Keep only the model weights (and provenance) of a training checkpoint."""
    import torch

    from amvim_mm.engine.fileio import atomic_write_bytes
    from amvim_mm.utils.safe_load import load_checkpoint_file
    ck = load_checkpoint_file(src)
    meta = dict(config=config, command=command, iter=ck.get('meta', {}).get('iter'))
    import io
    buf = io.BytesIO()
    torch.save(dict(state_dict=ck['state_dict'], meta=meta), buf)
    atomic_write_bytes(buf.getvalue(), dst)


def train(name: str, config: str, work_dir: str, extra_opts=()) -> str:
    cmd = [sys.executable, 'tools/train.py', config, '--work-dir', work_dir]
    if extra_opts:
        cmd += ['--cfg-options', *extra_opts]
    print('   $ ' + ' '.join(cmd), flush=True)
    t = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    print(f'   trained {name} in {time.time() - t:.0f} s', flush=True)
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return f.read().strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--train', action='store_true', help='retrain the demo checkpoints')
    p.add_argument('--out-dir', default='outputs/demo')
    p.add_argument('--quick', action='store_true', help='shortened run for tests')
    args = p.parse_args(argv)
    os.chdir(ROOT)
    t0 = time.time()

    step('1/4 environment check')
    rc = subprocess.call([sys.executable, 'tools/check_env.py', '--quiet'])
    if rc:
        print('environment check failed: run `bash tools/setup_env.sh`', file=sys.stderr)
        return rc
    print('   ok')

    step('2/4 built-in toy-shapes data (ADE20K layout)')
    from amvim_mm.datasets import make_toy_shapes
    data_root = osp.join(args.out_dir, 'toy_shapes') if args.quick else 'data/toy_shapes'
    n_train, n_val = (16, 8) if args.quick else (400, 60)
    make_toy_shapes(data_root, num_train=n_train, num_val=n_val)
    print(f'   {data_root}: {n_train} train / {n_val} val images, 64x64, classes background, '
          'disk, square, triangle, ring (color carries no class: shape context is needed)')
    opts = [f'train_dataloader.dataset.data_root={data_root}',
            f'val_dataloader.dataset.data_root={data_root}',
            f'test_dataloader.dataset.data_root={data_root}']

    step('3/4 demo checkpoints')
    sums = read_sums()
    ckpts = []
    for name, config in MODELS:
        if args.quick:
            work = osp.join(args.out_dir, 'train', name)
            last = train(name, config, work, opts + ['train_cfg.max_iters=4',
                                                     'train_cfg.val_interval=4',
                                                     'default_hooks.checkpoint.interval=4'])
            path = osp.join(args.out_dir, f'{name}_quick.pth')
            export_weights(last, path, config, 'tools/demo.py --quick')
            ckpts.append(path)
            continue
        path = osp.join(CKPT_DIR, f'{name}_toyshapes-64x64.pth')
        if args.train or not osp.isfile(path):
            work = osp.join('work_dirs', 'demo', name)
            last = train(name, config, work)
            os.makedirs(CKPT_DIR, exist_ok=True)
            command = f'python tools/train.py {config} --work-dir {work}'
            export_weights(last, path, config, command)
            sums[osp.basename(path)] = sha256(path)
            with open(SUMS, 'w') as f:
                f.write('# sha256 of the demo checkpoints; made by `python tools/demo.py '
                        '--train` (python tools/train.py CONFIG, weights exported)\n')
                for k, v in sorted(sums.items()):
                    f.write(f'{v}  {k}\n')
        digest = sha256(path)
        want = sums.get(osp.basename(path))
        if want != digest:
            print(f'   {path}: sha256 {digest[:12]}... does not match SHA256SUMS '
                  f'({(want or "missing")[:12]}...); run `python tools/demo.py --train`',
                  file=sys.stderr)
            return 1
        print(f'   {path} (sha256 {digest[:12]}..., verified)')
        ckpts.append(path)

    step('4/4 training-free token reduction sweep (tools/prune_eval.py)')
    ratios = ['0', '0.46'] if args.quick else ['0', '0.17', '0.27', '0.36', '0.46']
    methods = ['tome'] if args.quick else ['tome', 'random']
    pe_args = []
    for (name, config), ck in zip(MODELS, ckpts):
        pe_args += [config, ck]
    pe_args += ['--methods', *methods, '--ratios', *ratios, '--out-dir', args.out_dir,
                '--names', *[n for n, _ in MODELS], '--cfg-options', *opts[1:]]
    results = osp.join(args.out_dir, 'results.json')
    if args.quick and osp.isfile(results):
        os.remove(results)
    print('   $ python tools/prune_eval.py ' + ' '.join(pe_args), flush=True)
    rc = subprocess.call([sys.executable, 'tools/prune_eval.py', *pe_args])
    print(f'\ndemo finished in {time.time() - t0:.0f} s; outputs in {osp.abspath(args.out_dir)}')
    return rc


if __name__ == '__main__':
    sys.exit(main())
