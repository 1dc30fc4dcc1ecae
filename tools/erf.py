"""Effective receptive field maps of one or several models, one panel each (jet colour map).

    python tools/erf.py CONFIG CHECKPOINT [CONFIG CHECKPOINT ...] [--size 224] [--samples 16]
                        [--names A B] [--out erf.png] [--device cuda]

The backbone of each model (mmseg/mmdet/mmpretrain config + its checkpoint) is evaluated on
noise images; the map is the gradient of the centre output w.r.t. the input, averaged over the
samples (amvim_mm.analysis.erf). Writes a PNG and prints the high-contribution area per model.
"""
import argparse
import os.path as osp
import sys
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
from amvim_mm.analysis.erf import erf_map, high_contribution_area, normalise_erf  # noqa: E402
from amvim_mm.apis.cli import run_cli  # noqa: E402


def build_backbone(config, checkpoint, device):
    from amvim_mm.apis.runner import build_model, load_config, load_model_weights
    from amvim_mm.engine.hooks import find_reducible_backbone
    model = build_model(load_config(config), config)
    load_model_weights(model, checkpoint, strict=True)
    return find_reducible_backbone(model).to(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('pairs', nargs='+', metavar='CONFIG CHECKPOINT')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--samples', type=int, default=16)
    p.add_argument('--names', nargs='+')
    p.add_argument('--out', default='work_dirs/erf.png')
    p.add_argument('--device', default='cpu')
    args = p.parse_args(argv)
    if len(args.pairs) % 2:
        p.error('expected CONFIG CHECKPOINT pairs')
    pairs = list(zip(args.pairs[0::2], args.pairs[1::2]))
    names = args.names or [osp.basename(c).split('_')[0] for c, _ in pairs]
    if len(names) != len(pairs):
        p.error(f'{len(names)} names for {len(pairs)} models')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    maps = []
    for (config, ckpt), name in zip(pairs, names):
        bb = build_backbone(config, ckpt, args.device)
        m = erf_map(bb, (args.size, args.size), args.samples, device=args.device)
        maps.append(m)
        print(f'{name}: high-contribution area (>0.2) {high_contribution_area(m):.3f}')
    fig, axes = plt.subplots(1, len(maps), figsize=(3.2 * len(maps), 3.2), dpi=120,
                             squeeze=False)
    for ax, m, name in zip(axes[0], maps, names):
        ax.imshow(normalise_erf(m).numpy(), cmap='jet', vmin=0, vmax=1)
        ax.set_title(name)
        ax.axis('off')
    fig.tight_layout()
    import os
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
