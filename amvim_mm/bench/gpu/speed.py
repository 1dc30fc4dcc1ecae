"""The GPU suite's speed parts: whole classifiers on both mixer paths (and the official Vim
code), ToMe reduction against the FLOPs ratio, resolutions, training steps."""
from __future__ import annotations

import torch

from amvim_mm.analysis.flops import backbone_flops

from .. import measure as B
from .. import official_vim as OV
from .common import MIXERS, RATIOS, add_speedup, attempt, log, variant_env


def gpu_main(args):
    """Our mixers side by side and, with ``--official-vim``, the official code's classifier
    (same weights, batch, dtype and mode) timed in the same process: ``vs_official_run`` is
    the ratio to it in the same mode; ``vs_official`` divides by the anchors measured earlier
    (eager, another run) and is kept for runs without the official checkout."""
    rows = []
    for name in args.models:
        official = args.official_vim and name in OV.OFFICIAL_MODELS
        for dtype in ('fp32', 'bf16'):
            for mode in ('eager', 'graph'):
                here = []
                for mixer in args.mixers + (['official'] if official else []):
                    if mixer == 'unfused' and mode == 'eager' and 'fused' in args.mixers:
                        continue   # the baseline in its best mode only (saves device time)
                    torch.manual_seed(0)
                    m = B.build(name, 224, head=True, fused_mixer=MIXERS.get(mixer, False))
                    extra = {}
                    if mixer == 'official':
                        ours = m
                        m = OV.build_official(name, args.official_vim, weights_from=ours)
                        if dtype == 'fp32' and mode == 'eager':   # the same function?
                            x = torch.randn(8, 3, 224, 224, device='cuda')
                            with torch.no_grad():
                                diff = (m(x) - ours(x)).abs().max().item()
                            extra['max_abs_diff_vs_unfused'] = float(f'{diff:.3g}')
                        del ours
                    r = B.measure(m, 128, 224, dtype, mode)
                    r.update(model=name, mixer=mixer,
                             official=B.OFFICIAL_ANCHORS.get((name, dtype)), **extra)
                    if r['official']:
                        r['vs_official'] = round(r['img_per_s'] / r['official'], 3)
                    here.append(r)
                    log(f'  {name} {dtype} {mode} {mixer}: {r["img_per_s"]} img/s '
                        f'(official anchor {r["official"]}), {r.get("peak_mem_mib")} MiB'
                        + (f', {extra}' if extra else ''))
                    del m
                    torch.cuda.empty_cache()
                ref = [r['img_per_s'] for r in here if r['mixer'] == 'official']
                for r in here:
                    if ref:
                        r['vs_official_run'] = round(r['img_per_s'] / ref[0], 3)
                rows += here
    return rows


def gpu_reduction(args):
    rows = []
    for variant, name, mode in [(v, n, m) for v in args.reduction_variants
                                for n in ('vim-t', 'amvim-t') for m in args.reduction_modes]:
        base = None
        for ratio in RATIOS:
            red = dict(type='ToMe', ratio=ratio) if ratio else None
            m = B.build(name, 224, head=True, token_reduction=red)
            with variant_env(variant):
                r = B.measure(m, 128, 224, 'bf16', mode)
            fl = backbone_flops(m.backbone, 224, 'model')
            r.update(model=name, method='ToMe', ratio=ratio, gflops=round(fl['gflops'], 3),
                     realised=round(fl['realised_ratio'], 3), variant=variant)
            if base is None:
                base = r
            add_speedup(r, base)
            rows.append(r)
            log(f'  {name} {mode} {variant} ToMe {ratio}: {r["img_per_s"]} img/s, speed-up '
                f'{r["speedup"]} vs FLOPs ratio {r["flops_ratio"]}')
            del m
            torch.cuda.empty_cache()
    return rows


def gpu_resolution(args):
    rows = []
    for name in ('vim-t', 'amvim-t'):
        for res in (224, 448, 768, 1024):
            batch = max(1, round(128 * 224 ** 2 / res ** 2))
            m = B.build(name, res, head=True)
            r = B.measure(m, batch, res, 'bf16', 'graph', iters=10)
            r.update(model=name, official=B.OFFICIAL_RESOLUTION_BF16.get((name, res)))
            rows.append(r)
            log(f'  {name} {res} b{batch}: {r["img_per_s"]} img/s (official {r["official"]})')
            del m
            torch.cuda.empty_cache()
    return rows


def _training_path(m, res: int) -> str:
    """Which mixer path a training step of classifier ``m`` at ``res`` px takes: the first
    block's mixer route in the backbone's execution plan, made with a gradient wanted."""
    with torch.enable_grad():
        x = torch.empty(2, 3, res, res, device='cuda')
        route = m.backbone.execution_plan(x).block(0).mixer.route
    return 'fused' if route == 'triton-train' else 'unfused'


def gpu_train(args):
    """Training step (forward, cross-entropy, backward; eager) of the whole classifier at each
    ``--train-sizes`` RES:BATCH (default 224:128) and ``--train-dtypes``: the fused path
    (forced: ``fused_mixer=True``) against the unfused path (the official code's speed) in the
    same run;
    ``vs_unfused`` = fused / unfused img/s, with both peak memories. Rows whose path decision
    came out unfused (the automatic choice) say so in ``path``."""
    rows = []
    for name in args.models:
        for res, batch in args.train_sizes:
            for dtype in args.train_dtypes:
                here = {}
                for mixer in ('unfused', 'fused'):
                    torch.manual_seed(0)
                    m = B.build(name, res, head=True, fused_mixer=True if mixer == 'fused'
                                else False)
                    r = attempt(B.measure_train, m, batch, res, dtype)
                    r.update(model=name, mixer=mixer, path=_training_path(m, res), res=res,
                             batch=batch)
                    here[mixer] = r
                    log(f'  {name} {res} b{batch} {dtype} train {mixer} ({r["path"]}): '
                        f'{r.get("img_per_s")} img/s, {r.get("peak_mem_mib")} MiB '
                        f'{r.get("error", "")}')
                    del m
                    torch.cuda.empty_cache()
                f, u = here['fused'], here['unfused']
                if f.get('img_per_s') and u.get('img_per_s'):
                    f['vs_unfused'] = round(f['img_per_s'] / u['img_per_s'], 3)
                    f['mem_vs_unfused'] = round(f['peak_mem_mib'] / u['peak_mem_mib'], 3)
                rows += [u, f]
    return rows
