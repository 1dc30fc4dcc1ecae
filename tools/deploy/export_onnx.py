"""Export a whole segmentor / detector / classifier of a model config to ONNX.

    python tools/deploy/export_onnx.py CONFIG CHECKPOINT [--deploy-cfg DEPLOY_CFG]
        [--out FILE.onnx] [--force] [--shape H W | --sizes HxW ... ] [--opset 17] [--dynamo]
        [--reduce tome|random|evit|top --ratio R [--seed S] [--locations B ...]
         | --reduce learned] [--cfg-options k=v ...]

CHECKPOINT is loaded strictly through the project's allow-list loader; ``--reduce`` takes the
options of ``tools/test.py`` and exports the model with that token reduction. DEPLOY_CFG is a
deploy config in mmdeploy's format (``configs/deploy/``; default: the task's
``*_onnxruntime_dynamic.py``): its ``onnx_config`` gives the opset, input / output names, a
static ``input_shape`` ([W, H]) or a dynamic batch (``dynamic_axes``). What is exported per task
and what is fixed at export: docs/deploy.md. Without ``--out`` the file is
``work_dirs/deploy/<config name>[_<method><ratio>].onnx``. An output that is one of the inputs
(config, checkpoint, deploy config; through links too) is refused, an existing one is replaced
only with ``--force`` (atomically). ``--sizes 224x224 320x256 ...``: one graph per size into
the folder ``--out`` (default ``work_dirs/deploy/<config name>[_<method><ratio>]/``) with its
manifest ``sizes.json``, a per-size cache that :class:`amvim_mm.deploy.size_cache.SizeCache`
runs (the graph of each input's size); sizes the folder has are kept unless ``--force``, so the
same command with more sizes adds them. The written graph is run once in ONNX Runtime at the export size and compared
with PyTorch before it is moved into place. Bad input ends with one ``error:``
line and exit code 2 (missing extras: the ``pip install -r requirements/deploy.txt`` hint).
"""
import argparse
import os
import os.path as osp
import sys
import tempfile

import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7

from amvim_mm.apis.cli import run_cli
from amvim_mm.deploy.tasks import (TaskForward, add_model_args, check_task, export_shape,
                                   is_dynamic_batch, load_deploy_config, load_task_model,
                                   output_names)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: the default deploy config per task (dynamic batch, image size of the model config)
DEFAULT_DEPLOY = {scope: osp.join(ROOT, 'configs', 'deploy', f'{name}_onnxruntime_dynamic.py')
                  for scope, name in (('mmseg', 'segmentation'), ('mmdet', 'detection'),
                                      ('mmpretrain', 'classification'))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument('--deploy-cfg', help='deploy config (mmdeploy format; configs/deploy/)')
    p.add_argument('--out', help='the .onnx file to write')
    p.add_argument('--force', action='store_true', help='replace an existing --out file')
    p.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'),
                   help='export image size (default: the deploy config\'s input_shape, else '
                        'the model config\'s crop_size / img_size)')
    p.add_argument('--sizes', nargs='+', metavar='HxW',
                   help='one graph per image size into the folder --out (a per-size cache, '
                        'amvim_mm.deploy.size_cache; sizes already there are kept unless '
                        '--force)')
    p.add_argument('--opset', type=int, default=None,
                   help='ONNX opset (default: the deploy config\'s, else 17)')
    p.add_argument('--dynamo', action='store_true',
                   help='export through torch.export (default: the TorchScript exporter)')
    args = p.parse_args(argv)
    if args.sizes and args.shape:
        p.error('give --shape (one graph) or --sizes (a folder of graphs), not both')
    return args


def default_out(args) -> str:
    stem = osp.splitext(osp.basename(args.config))[0]
    if args.reduce:
        stem += f'_{args.reduce}' + (f'{args.ratio:g}' if args.ratio is not None else '')
    return osp.join('work_dirs', 'deploy', stem + '.onnx')


def export(args, loaded=None) -> str:
    """Export as the parsed arguments ask; returns the written path. ``loaded``: the
    ``(config, model)`` of :func:`load_task_model` when the caller has them (``--sizes``
    exports one model at several sizes)."""
    import torch
    from amvim_mm.deploy.ort import require_onnxruntime
    from amvim_mm.engine.fileio import check_output_path
    out = args.out or default_out(args)
    check_output_path(out, {'config': args.config, 'checkpoint': args.checkpoint,
                            'deploy config': args.deploy_cfg}, force=args.force)
    require_onnxruntime()
    from amvim_mm.deploy.export import export_onnx
    cfg, model = loaded or load_task_model(args)
    deploy_path = args.deploy_cfg or DEFAULT_DEPLOY[cfg.default_scope]
    deploy_cfg = load_deploy_config(deploy_path)
    check_task(cfg, deploy_cfg, deploy_path)
    onnx_cfg = deploy_cfg.get('onnx_config', {})
    h, w = export_shape(cfg, deploy_cfg, args.shape)
    forward = TaskForward(model, cfg.default_scope, (h, w)).eval()
    # torch.export fixes a dimension whose example size is 1: a dynamic batch needs 2
    batch = 2 if args.dynamo and is_dynamic_batch(deploy_cfg) else 1
    images = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(0))
    names = output_names(forward, images, onnx_cfg.get('output_names'))
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    print(f'exporting at {h}x{w} with the {"torch.export-based" if args.dynamo else "TorchScript"}'
          ' exporter (a tiny model at 224: about a minute on 2 cores; dynamo: several)...',
          file=sys.stderr, flush=True)
    # written beside the output and moved into place only once ONNX Runtime ran it
    fd, tmp = tempfile.mkstemp(suffix='.onnx', prefix='.unverified-',
                               dir=osp.dirname(osp.abspath(out)))
    os.close(fd)
    try:
        export_onnx(forward, tmp, (images, ), opset=args.opset or onnx_cfg.get(
                        'opset_version', 17), dynamo=args.dynamo,
                    dynamic_batch=is_dynamic_batch(deploy_cfg),
                    input_names=tuple(onnx_cfg.get('input_names') or ('input', )),
                    output_names=names)
        verify_export(forward, tmp, images, (h, w))
        os.replace(tmp, out)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
    return out


#: the largest relative error between ONNX Runtime and PyTorch an export may show
VERIFY_TOL = 1e-3


def verify_export(forward, path: str, images, size) -> None:
    """Run the written graph once in ONNX Runtime at the export size and compare it with
    PyTorch: a graph that cannot run (e.g. a broadcast fixed at export) or that computes
    something else stops the export with one line instead of a file that fails later. With a
    reducer that chooses tokens by their features, random images whose choices sit at a near
    tie (where the runtimes may choose differently, :func:`~amvim_mm.deploy.ort.near_ties`)
    are replaced by others first."""
    import torch
    from amvim_mm.deploy.ort import compare_onnx, near_ties
    from amvim_mm.errors import ConfigError, first_line
    for seed in range(1, 9):   # an image at a near tie of the token choices proves nothing
        ties = near_ties(forward, images)
        if ties is None or not ties.any():
            break
        images = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed))
    try:
        result = compare_onnx(forward, path, images)
    except Exception as err:     # onnxruntime's errors (Fail, RuntimeException, ...)
        raise ConfigError(f'the exported graph does not run in ONNX Runtime at '
                          f'{size[0]}x{size[1]} ({first_line(err)}); nothing written') from None
    worst = max((r['max_rel_err'] for r in result.values()), default=0.0)
    if not worst <= VERIFY_TOL:
        raise ConfigError(f'the exported graph differs from PyTorch at {size[0]}x{size[1]} '
                          f'(largest relative error {worst:.2e} > {VERIFY_TOL:g}); nothing '
                          'written')


def export_sizes(args) -> str:
    """``--sizes``: one graph per size into the folder ``args.out`` and its manifest; returns
    the folder. Sizes the manifest has (and whose file exists) are kept unless ``--force``; a
    folder made from another config, checkpoint or export options is refused (``--force``
    rebuilds it), so that one cache never mixes two models."""
    import copy
    from amvim_mm.deploy.size_cache import parse_size, read_manifest, size_key, write_manifest
    sizes = [parse_size(t) for t in args.sizes]
    folder = args.out or default_out(args)[:-len('.onnx')]
    if osp.isfile(folder):
        from amvim_mm.errors import ConfigError
        raise ConfigError(f'--sizes writes a folder of graphs; {folder} is a file')
    os.makedirs(folder, exist_ok=True)
    manifest = read_manifest(folder)
    made = dict(config=args.config, checkpoint=args.checkpoint, extra_args=_extra_args(args))
    if manifest['sizes'] and any(manifest.get(k) != v for k, v in made.items()):
        if not args.force:
            from amvim_mm.errors import ConfigError
            raise ConfigError(f'{folder} holds graphs of another model or export options '
                              f'({manifest.get("config")}, {manifest.get("checkpoint")}, '
                              f'{" ".join(manifest.get("extra_args", [])) or "no options"}); '
                              'give another --out, or --force to rebuild it')
        manifest['sizes'] = {}
    manifest.update(made)
    loaded = None
    for h, w in dict.fromkeys(sizes):
        key = size_key(h, w)
        path = osp.join(folder, f'{key}.onnx')
        if key in manifest['sizes'] and osp.isfile(path) and not args.force:
            print(f'{key}: kept ({path})', file=sys.stderr)
            continue
        one = copy.copy(args)
        one.shape, one.out, one.force, one.sizes = (h, w), path, True, None
        loaded = loaded or load_task_model(args)
        export(one, loaded)
        manifest['sizes'][key] = f'{key}.onnx'
        write_manifest(folder, manifest)
        print(f'{key}: exported ({path})', file=sys.stderr)
    write_manifest(folder, manifest)
    return folder


def _extra_args(args) -> list:
    """The options that shape every graph of a size cache (for its manifest's command)."""
    out = []
    for flag, value in (('--deploy-cfg', args.deploy_cfg), ('--opset', args.opset)):
        if value is not None:
            out += [flag, str(value)]
    if args.dynamo:
        out.append('--dynamo')
    if args.reduce:
        out += ['--reduce', args.reduce]
        for flag, value in (('--ratio', args.ratio), ('--seed', args.seed)):
            if value is not None:
                out += [flag, str(value)]
        if args.locations:
            out += ['--locations', *map(str, args.locations)]
    if args.cfg_options:
        out += ['--cfg-options', *args.cfg_options]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.sizes:
        from amvim_mm.deploy.size_cache import read_manifest
        folder = export_sizes(args)
        print(f'exported {args.config} to {folder}: sizes '
              + ', '.join(sorted(read_manifest(folder)['sizes'])))
        return 0
    path = export(args)
    import onnx
    graph = onnx.load(path, load_external_data=False).graph

    def dims(v):
        return 'x'.join(d.dim_param or str(d.dim_value) for d in v.type.tensor_type.shape.dim)
    print(f'exported {args.config} to {path}: inputs '
          + ', '.join(f'{v.name} {dims(v)}' for v in graph.input) + '; outputs '
          + ', '.join(f'{v.name} {dims(v)}' for v in graph.output))
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
