"""GFLOPs of a backbone (Vim family, VMamba, PlainMamba, ViL), with or without token reduction,
or of a whole segmentor split into backbone / neck / heads.

    python tools/get_flops.py --model Vim --arch tiny [--size 224] [--ratios 0 0.17 0.27 0.36 0.46]
                              [--method ToMe] [--num-classes 1000]
    python tools/get_flops.py --model VMamba --arch tiny --ratios 0 0.4   # reduction in stage 3
    python tools/get_flops.py CONFIG [--shape H W] [--ratios 0 0.4] [--method ToMe]

Default convention: MACs of the linear/conv layers + the selective scan as 9*L*E*N per path
(mamba-ssm's convention) with the per-block token counts of the reduction schedule;
``--convention localmamba`` uses LocalMamba's flops() formula, the one behind the papers' tables
(amvim_mm.analysis.flops). VMamba's and PlainMamba's default is ``official``, the official
code's fvcore count (amvim_mm.analysis.vmamba_flops, plainmamba_flops); VMamba's table adds
the per-stage token grids. The backbones and their conventions come from the registry (every
backbone's own ``flops``).

With a CONFIG (an mmseg segmentor; an mmdet single-stage detector too) the whole model is built
from its library's registry (no weights loaded) and counted at the config's test crop (the
sliding-window crop, else the data preprocessor's size; detectors: the test Resize scale) or
``--shape``: the backbone as above (the same counter and convention), the neck and the heads by
mmengine's FlopAnalyzer on the features the backbone gives with the same reducer on
(amvim_mm.analysis.model_flops). Without ``--ratios`` one row with the reduction the config
tests with (its ``TokenReductionHook`` for the test phase, else the backbone's own reducer).
``total`` is what inference runs: the auxiliary head (a training loss) is shown, not added.
"""
import argparse
import inspect
import os.path as osp
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
#: the table's names of a model's parts
PART_NAMES = dict(backbone='backbone', neck='neck', decode_head='decode head',
                  auxiliary_head='auxiliary head (train)', bbox_head='bbox head')


def build_model(config: str):
    """The model of a config (nothing loaded: :func:`amvim_mm.apis.runner.build_model`) and
    the config."""
    from amvim_mm.apis.runner import build_model as build, load_config
    cfg = load_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)   # mmseg's deprecation notes
        return build(cfg, config), cfg


def config_shape(model, cfg):
    """(H, W, where from): the segmentor's test crop, else a detector's test Resize scale."""
    from amvim_mm.analysis.model_flops import inference_shape
    shape = inference_shape(model)
    if shape is not None:
        return (*shape, 'test crop')
    pipeline = cfg.get('test_pipeline') or []
    for t in pipeline:
        if isinstance(t, dict) and 'Resize' in str(t.get('type')) and t.get('scale'):
            w, h = (t['scale'], t['scale']) if isinstance(t['scale'], int) else t['scale']
            return h, w, 'test Resize scale'
    raise ConfigError('the config names no test crop or Resize scale; pass --shape H W')


def config_reduction(cfg):
    """The reduction the config tests with: the last ``TokenReductionHook`` of the test phase,
    else ``'model'`` (the backbone's own ``token_reduction``)."""
    red = 'model'
    for hook in cfg.get('custom_hooks') or []:
        if isinstance(hook, dict) and str(hook.get('type')).endswith('TokenReductionHook'):
            phases = hook.get('phases', ('val', 'test'))
            if 'test' in ((phases, ) if isinstance(phases, str) else phases):
                red = hook.get('reduction')
    return red


def row_label(red, backbone):
    """The reducer and ratio columns of a row with reduction ``red``."""
    if red == 'model':
        red = backbone.token_reducer
        return (type(red).__name__ if red is not None else 'none'), '-'
    if not red:
        return 'none', '0.00'
    ratio = red.get('ratio')
    return red['type'], (f'{ratio:.2f}' if isinstance(ratio, (int, float)) else '-')


def config_table(args) -> int:
    """The per-part table of a config's model (module docstring)."""
    from amvim_mm.analysis.model_flops import model_flops, split_model
    model, cfg = build_model(args.config)
    h, w, source = (*args.shape, '--shape') if args.shape else config_shape(model, cfg)
    bb = split_model(model)[0].backbone
    options = {'count_after_merge': True} if args.count_after_merge else {}
    if options and 'count_after_merge' not in inspect.signature(bb.flops).parameters:
        raise ConfigError('--count-after-merge is for the Vim family')
    reductions = [(config_reduction(cfg), ' (config)')] if args.ratios is None else \
        [(dict(type=args.method, ratio=r) if r else None, '') for r in args.ratios]
    rows = []
    for red, note in reductions:
        label, ratio = row_label(red, bb)
        rows.append((label + note, ratio,
                     model_flops(model, (h, w), red, args.convention, **options)))
    parts = ['backbone', 'neck', *rows[0][2]['heads']]
    print(f'| {osp.basename(args.config)} {h}x{w} ({source}) | ratio | realised | '
          + ' | '.join(PART_NAMES[p] for p in parts) + ' | total |')
    print('|---' * (len(parts) + 4) + '|')
    for label, ratio, f in rows:
        cells = ['-' if f['parts'][p] is None else f"{f['parts'][p]:.3f}" for p in parts]
        print(f"| {label} | {ratio} | {f['backbone']['realised_ratio']:.3f} | "
              + ' | '.join(cells) + f" | {f['inference']:.3f} |")
    print(f"\nGFLOPs for one image. backbone convention: {rows[0][2]['backbone']['convention']}"
          "\nneck and heads: mmengine's FlopAnalyzer on their forward; total: backbone + neck + "
          + ('the heads that inference runs (not the auxiliary head)'
             if 'auxiliary_head' in parts else 'heads'))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config', nargs='?',
                   help='a segmentor config: GFLOPs of the whole model, split into parts')
    p.add_argument('--model', default='Vim', choices=BACKBONES)
    p.add_argument('--arch', default='tiny')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                   help='image size with a CONFIG (default: its test crop)')
    p.add_argument('--method', default='ToMe', choices=['ToMe', 'RandomPrune'])
    p.add_argument('--ratios', nargs='+', type=float, default=None,
                   help='reduction ratios (default: 0; with a CONFIG its own reducer)')
    p.add_argument('--num-classes', type=int, default=1000)
    p.add_argument('--convention', default=None, choices=list(CONVENTIONS),
                   help='FLOPs convention (amvim_mm.analysis.flops; default: mamba, for VMamba '
                        'and PlainMamba official)')
    p.add_argument('--count-after-merge', action='store_true',
                   help='count each reduction from the block after it (compare with counters '
                        'that merge at the end of a block)')
    args = p.parse_args(argv)
    if args.config is not None:
        return config_table(args)
    if args.shape:
        raise ConfigError('--shape is for a CONFIG; a backbone takes --size')
    try:
        model = MODELS.build(dict(type=args.model, arch=args.arch, img_size=args.size))
        rows = []
        options = {}
        if args.count_after_merge:
            if 'count_after_merge' not in inspect.signature(model.flops).parameters:
                raise ConfigError('--count-after-merge is for the Vim family')
            options['count_after_merge'] = True
        for r in args.ratios or [0]:
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
