"""The fused Triton mixer (amvim_mm.ops.fused_mixer) against the unfused mixer, its reference.

On CPU the kernels run in Triton's interpreter, which must be switched on before Python starts,
so those checks run in a subprocess with ``TRITON_INTERPRET=1``. The GPU checks compile them.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.ops.fused_mixer import fused_requested
from amvim_mm.registry import MODELS
from amvim_mm.testing.triton_interpreter import PREAMBLE as FAST_INTERPRETER
from tests.ops.triton_support import HAS_TRITON, needs_triton  # noqa: F401


# every case: backbone config, input (H, W); fused vs unfused outputs (all out_indices). The
# unfused reference runs once per case, the fused path once per phase (settings) that lists it
INTERPRETER_SCRIPT = textwrap.dedent('''
    import json, os, sys, torch, amvim_mm
    import amvim_mm.ops.token_merge as tm
    from amvim_mm.registry import MODELS
    phases = json.loads(sys.argv[1])

    def use(phase):
        """The phase's settings through the environment, as a user sets them."""
        scan, kernels, match_cfg, _ = phase
        os.environ.update(AMVIM_FUSED_SCAN_CONFIG=scan, AMVIM_FUSED_REDUCTION_KERNELS=kernels,
                          AMVIM_TOME_MATCH_CONFIG=match_cfg)

    cases = [
        dict(type='Vim', arch='test', img_size=64),
        dict(type='AMVim', arch='test', img_size=112, window_size=2),
        dict(type='AMVim', arch='test', img_size=112, window_size=3, windowed_path=0,
             shift_odd_blocks=True),
        dict(type='AMVim', arch='test', img_size=112, window_size=2,
             token_reduction=dict(type='ToMe', ratio=0.27)),
        dict(type='AMVim', arch='test', img_size=112, window_size=2,
             token_reduction=dict(type='RandomPrune', ratio=0.27, seed=1)),
        dict(type='Vim', arch='test', img_size=64, with_cls_token=False),
        dict(type='Vim', arch='test', img_size=112, with_cls_token=False,
             token_reduction=dict(type='ToMe', ratio=0.36)),
    ]
    sizes = [(64, 48), (112, 96), (112, 112), (112, 112), (96, 112), (80, 64), (112, 96)]

    def forward(m, x, fused):
        for layer in m.layers:
            layer.mixer.fused = fused
        with torch.no_grad():
            outs = m(x)
        # steps planned for the fused add + RMSNorm (by the matching kernel or by PyTorch
        # ops), and those planned by PyTorch ops (plan_merge)
        steps = m.last_context.steps
        return outs, m.last_context, (sum(s in ('plan', 'kernel-plan') for s in steps),
                                      steps.count('plan'))

    res = []
    for i, (cfg, (h, w)) in enumerate(zip(cases, sizes, strict=True)):
        torch.manual_seed(0)
        m = MODELS.build(dict(cfg, out_type='featmap', out_indices=(0, 2, 3))).eval()
        x = torch.randn(2, 3, h, w)
        ref, ref_ctx, ref_calls = forward(m, x, False)
        for p, phase in enumerate(phases):
            if i not in phase[3]:
                continue
            use(phase)
            outs, ctx, calls = forward(m, x, True)
            same_state = all(torch.equal(getattr(ctx, k), getattr(ref_ctx, k))
                             for k in ('pos', 'source') if getattr(ref_ctx, k) is not None)
            errs = []
            for a, b in zip(outs, ref, strict=True):
                assert a.shape == b.shape, (a.shape, b.shape)
                errs.append(((a - b).abs().max() / b.abs().max()).item())
            res.append(dict(case=i, phase=p, cfg=cfg['type'], errs=errs, counts=m.token_counts,
                            merge_calls=[ref_calls, calls], same_state=same_state))
    # the one-kernel matching against ToMe.select (edge sets; random data has no ties), on one
    # stream or on hidden + residual
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import (Streams, init_reduction_state,
                                                 plan_merge_step, reduce_tokens)
    match = []
    for phase, (bsz, n, cls, dim, k, metric, split) in [
            (ph, c) for ph in phases for c in [(3, 20, 10, 16, 5, 'norm_input', False),
                                               (2, 21, -1, 40, 7, 'stream', True),
                                               (2, 196, 98, 64, 14, 'norm_input', True),
                                               # beyond one tile: the blocked route
                                               (2, 300, 150, 40, 60, 'norm_input', True),
                                               (1, 301, -1, 24, 151, 'stream', False)]]:
        use(phase)    # its matching kernel's launch configuration
        ctx = init_reduction_state(ScanContext((1, n), cls_index=cls), bsz, 'cpu')
        x = torch.randn(bsz, n + (cls >= 0), dim)
        resid = torch.randn_like(x) if split else None
        layer = torch.nn.Module()
        layer.norm = torch.nn.Module()
        layer.norm.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        rem0, dst0, _ = ToMe(r=k, locations=(0, ), metric=metric).select(
            0, k, Streams(x, resid), ctx, layer)
        rem1, dst1 = tm.tome_match(x, resid, layer.norm.weight if metric == 'norm_input' else None,
                                   n, cls, k)
        same = all(set(zip(a.tolist(), c.tolist(), strict=True))
                   == set(zip(b.tolist(), d.tolist(), strict=True))
                   for a, b, c, d in zip(rem0, rem1, dst0, dst1, strict=True))
        if n > 256:   # the blocked route's plan (second launch) against plan_merge's
            from amvim_mm.token_layout import cls_index_for
            rem2, dst2, got = tm.tome_match(
                x, resid, layer.norm.weight if metric == 'norm_input' else None, n, cls, k,
                plan_state=(ctx.pos, ctx.size, ctx.source))
            ref = tm.plan_merge(ctx.pos, ctx.size, ctx.source, rem2, dst2,
                                cls_index_for(n - k, cls >= 0))
            same = same and torch.equal(rem1, rem2) and torch.equal(dst1, dst2) and all(
                torch.equal(a, b) for a, b in zip((*got[0], *got[1:]), (*ref[0], *ref[1:]),
                                                  strict=True))
        match.append(same)
    use(phases[0])   # the rest does not read the settings
    # a planned merge step (bookkeeping kernel + merge inside the fused add + RMSNorm) against
    # reduce_tokens(fold=True): merged stream, normalised output, pos/size/source
    from amvim_mm.ops.fused_mixer import fused_add_rmsnorm
    plans = []
    for cls, prune in ((7, False), (-1, False), (7, True)):   # prune: some dst -1
        torch.manual_seed(1)
        n, bsz, dim, k = 15, 3, 24, 5
        ctx = init_reduction_state(ScanContext((3, 5), cls_index=cls), bsz, 'cpu')
        ctx.size = torch.randint(1, 4, ctx.size.shape).float()   # earlier merges
        L = n + (cls >= 0)
        h, resid = torch.randn(bsz, L, dim), torch.randn(bsz, L, dim)
        w = torch.rand(dim) + 0.5
        patches = [i for i in range(L) if i != cls]
        removed, dst = [], []
        for b in range(bsz):   # k distinct removed tokens, each into a random survivor
            perm = torch.randperm(n).tolist()
            rem = sorted(patches[i] for i in perm[:k])
            keep = [patches[i] for i in perm[k:]]
            removed.append(rem)
            dst.append([keep[j] if not prune or t % 2 else -1
                        for t, j in enumerate(torch.randint(0, len(keep), (k, )).tolist())])
        removed, dst = torch.tensor(removed), torch.tensor(dst)
        ref_h, _, ref_ctx = reduce_tokens(ctx, h, resid, removed, dst, fold=True, prunes=prune)
        plan, new_ctx = plan_merge_step(ctx, removed, dst,
                                        stream=resid + h if prune else None)
        normed, merged = fused_add_rmsnorm(h, resid, w, 1e-5, merge=plan)
        ref_normed = ref_h * torch.rsqrt(ref_h.pow(2).mean(-1, keepdim=True) + 1e-5) * w
        plans.append(dict(
            stream=((merged - ref_h).abs().max() / ref_h.abs().max()).item(),
            torch_plan=((tm.apply_merge_plan(h, resid, plan) - ref_h).abs().max()).item(),
            normed=((normed - ref_normed).abs().max()).item(),
            state=all(torch.equal(getattr(new_ctx, a), getattr(ref_ctx, a))
                      for a in ('pos', 'source')) and torch.allclose(new_ctx.size, ref_ctx.size)
            and new_ctx.cls_index == ref_ctx.cls_index,
            frozen=None if not prune else torch.equal(new_ctx.frozen, ref_ctx.frozen),
            pruned=int((new_ctx.source < 0).sum())))
    # rank-ordered path indices of reduced sequences against path_permutation
    from amvim_mm.models.layout.scan_orders import path_permutation, scan_rank
    perms = []
    for grid, spec, with_cls in [((7, 6), dict(order='window', size=2, inner='col', seed=0,
                                                reverse=True), True),
                                 ((7, 6), dict(order='window', size=3, inner='row', seed=0,
                                                reverse=False), False)]:
        M, keep = grid[0] * grid[1], 17
        rank = scan_rank(*grid, spec)
        pos = torch.stack([torch.sort(torch.randperm(M)[:keep]).values for _ in range(3)])
        ci = keep // 2 if with_cls else -1
        if with_cls:
            pos = torch.cat([pos[:, :ci], torch.full((3, 1), -1), pos[:, ci:]], 1)
        # two paths in one launch: the window path and the raster path backwards (a flip)
        raster = scan_rank(*grid, dict(order='raster'))
        ref = torch.stack([path_permutation(rank, pos, ci, spec['reverse'], n_patches=keep),
                           path_permutation(raster, pos, ci, True, n_patches=keep)])
        out = tm.rank_path_perms(pos, torch.stack([rank, raster]).to(torch.int32),
                                 torch.tensor([int(spec['reverse']), 1], dtype=torch.int32),
                                 ci, keep)
        perms.append(torch.equal(ref.to(torch.int32), out)
                     and torch.equal(out[1], torch.arange(pos.shape[1]).flip(0)
                                     .to(torch.int32).expand(3, -1)))
    # the one-kernel embedding against the reference (patch GEMM, class token, position
    # embedding): fp32 and fp16 autocast (16-bit patches and weights, the product rounded to
    # fp16), with and without a class token, an image that needs corner padding
    embeds = []
    for cfg, (h, w) in [(dict(type='Vim', arch='test', img_size=64), (64, 48)),
                        (dict(type='Vim', arch='test', img_size=64, with_cls_token=False),
                         (70, 50))]:
        torch.manual_seed(2)
        m = MODELS.build(dict(cfg, out_type='featmap')).eval()
        x = torch.randn(2, 3, h, w)
        for dt in (None, torch.float16):
            got = {}
            for fused in (False, True):
                for layer in m.layers:
                    layer.mixer.fused = fused
                with torch.no_grad(), torch.autocast('cpu', dtype=dt or torch.float32,
                                                     enabled=dt is not None):
                    tok, ctx = m.embed(x)
                got[fused] = (tok, ctx.cls_index, ctx.grid)
            (a, ca, ga), (b, cb, gb) = got[True], got[False]
            embeds.append(dict(shape=a.shape == b.shape, dtype=a.dtype == b.dtype,
                               ctx=(ca, ga) == (cb, gb), half=dt is not None,
                               err=((a - b).abs().max() / b.abs().max()).item(),
                               mean=((a - b).abs().mean() / b.abs().mean()).item()))
    print('RESULT' + json.dumps(dict(models=res, match=match, perms=perms, plans=plans,
                                     embeds=embeds)))
''')


TOP_SCRIPT = textwrap.dedent('''
    import json
    import torch
    import amvim_mm
    from amvim_mm.registry import MODELS
    torch.manual_seed(0)
    out = []
    for typ, size, red, out_type in [
            ('Vim', 48, dict(type='ToP', keep_rate=0.7, locations=(0, 1)), 'featmap'),
            ('AMVim', 64, dict(type='ToP', keep_rate=0.6, locations=(1, ), gap_delta='token'),
             'featmap'),
            ('Vim', 48, dict(type='DynamicViT', keep_rate=0.7, locations=(1, )), 'cls_token'),
            ('Vim', 48, dict(type='EViT', keep_rate=0.7, locations=(0, 1)), 'featmap')]:
        cfg = dict(type=typ, arch='test', img_size=size, out_type=out_type, token_reduction=red)
        if out_type == 'featmap':
            cfg['out_indices'] = (-1, )
        fused = MODELS.build(dict(cfg, fused_mixer=True)).eval()
        ref = MODELS.build(dict(cfg, fused_mixer=False, scan_backend='torch')).eval()
        ref.load_state_dict(fused.state_dict())
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            plan = fused.execution_plan(x)
            routes = sorted({b.mixer.route for b in plan.blocks})
            a, b = fused(x)[0], ref(x)[0]
        ctx = fused.last_context
        out.append(dict(routes=routes, err=((a - b).abs().max() / b.abs().max()).item(),
                        same=torch.equal(ctx.source, ref.last_context.source),
                        merge=sorted({s.merge for s in plan.steps}), planned=ctx.steps,
                        frozen=ctx.frozen is not None, dense=out_type == 'featmap'))
    print('RESULT' + json.dumps(out))
''')


@needs_triton
def test_importance_reducers_on_the_triton_route_equal_the_pytorch_mixer_in_the_interpreter():
    """ToP's importance (the block before each step) and aligned scans (every later block,
    gap_delta bias and token, Vim's two paths and AMVim's four) on the fused Triton route of
    the whole backbone, against the PyTorch mixer: same survivors, outputs to 1e-5 (fp32).
    The steps (ToP's and DynamicViT's pruning, EViT's merge into its fused token) are planned
    into the next add + RMSNorm; the removed patches keep their features for dense outputs
    only."""
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', FAST_INTERPRETER + TOP_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    out = json.loads(line[len('RESULT'):])
    assert len(out) == 4
    for r in out:
        assert r['routes'] == ['triton'] and r['same'] and r['err'] < 1e-5, r
        assert r['merge'] == ['triton'] and 'plan' in r['planned'], r
        assert r['frozen'] == r['dense'], r


# (scan launch configuration, ToMe matching and reduced paths in Triton, the matching kernel's
# launch configuration (BLOCK_D, warps, pipeline stages), the model cases run): dt_proj in the
# kernel with matching and reduced paths in PyTorch on every case; dt_proj as a matmul with
# matching and reduced paths in Triton on the cases that differ in what the scan reads (Vim's
# shared paths, AMVim's four paths with per-sample pruned ones) and on both ToMe cases (with
# and without a class token). Cases 1, 2 and 5 (window sizes, shifted windows, no class token)
# change the path indices only, which the scan reads the same way under either configuration
PHASES = [('32,1,1', '0', '32,8,1', [0, 1, 2, 3, 4, 5, 6]),
          ('16,1,0', '1', '64,4,2', [0, 3, 4, 6])]


@needs_triton
def test_fused_matches_unfused_in_triton_interpreter():
    """Both phases of PHASES in one interpreter process (the unfused reference once per case):
    whole backbones fused vs unfused to 1e-5 with the same reduction state; the matching kernel
    against ToMe.select under each matching configuration; merge plans, reduced path indices
    and the one-kernel embedding (these read no setting) once."""
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', FAST_INTERPRETER + INTERPRETER_SCRIPT,
                           json.dumps(PHASES)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    out = json.loads(line[len('RESULT'):])
    assert out['match'] == [True] * 5 * len(PHASES) and out['perms'] == [True, True]
    assert len(out['embeds']) == 4
    for e in out['embeds']:   # fp16: a few accumulation-order flips of one fp16 step (~1e-3)
        assert e['shape'] and e['dtype'] and e['ctx'], e
        assert e['err'] < (2e-3 if e['half'] else 1e-5) and e['mean'] < 1e-4, e
    assert len(out['plans']) == 3
    for p in out['plans']:
        assert p['stream'] < 1e-6 and p['torch_plan'] < 1e-5 and p['normed'] < 1e-5, p
        assert p['state'], p
    # the pruning plan: patches without a carrier, their features frozen as reduce_tokens does
    assert [p['pruned'] > 0 for p in out['plans']] == [False, False, True]
    assert out['plans'][2]['frozen'] is True
    results = out['models']
    assert [(r['case'], r['phase']) for r in results] == [
        (i, p) for i in range(7) for p, phase in enumerate(PHASES) if i in phase[3]]
    for r in results:
        assert max(r['errs']) < 1e-5, r
        assert r['same_state'], r
    by = {(r['case'], r['phase']): r for r in results}
    for p, (_, match, _, _) in enumerate(PHASES):
        # ToMe's steps were planned for the fused add + RMSNorm (amvim_mm.ops.token_merge) on
        # the fused side only: by the matching kernel itself, or (matching in PyTorch) by
        # plan_merge
        for i in (3, 6):
            (steps0, plans0), (steps1, plans1) = by[i, p]['merge_calls']
            assert steps0 == plans0 == 0 and steps1 > 0, by[i, p]
            assert plans1 == (0 if match == '1' else steps1), by[i, p]
        # the reduced cases really ran on shorter sequences (per-sample path indices)
        assert by[3, p]['counts'][-1] < by[3, p]['counts'][0]
        assert by[4, p]['counts'][-1] < by[4, p]['counts'][0]


def test_match_config_env_is_validated(monkeypatch):
    from amvim_mm.ops.token_merge import MATCH_CONFIG, match_config
    monkeypatch.delenv('AMVIM_TOME_MATCH_CONFIG', raising=False)
    assert match_config() == MATCH_CONFIG
    monkeypatch.setenv('AMVIM_TOME_MATCH_CONFIG', '64,4,2')
    assert match_config() == (64, 4, 2)
    monkeypatch.setenv('AMVIM_TOME_MATCH_CONFIG', '64,4')
    with pytest.raises(ValueError, match='AMVIM_TOME_MATCH_CONFIG=.64,4.: expected "BLOCK_D'):
        match_config()


def test_embed_config_env_is_validated(monkeypatch):
    from amvim_mm.ops.fused_embed import EMBED_CONFIG, embed_config
    monkeypatch.delenv('AMVIM_EMBED_CONFIG', raising=False)
    assert embed_config() == EMBED_CONFIG
    monkeypatch.setenv('AMVIM_EMBED_CONFIG', '32,64,4,2')
    assert embed_config() == (32, 64, 4, 2)
    monkeypatch.setenv('AMVIM_EMBED_CONFIG', '32,64,4')
    with pytest.raises(ValueError, match='AMVIM_EMBED_CONFIG=.*BLOCK_M,BLOCK_N,num_warps'):
        embed_config()


def test_fused_scan_config_env_is_validated(monkeypatch):
    from amvim_mm.ops.scan_choice import DEFAULT_SCAN_CONFIG, scan_config
    assert scan_config(12345) == DEFAULT_SCAN_CONFIG and scan_config(384) == (64, 2, False)
    monkeypatch.setenv('AMVIM_FUSED_SCAN_CONFIG', '16,2,0')
    assert scan_config(384) == (16, 2, False)
    monkeypatch.setenv('AMVIM_FUSED_SCAN_CONFIG', '16x2')
    with pytest.raises(ValueError, match='expected "BLOCK_E,num_warps,dt_in_kernel"'):
        scan_config(384)


def test_auto_choice_takes_mamba_only_where_the_table_says(monkeypatch):
    from amvim_mm.ops import scan_choice as SC
    # the small batches at long sequences that kept the mamba-ssm kernels before the chunked
    # scan (resolution sweep: 768 / 1024 px at batch 11 / 6) now take the chunked fused scan
    assert SC.auto_prefers_fused(11, 384, True, 2305) and SC.auto_prefers_fused(6, 384, True, 4097)
    assert SC.auto_scan_choice(11, 384, 2305, 2, True).startswith('chunk')
    assert SC.auto_scan_choice(6, 384, 4097, 2, True).startswith('chunk')
    assert SC.auto_prefers_fused(128, 384, True, 197) and SC.auto_prefers_fused(1, 384, True, 197)
    assert SC.auto_scan_choice(16, 384, 197, 2, True) == 'seq'
    # a measured 'mamba' entry is honoured when the kernel is installed (nearest batch: 8)
    monkeypatch.setitem(SC.SCAN_CHOICE_TABLE, (384, 4097),
                        {**SC.SCAN_CHOICE_TABLE[(384, 4097)], 8: 'mamba'})
    assert not SC.auto_prefers_fused(6, 384, True, 4097)
    assert SC.auto_prefers_fused(6, 384, False, 4097)   # no mamba-ssm: the fused scan
    assert SC.auto_prefers_fused(6, 768, True, 4097)    # another width's row


def test_reduction_kernels_switch_is_validated(monkeypatch):
    from amvim_mm.ops.token_merge import extra_kernels_enabled
    monkeypatch.delenv('AMVIM_FUSED_REDUCTION_KERNELS', raising=False)
    assert extra_kernels_enabled() is True     # on by default since run 9
    monkeypatch.setenv('AMVIM_FUSED_REDUCTION_KERNELS', 'off')
    assert extra_kernels_enabled() is False
    monkeypatch.setenv('AMVIM_FUSED_REDUCTION_KERNELS', 'sure')
    with pytest.raises(ValueError, match=r"AMVIM_FUSED_REDUCTION_KERNELS='sure': use 1"):
        extra_kernels_enabled()


def test_fused_switch_env_values(monkeypatch):
    monkeypatch.setenv('AMVIM_FUSED_MIXER', '0')
    assert fused_requested(None) is False and fused_requested(True) is True
    monkeypatch.setenv('AMVIM_FUSED_MIXER', '1')
    assert fused_requested(None) is True
    monkeypatch.setenv('AMVIM_FUSED_MIXER', 'auto')
    assert fused_requested(None) is None
    monkeypatch.setenv('AMVIM_FUSED_MIXER', 'fast')
    with pytest.raises(ValueError, match=r"AMVIM_FUSED_MIXER='fast': use 1 \(on\), 0 \(off\)"):
        fused_requested(None)


@needs_triton
@pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') == '1', reason='interpreter is on')
def test_fused_on_cpu_without_interpreter_says_how():
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32, fused_mixer=True)).eval()
    with torch.no_grad(), pytest.raises(RuntimeError, match='TRITON_INTERPRET=1'):
        m(torch.randn(1, 3, 32, 32))


def test_automatic_choice_trains_unfused_on_cpu():
    """The automatic choice (fused_mixer=None) never takes the fused path for CPU tensors,
    training included (forced fused training: tests/ops/test_fused_mixer_autograd.py)."""
    torch.manual_seed(0)
    a = MODELS.build(dict(type='AMVim', arch='test', img_size=48, fused_mixer=None))
    b = MODELS.build(dict(type='AMVim', arch='test', img_size=48, fused_mixer=False))
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 48, 48)
    assert not a.layers[0].mixer.use_fused(x, None)
    ya, yb = a(x)[0], b(x)[0]          # grad enabled: no Triton involved, same math
    assert torch.equal(ya, yb)
    ya.sum().backward()
    assert a.patch_embed.proj.weight.grad is not None


def test_localvim_never_fuses():
    m = MODELS.build(dict(type='LocalVim', arch='test', img_size=32, fused_mixer=True)).eval()
    assert not m.layers[0].mixer.supports_fused
    with torch.no_grad():
        out = m(torch.randn(1, 3, 32, 32))[0]   # no Triton call (would need the interpreter)
    assert out.shape == (1, 32)


# ------------------------------------------------------------------------------------- GPU
def gpu(fn):
    """GPU test: marked ``gpu`` and skipped with the reason where CUDA is absent."""
    fn = pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')(fn)
    return pytest.mark.gpu(fn)


def _rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _pair(cfg):
    torch.manual_seed(0)
    m = MODELS.build(dict(cfg, out_type='featmap', out_indices=(5, 23))).cuda().eval()
    return m


def _run(m, x, fused, dtype=None):
    for layer in m.layers:
        layer.mixer.fused = fused
    with torch.no_grad(), torch.autocast('cuda', dtype=dtype or torch.float32,
                                         enabled=dtype is not None):
        return m(x)


GPU_CASES = [
    dict(type='Vim', arch='tiny', img_size=224),
    dict(type='AMVim', arch='tiny', img_size=224),
    dict(type='AMVim', arch='tiny', img_size=224, shift_odd_blocks=True, windowed_path=0),
    dict(type='Vim', arch='small', img_size=224),
    dict(type='Vim', arch='tiny', img_size=224,
         token_reduction=dict(type='RandomPrune', ratio=0.36)),
]
# ToMe's matching is a discrete choice on the features: in bf16 the two paths' rounding can
# flip near-tied matches (different merges, not a kernel error), so it is compared in fp32
TOME = dict(type='AMVim', arch='tiny', img_size=224, token_reduction=dict(type='ToMe', ratio=0.36))


@pytest.mark.parametrize('cfg, dtype', [(c, d) for c in GPU_CASES for d in (None, torch.bfloat16)]
                         + [(TOME, None)])
@gpu
def test_gpu_fused_matches_unfused(cfg, dtype):
    m = _pair(cfg)
    x = torch.randn(4, 3, 224, 160, device='cuda')
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ref = _run(m, x, False, dtype)
        out = _run(m, x, True, dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    tol = 1e-4 if dtype is None else 3e-2
    for a, b in zip(out, ref, strict=True):
        assert a.shape == b.shape and torch.isfinite(a).all()
        assert _rel(a, b) < tol


@pytest.mark.parametrize('with_cls', [True, False])
@gpu
def test_gpu_fused_embedding_matches_reference(with_cls):
    """The one-kernel embedding under bf16 autocast (an image that needs corner padding): the
    patch product is rounded to bf16 like F.linear's, so only accumulation-order flips of one
    bf16 step remain (not rounding would leave a mean error of ~1/4 step everywhere)."""
    m = _pair(dict(type='Vim', arch='small', img_size=224, with_cls_token=with_cls))
    x = torch.randn(8, 3, 230, 200, device='cuda')
    got = {}
    for fused in (False, True):
        for layer in m.layers:
            layer.mixer.fused = fused
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
            got[fused] = m.embed(x)
    (a, ca), (b, cb) = got[True], got[False]
    assert a.shape == b.shape == (8, 15 * 13 + with_cls, 384) and a.dtype == b.dtype
    assert (ca.cls_index, ca.grid) == (cb.cls_index, cb.grid)
    assert _rel(a, b) < 1e-2
    assert (a - b).abs().mean() < 1e-4 * b.abs().mean()


@gpu
def test_gpu_fused_is_chosen_automatically_and_graph_capturable():
    m = _pair(dict(type='AMVim', arch='tiny', img_size=224))
    x = torch.randn(16, 3, 224, 224, device='cuda')   # L = 197: the sequential fused scan
    mixer = m.layers[0].mixer
    from amvim_mm.models.layout.scan_context import ScanContext
    h = torch.randn(16, 197, 192, device='cuda')
    with torch.no_grad():
        assert mixer.use_fused(h, ScanContext((14, 14), 98, device='cuda'))
    # training (amvim_mm.ops.fused_mixer_autograd): automatically only under 16-bit autocast
    # from 512 tokens on, where it measured faster than the unfused path
    h.requires_grad_()
    assert not mixer.use_fused(h, ScanContext((14, 14), 98, device='cuda'))
    long = torch.randn(2, 1025, 192, device='cuda', requires_grad=True)
    assert not mixer.use_fused(long, ScanContext((32, 32), 512, device='cuda'))
    with torch.autocast('cuda', dtype=torch.bfloat16):
        assert mixer.use_fused(long, ScanContext((32, 32), 512, device='cuda'))
        assert not mixer.use_fused(h, ScanContext((14, 14), 98, device='cuda'))
    from amvim_mm.bench.measure import eager_and_replayed
    with torch.no_grad():
        ref, out = eager_and_replayed(lambda: m(x)[0])
    assert torch.equal(out, ref)


@pytest.mark.parametrize('kernels', ['1', '0'])
@gpu
def test_gpu_fused_reduction_kernels(monkeypatch, kernels):
    """ToMe on the fused path, compiled (planned merge steps in the fused add + RMSNorm, the
    matching and reduced path indices in Triton or, with the switch off, PyTorch) against the
    unfused model (fp32)."""
    monkeypatch.setenv('AMVIM_FUSED_REDUCTION_KERNELS', kernels)
    m = _pair(TOME)
    x = torch.randn(4, 3, 224, 160, device='cuda')
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ref = _run(m, x, False)
        out = _run(m, x, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    for a, b in zip(out, ref, strict=True):
        assert a.shape == b.shape and _rel(a, b) < 1e-4


@gpu
def test_gpu_tome_match_in_bf16_finds_planted_edges():
    """Under bf16 autocast the matching kernel's dot products run in tf32: on data whose edges
    are well separated it picks the same edges as fp32 PyTorch, reading a bf16 ``hidden`` and
    an fp32 ``residual``."""
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import Streams, init_reduction_state
    from amvim_mm.ops.token_merge import tome_match
    torch.manual_seed(0)
    B, n, cls, D, k = 8, 196, 98, 192, 14
    x = torch.randn(B, n + 1, D, device='cuda')
    patches = [i for i in range(n + 1) if i != cls]
    a_idx, b_idx = patches[0::2], patches[1::2]
    for b in range(B):   # each A token's planted partner, noise growing with j: distinct edges
        partner = torch.randperm(len(b_idx)).tolist()
        for j, i in enumerate(a_idx):
            noise = 0.1 + 0.05 * torch.randperm(len(a_idx))[j].item()
            x[b, b_idx[partner[j]]] = x[b, i] + noise * torch.randn(D, device='cuda')
    hidden = x.to(torch.bfloat16)
    residual = (x - hidden.float()) + 0.0          # fp32: hidden + residual == x
    ctx = init_reduction_state(ScanContext((14, 14), cls_index=cls), B, 'cuda')
    layer = torch.nn.Module()
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.nn.Parameter(torch.rand(D, device='cuda') + 0.5)
    rem0, dst0, _ = ToMe(r=k, locations=(0, )).select(0, k, Streams(x, None), ctx, layer)
    with torch.autocast('cuda', dtype=torch.bfloat16):
        rem1, dst1 = tome_match(hidden, residual, layer.norm.weight, n, cls, k,
                                precision='tf32')
    for a, b, c, d in zip(rem0, rem1, dst0, dst1, strict=True):
        assert set(zip(a.tolist(), c.tolist(), strict=True)) == \
            set(zip(b.tolist(), d.tolist(), strict=True))


@gpu
def test_gpu_tome_match_fp32_equals_select_on_near_ties():
    """Under bf16 autocast the default (3xTF32) and 'ieee' dot products pick exactly
    ToMe.select's edges on streams whose edges are about 1e-4 apart in cosine similarity
    (resolved by fp32, not by bf16's 8 mantissa bits)."""
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import Streams, init_reduction_state
    from amvim_mm.ops.token_merge import tome_match
    torch.manual_seed(1)
    B, n, cls, D, k = 16, 196, 98, 192, 30
    x = torch.randn(B, n + 1, D, device='cuda')
    a_idx = torch.arange(0, cls - 1, 2, device='cuda')             # 49 A tokens before cls
    for b in range(B):  # A token j's partner: x_j + eps_j |x_j| u, u a unit vector orthogonal
        # to x_j, so 1 - cos = 1 - (1 + eps_j^2)^-1/2 exactly, eps_j = 0.03 (1 + 0.1 rank_j)
        xa = x[b, a_idx]
        rank = torch.randperm(len(a_idx), device='cuda').float()
        u = torch.randn_like(xa)
        u = u - (u * xa).sum(-1, keepdim=True) / (xa * xa).sum(-1, keepdim=True) * xa
        u = u / u.norm(dim=-1, keepdim=True)
        eps = 0.03 * (1 + 0.1 * rank)[:, None]
        x[b, a_idx + 1] = xa + eps * xa.norm(dim=-1, keepdim=True) * u
    hidden = x.to(torch.bfloat16)
    residual = x - hidden.float()
    ctx = init_reduction_state(ScanContext((14, 14), cls_index=cls), B, 'cuda')
    layer = torch.nn.Module()
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.nn.Parameter(torch.ones(D, device='cuda'))
    rem0, dst0, _ = ToMe(r=k, locations=(0, )).select(0, k, Streams(hidden, residual), ctx,
                                                       layer)
    for precision in ('tf32x3', 'ieee'):
        with torch.autocast('cuda', dtype=torch.bfloat16):
            rem1, dst1 = tome_match(hidden, residual, layer.norm.weight, n, cls, k,
                                    precision=precision)
        assert torch.equal(rem0, rem1) and torch.equal(dst0, dst1), precision


@needs_triton
def test_tome_match_limits_are_named():
    from amvim_mm.ops.token_merge import tome_match
    with pytest.raises(ValueError, match='cannot merge 20 of 10 tokens'):
        tome_match(torch.randn(1, 21, 8), None, None, 20, 10, 20)


@gpu
def test_gpu_tome_match_blocked_equals_select_at_dense_lengths():
    """A 512 crop's 1024 patch tokens (set A of 512 rows, beyond one tile): the blocked route
    picks ToMe.select's edges in its order (fp32 streams, the default 3xTF32 products; each A
    token has a planted partner whose similarity is 1e-4 or more from the next one's: random
    streams of this length have best scores closer than the products' rounding), and its merge
    plan equals plan_merge's of those edges."""
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import Streams, init_reduction_state
    from amvim_mm.ops.token_merge import plan_merge, tome_match
    from amvim_mm.token_layout import cls_index_for
    torch.manual_seed(2)
    B, n, cls, D, k = 3, 1024, 512, 192, 300
    x = torch.randn(B, n + 1, D, device='cuda')
    patches = torch.tensor([i for i in range(n + 1) if i != cls], device='cuda')
    a_idx, b_idx = patches[0::2], patches[1::2]
    for b in range(B):
        partner = b_idx[torch.randperm(len(b_idx), device='cuda')]
        noise = 0.05 + 0.002 * torch.randperm(len(a_idx), device='cuda').float()[:, None]
        x[b, partner] = x[b, a_idx] + noise * torch.randn(len(a_idx), D, device='cuda')
    residual = torch.randn_like(x)
    hidden = x - residual
    ctx = init_reduction_state(ScanContext((32, 32), cls_index=cls), B, 'cuda')
    layer = torch.nn.Module()
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.nn.Parameter(torch.rand(D, device='cuda') + 0.5)
    rem0, dst0, _ = ToMe(r=k, locations=(0, )).select(0, k, Streams(hidden, residual), ctx,
                                                       layer)
    rem1, dst1, (plan, npos, nsize, nsrc) = tome_match(
        hidden, residual, layer.norm.weight, n, cls, k, plan_state=(ctx.pos, ctx.size,
                                                                    ctx.source))
    assert torch.equal(rem0, rem1) and torch.equal(dst0, dst1)
    ref = plan_merge(ctx.pos, ctx.size, ctx.source, rem0, dst0, cls_index_for(n - k, True))
    for a, b in zip((*plan, npos, nsize, nsrc), (*ref[0], *ref[1:]), strict=True):
        assert torch.equal(a, b)
