"""GFLOPs of a backbone (Vim family, VMamba, PlainMamba, ViL), with or without token reduction.

    python tools/get_flops.py --model Vim --arch tiny [--size 224] [--ratios 0 0.17 0.27 0.36 0.46]
                              [--method ToMe] [--num-classes 1000]
    python tools/get_flops.py --model VMamba --arch tiny --ratios 0 0.4   # reduction in stage 3

Default convention: MACs of the linear/conv layers + the selective scan as 9*L*E*N per path
(mamba-ssm's convention) with the per-block token counts of the reduction schedule;
``--convention localmamba`` uses LocalMamba's flops() formula, the one behind the papers' tables
(amvim_mm.analysis.flops). VMamba's and PlainMamba's default is ``official``, the official
code's fvcore count (amvim_mm.analysis.vmamba_flops, plainmamba_flops); VMamba's table adds
the per-stage token grids. The backbones and their conventions come from the registry (every
backbone's own ``flops``).
"""
import argparse
import inspect
import sys
import warnings

warnings.filterwarnings('ignore', message='pkg_resources is deprecated')  # mmengine 0.10.7
import amvim_mm  # noqa: F401,E402
from amvim_mm.analysis.flops import CONVENTIONS, backbone_flops  # noqa: E402
from amvim_mm.errors import ConfigError  # noqa: E402
from amvim_mm.apis.cli import run_cli  # noqa: E402
from amvim_mm.models.skeleton.base import MambaBackbone  # noqa: E402
from amvim_mm.registry import MODELS  # noqa: E402

#: every registered backbone of ours (a new one is listed by registering it)
BACKBONES = [n for n, c in MODELS.module_dict.items()
             if isinstance(c, type) and issubclass(c, MambaBackbone)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--model', default='Vim', choices=BACKBONES)
    p.add_argument('--arch', default='tiny')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--method', default='ToMe', choices=['ToMe', 'RandomPrune'])
    p.add_argument('--ratios', nargs='+', type=float, default=[0])
    p.add_argument('--num-classes', type=int, default=1000)
    p.add_argument('--convention', default=None, choices=list(CONVENTIONS),
                   help='FLOPs convention (amvim_mm.analysis.flops; default: mamba, for VMamba '
                        'and PlainMamba official)')
    p.add_argument('--count-after-merge', action='store_true',
                   help='count each reduction from the block after it (compare with counters '
                        'that merge at the end of a block)')
    args = p.parse_args(argv)
    try:
        model = MODELS.build(dict(type=args.model, arch=args.arch, img_size=args.size))
        rows = []
        options = {}
        if args.count_after_merge:
            if 'count_after_merge' not in inspect.signature(model.flops).parameters:
                raise ConfigError('--count-after-merge is for the Vim family')
            options['count_after_merge'] = True
        for r in args.ratios:
            red = dict(type=args.method, ratio=r) if r else None
            f = backbone_flops(model, args.size, red, num_classes=args.num_classes,
                               convention=args.convention or model.default_flops_convention,
                               **options)
            rows.append((r, f))
    except (KeyError, ValueError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    print(f'| {args.model}-{args.arch} {args.size} | ratio | realised | final tokens | GFLOPs |')
    print('|---|---|---|---|---|')
    for r, f in rows:
        print(f"| {args.method if r else 'none'} | {r:.2f} | {f['realised_ratio']:.3f} | "
              f"{f['tokens'][-1]} | {f['gflops']:.3f} |")
    if 'stage_tokens' in rows[0][1]:
        print(f"\ntokens per stage: {rows[0][1]['stage_tokens']} (reduction in stage "
              f"{rows[0][1]['reduction_stage']}); per block: "
              + '; '.join(f"{r}: {f['tokens']}" for r, f in rows))
    print(f"\nconvention: {rows[0][1]['convention']}")
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
