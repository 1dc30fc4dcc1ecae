"""The GPU suite's parts for the other families and reducers: VMamba-T beside the official
code, PlainMamba-L1/L3 and its reduction schedule, Vim-S with learned (DynamicViT-style)
pruning against ToP at the same GFLOPs."""
from __future__ import annotations

import torch

from amvim_mm.analysis.flops import backbone_flops
from amvim_mm.models.plain_mamba.plain_mamba import L3_TOP_BUDGET
from amvim_mm.models.reduction import ReductionSchedule

from .. import measure as B
from .. import official_vmamba as OVM
from .common import add_speedup, attempt, log


def gpu_vmamba(args):
    """VMamba-T: ours and (``--official-vmamba``) the official code, same weights, batch 128,
    224: inference (fp32/bf16, eager/graph; ``vs_official_run`` = ours / official in the same
    mode), a bf16 training step (eager), and stage-3 reduction (bf16, graph and eager)."""
    rows = []
    name, arch = 'vmamba-t', 'tiny'
    torch.manual_seed(0)
    ours = B.build(name, 224, head=True)
    official = None
    if args.official_vmamba:
        official = OVM.build_official(arch, args.official_vmamba, weights_from=ours)
        x = torch.randn(8, 3, 224, 224, device='cuda')
        diff = OVM.max_abs_diff(official, ours, x)
        log(f'  official VMamba-T (scan backend {OVM.scan_backend(args.official_vmamba)}): '
            f'max |logits difference| {diff:.3g} (fp32, batch 8)')
        rows.append(dict(model=name, impl='official', check='max_abs_diff_fp32',
                         value=float(f'{diff:.3g}')))
    impls = [('ours', ours)] + ([('official', official)] if official is not None else [])
    for dtype in ('fp32', 'bf16'):
        for mode in ('eager', 'graph', 'train'):
            if mode == 'train' and dtype == 'fp32':
                continue
            here = []
            for impl, m in impls:
                if mode == 'train':
                    r = attempt(B.measure_train, m, 128, 224, dtype)
                else:
                    r = attempt(B.measure, m, 128, 224, dtype, mode)
                r.update(model=name, impl=impl, dtype=dtype, mode=r.get('mode', mode))
                here.append(r)
                log(f'  {name} {dtype} {r["mode"]} {impl}: {r.get("img_per_s")} img/s, '
                    f'{r.get("peak_mem_mib")} MiB {r.get("error", "")}')
                torch.cuda.empty_cache()
            ref = [r.get('img_per_s') for r in here if r['impl'] == 'official']
            for r in here:
                if ref and ref[0] and r.get('img_per_s'):
                    r['vs_official_run'] = round(r['img_per_s'] / ref[0], 3)
            rows += here
    del official
    torch.cuda.empty_cache()
    # stage-3 reduction: measured speed-up against the FLOPs ratio (official convention)
    M, depth = ours.backbone.reduction_domain()
    locs = ReductionSchedule.importance_locations(depth)
    for mode in ('graph', 'eager'):
        base = None
        for method, ratio in [('none', 0.0)] + [(m, r) for m in ('ToMe', 'ToP')
                                                for r in (0.27, 0.46)]:
            if method == 'ToMe':
                red = dict(type='ToMe', ratio=ratio)
            elif method == 'ToP':
                red = dict(type='ToP', locations=locs, keep_rate=ReductionSchedule
                           .keep_rate_for_ratio(ratio, M, depth, locs))
            else:
                red = None
            ours.backbone.set_token_reduction(red)
            r = attempt(B.measure, ours, 128, 224, 'bf16', mode)
            fl = backbone_flops(ours.backbone, 224, 'model', num_classes=1000,
                                convention='official')
            r.update(model=name, part='reduction', method=method, ratio=ratio, reduction=red,
                     realised=round(fl['realised_ratio'], 3), gflops=round(fl['gflops'], 3),
                     stage3_tokens=fl['tokens'][4:4 + depth])
            if base is None:
                base = r
            add_speedup(r, base)
            rows.append(r)
            log(f'  {name} bf16 {mode} {method} {ratio}: {r.get("img_per_s")} img/s, speed-up '
                f'{r.get("speedup")} vs FLOPs ratio {r.get("flops_ratio")} {r.get("error", "")}')
        ours.backbone.set_token_reduction(None)
    return rows


def gpu_plainmamba(args):
    """PlainMamba-L1 / L3 whole classifiers on our path, batch 128, 224, bf16 and fp32, eager
    and CUDA graph (no official code: it needs mmcv 1.x / mmcls 0.x)."""
    rows = []
    for name in ('plainmamba-l1', 'plainmamba-l3'):
        torch.manual_seed(0)
        m = B.build(name, 224, head=True)
        fl = backbone_flops(m.backbone, 224, None, num_classes=1000, convention='official')
        for dtype in ('bf16', 'fp32'):
            for mode in ('eager', 'graph'):
                r = attempt(B.measure, m, 128, 224, dtype, mode, warmup=3, iters=10,
                            repeats=3)
                r.update(model=name, dtype=dtype, mode=mode, gflops=round(fl['gflops'], 3))
                rows.append(r)
                log(f'  {name} {dtype} {mode}: {r.get("img_per_s")} img/s, '
                    f'{r.get("peak_mem_mib")} MiB {r.get("error", "")}')
        del m
        torch.cuda.empty_cache()
    return rows


def gpu_plainmamba_reduction(args):
    """PlainMamba-L3 classifier, batch 128, 224, bf16: the 8.44-GFLOPs schedule (ToP with and
    without alignment, EViT) and ToMe at a similar realised ratio; measured speed-up against
    the FLOPs ratio (official convention), CUDA graph and eager."""
    name = 'plainmamba-l3'
    torch.manual_seed(0)
    m = B.build(name, 224, head=True)
    cases = [('none', None), ('ToP', dict(type='ToP', **L3_TOP_BUDGET)),
             ('ToP-noalign', dict(type='ToP', align=False, **L3_TOP_BUDGET)),
             ('EViT', dict(type='EViT', **L3_TOP_BUDGET)), ('ToMe', dict(type='ToMe', ratio=0.42))]
    return _reduction_rows(m, name, cases, 'official', 'reduction')


def _reduction_rows(m, name, cases, convention, part):
    """Time ``m`` (batch 128, 224, bf16) with each ``(method, reducer config)`` of
    ``cases`` (the first is the baseline), CUDA graph then eager; speed-up against the FLOPs
    ratio (``convention``)."""
    rows = []
    for mode in ('graph', 'eager'):
        base = None
        for method, red in cases:
            m.backbone.set_token_reduction(red)
            r = attempt(B.measure, m, 128, 224, 'bf16', mode, warmup=3, iters=10, repeats=3)
            fl = backbone_flops(m.backbone, 224, 'model', num_classes=1000, convention=convention)
            r.update(model=name, part=part, method=method, reduction=red, mode=mode,
                     realised=round(fl['realised_ratio'], 3), gflops=round(fl['gflops'], 3),
                     final_tokens=fl['tokens'][-1])
            if base is None:
                base = r
            add_speedup(r, base)
            rows.append(r)
            log(f'  {name} bf16 {mode} {method}: {r.get("img_per_s")} img/s, {r["gflops"]} G, '
                f'speed-up {r.get("speedup")} vs FLOPs ratio {r.get("flops_ratio")} '
                f'{r.get("error", "")}')
            torch.cuda.empty_cache()
    m.backbone.set_token_reduction(None)
    return rows


def _nearest(values, target, gflops_of):
    """The value whose GFLOPs are nearest to ``target`` (ties: the first)."""
    return min(values, key=lambda v: abs(gflops_of(v) - target))


def gpu_learned_reduction(args):
    """Vim-S classifier, batch 128, 224, bf16: DynamicViT-style pruning (keep predictors
    before blocks 6, 12, 18; rho fitted to the published 3.56 GFLOPs in the LocalMamba
    convention, where Vim-S is 5.14 G as published 5.1 G) against ToP (ToP-ViM's Small
    locations, after blocks 5, 10, 15) at the same GFLOPs, with and without alignment;
    measured speed-up against the FLOPs ratio, CUDA graph and eager. Random predictor weights
    (the speed does not depend on which tokens are kept)."""
    name = 'vim-s'
    torch.manual_seed(0)
    m = B.build(name, 224, head=True)
    bb = m.backbone

    def gflops(red):
        bb.set_token_reduction(red)
        try:
            return backbone_flops(bb, 224, 'model', num_classes=1000,
                                  convention='localmamba')['gflops']
        finally:
            bb.set_token_reduction(None)

    def dyn(rho):
        return dict(type='DynamicViT', keep_rate=rho, locations=(5, 11, 17))

    def top(k, align=True):
        return dict(type='ToP', keep_rate=k, locations=(5, 10, 15), align=align)

    grid = [round(0.5 + 0.005 * i, 3) for i in range(81)]
    rho = _nearest(grid, 3.56, lambda v: gflops(dyn(v)))
    target = gflops(dyn(rho))
    kt = _nearest(grid, target, lambda v: gflops(top(v)))
    log(f'  DynamicViT rho {rho}: {target:.3f} G; ToP keep {kt}: {gflops(top(kt)):.3f} G')
    cases = [('none', None), ('DynamicViT', dyn(rho)), ('ToP', top(kt)),
             ('ToP-noalign', top(kt, align=False))]
    return _reduction_rows(m, name, cases, 'localmamba', 'learned-reduction')
