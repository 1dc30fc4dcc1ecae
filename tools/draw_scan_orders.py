"""Draw the scan orders of a model's block as numbered grids, one panel per path (for the docs).

    python tools/draw_scan_orders.py --model AMVim [--grid 8 8] [--block 0] [--out orders.png]
        [--cfg-options window_size=3 inner=col]

Each cell shows the step at which the path visits that patch; the class token is not drawn (it
sits at the middle of every path's forward sequence).
"""
import argparse
import ast
import sys
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
import torch  # noqa: E402

import amvim_mm  # noqa: F401,E402
from amvim_mm.apis.cli import run_cli  # noqa: E402
from amvim_mm.models.vim.family import VimFamilyBackbone  # noqa: E402
from amvim_mm.models.layout.scan_orders import is_reverse, scan_rank  # noqa: E402
from amvim_mm.registry import MODELS  # noqa: E402


def visit_steps(H, W, spec) -> torch.Tensor:
    rank = scan_rank(H, W, spec)
    if is_reverse(spec):
        rank = H * W - 1 - rank
    return rank.view(H, W)


def describe(spec) -> str:
    s = dict(spec)
    name = s.pop('order')
    rev = s.pop('reverse', False)
    extra = ', '.join(f'{k}={v}' for k, v in s.items() if v not in (0, 'row') or k == 'size')
    return f"{'reverse ' if rev else ''}{name}{f' ({extra})' if extra else ''}"


def vim_family() -> list:
    """The registered backbones whose blocks scan along scan-order dicts: the Vim family
    (``layers[i].paths``) and the ones that name their traversals (``block_paths(i)``: ViL,
    AMViL)."""
    return sorted(n for n, c in MODELS.module_dict.items()
                  if isinstance(c, type) and (issubclass(c, VimFamilyBackbone)
                                              or callable(getattr(c, 'block_paths', None))))


def block_paths(model, block: int) -> list:
    """The scan-order dicts of block ``block`` of ``model`` (see :func:`vim_family`)."""
    if callable(getattr(model, 'block_paths', None)):
        if not 0 <= block < model.num_layers:
            raise IndexError(f'block {block} is out of range (0..{model.num_layers - 1})')
        return model.block_paths(block)
    return model.layers[block].paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--model', default='AMVim', choices=vim_family())
    p.add_argument('--grid', nargs=2, type=int, default=[8, 8], metavar=('H', 'W'))
    p.add_argument('--block', type=int, default=0)
    p.add_argument('--out', default='work_dirs/scan_orders.png')
    p.add_argument('--cfg-options', nargs='*', default=[],
                   help='backbone arguments, key=value (Python literals)')
    args = p.parse_args(argv)
    kw = {}
    for item in args.cfg_options:
        k, _, v = item.partition('=')
        try:
            kw[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            kw[k] = v
    H, W = args.grid
    try:
        model = MODELS.build(dict(type=args.model, arch='test' if args.model != 'LocalVim'
                                  else 'tiny', img_size=(16 * H, 16 * W), **kw))
        paths = block_paths(model, args.block)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(paths), figsize=(3.4 * len(paths), 3.6), dpi=120,
                             squeeze=False)
    for ax, spec in zip(axes[0], paths):
        steps = visit_steps(H, W, spec)
        ax.imshow(steps.numpy(), cmap='viridis')
        for r in range(H):
            for c in range(W):
                ax.text(c, r, int(steps[r, c]), ha='center', va='center', fontsize=7,
                        color='white')
        ax.set_title(describe(spec), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f'{args.model} block {args.block}: visiting order per path', fontsize=9)
    fig.tight_layout()
    import os
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    for k, spec in enumerate(paths):
        print(f'path {k}: {describe(spec)}')
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
