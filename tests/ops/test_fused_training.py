"""The trainable pieces of the fused path against their PyTorch references:

- ``FusedAddRMSNorm`` (amvim_mm.ops.fused_add_rmsnorm): ``res = residual + s * hidden`` then
  RMSNorm, Triton forward and backward, against ``residual + s * hidden`` and the project's
  ``RMSNorm`` module under autograd (fp32, fp64 with an explicit formula and ``gradcheck``,
  bf16 autocast);
- ``FusedPatchEmbed`` (amvim_mm.ops.fused_embed): the fused embedding kernel with a PyTorch
  backward, against the unfused ``VimFamilyBackbone.embed`` (a plan made with ``fused=False``);
- the wiring: ``VimBlock.forward`` on the Triton routes under autograd (the mixer forced onto its
  unfused path, since the fused mixer is not trainable here) against ``fused=False``, and a
  whole Vim-test backbone whose mixers are switched to ``fused=True`` (the forward's plan says
  Triton) against the unfused one.

On CPU the kernels run in Triton's interpreter, switched on before Python starts, so those
checks run once in a subprocess with ``TRITON_INTERPRET=1`` (a module fixture) and each test
asserts one part of its result. The GPU tests compile the kernels.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.models.vim.norm import RMSNorm
from amvim_mm.registry import MODELS
from amvim_mm.testing.triton_interpreter import PREAMBLE as FAST_INTERPRETER
from tests.ops.triton_support import HAS_TRITON, needs_triton  # noqa: F401


INTERPRETER_SCRIPT = textwrap.dedent('''
    import json, torch, amvim_mm
    import amvim_mm.models.vim.block as blockmod
    import amvim_mm.ops.fused_embed as fe
    from amvim_mm.models.vim.norm import RMSNorm
    from amvim_mm.ops.fused_add_rmsnorm import fused_add_rmsnorm_train
    from amvim_mm.registry import MODELS

    def rel(a, b):
        a, b = a.detach().double(), b.detach().double()
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()

    KEEP = 0.7
    def norm_inputs(B, L, D, dtype, h_dtype, has_res, has_scale, seed):
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(B, L, D, generator=g, dtype=dtype).to(h_dtype).requires_grad_()
        r = (torch.randn(B, L, D, generator=g, dtype=dtype) * 2).requires_grad_() \\
            if has_res else None
        w = (torch.rand(D, generator=g, dtype=dtype) + 0.5).requires_grad_()
        # some samples dropped (0), the others kept and divided by the keep probability
        s = (torch.tensor([1., 0., 1., 1., 0.])[:B] / KEEP).to(dtype) if has_scale else None
        go = torch.randn(B, L, D, generator=g, dtype=dtype)
        gr = torch.randn(B, L, D, generator=g, dtype=dtype)
        return h, r, w, s, go, gr

    def reference_stream(h, r, s):
        sh = h if s is None else s[:, None, None] * h
        return sh if r is None else r + sh

    # ---- add + RMSNorm in fp32: against the project's RMSNorm module under autograd
    norm32 = []
    for B, L, D, has_res, has_scale, use in [
            (3, 7, 24, True, True, 'both'), (3, 7, 24, True, False, 'both'),
            (2, 13, 40, False, False, 'both'), (2, 13, 40, False, True, 'both'),
            (4, 5, 40, True, True, 'both'), (5, 3, 24, True, False, 'out'),
            (2, 9, 24, True, True, 'res'), (1, 1, 24, True, False, 'both')]:
        h, r, w, s, go, gr = norm_inputs(B, L, D, torch.float32, torch.float32, has_res,
                                         has_scale, B * 100 + L * 10 + D)
        norm = RMSNorm(D, eps=1e-5)
        with torch.no_grad():
            norm.weight.copy_(w)
        ins = [t for t in (h, r, norm.weight) if t is not None]
        out, res = fused_add_rmsnorm_train(h, r, norm.weight, 1e-5, scale=s)
        x = reference_stream(h, r, s)
        ref = norm(x)
        outs = {'out': ([out], [ref], [go]), 'res': ([res], [x], [gr]),
                'both': ([out, res], [ref, x], [go, gr])}[use]
        got = torch.autograd.grad(outs[0], ins, outs[2])
        want = torch.autograd.grad(outs[1], ins, outs[2], allow_unused=True)
        want = [torch.zeros_like(t) if g is None else g for t, g in zip(ins, want, strict=True)]
        names = ['dh', 'dr', 'dw'] if has_res else ['dh', 'dw']
        norm32.append(dict(case=[B, L, D, has_res, has_scale, use], out=rel(out, ref),
                           res=rel(res, x), dtypes=[str(out.dtype), str(res.dtype)],
                           **{n: rel(a, b) for n, a, b in zip(names, got, want, strict=True)}))
    # only some inputs require grad: h (no dr, no dw), then w alone
    h, r, w, s, go, gr = norm_inputs(3, 6, 24, torch.float32, torch.float32, True, True, 5)
    r.requires_grad_(False)
    w.requires_grad_(False)
    x = reference_stream(h, r, s)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    dh = torch.autograd.grad(fused_add_rmsnorm_train(h, r, w, 1e-5, scale=s), h, [go, gr])[0]
    dh_ref = torch.autograd.grad([ref, x], h, [go, gr])[0]
    h.requires_grad_(False)
    w.requires_grad_(True)
    dw = torch.autograd.grad(fused_add_rmsnorm_train(h, r, w, 1e-5, scale=s)[0], w, go)[0]
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    dw_ref = torch.autograd.grad(ref, w, go)[0]
    partial = dict(dh=rel(dh, dh_ref), dw=rel(dw, dw_ref))

    # ---- fp64: the explicit formula in fp64 (the RMSNorm module computes in fp32), gradcheck
    norm64 = []
    for B, L, D, has_res, has_scale in [(3, 7, 24, True, True), (2, 13, 40, False, True),
                                        (4, 5, 40, True, False)]:
        h, r, w, s, go, gr = norm_inputs(B, L, D, torch.float64, torch.float64, has_res,
                                         has_scale, 7 + D)
        ins = [t for t in (h, r, w) if t is not None]
        out, res = fused_add_rmsnorm_train(h, r, w, 1e-5, scale=s)
        x = reference_stream(h, r, s)
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
        got = torch.autograd.grad([out, res], ins, [go, gr])
        want = torch.autograd.grad([ref, x], ins, [go, gr])
        names = ['dh', 'dr', 'dw'] if has_res else ['dh', 'dw']
        norm64.append(dict(case=[B, L, D, has_res, has_scale], out=rel(out, ref),
                           res=rel(res, x), dtypes=[str(out.dtype), str(res.dtype)],
                           **{n: rel(a, b) for n, a, b in zip(names, got, want, strict=True)}))
    gradcheck = []
    for has_res in (True, False):
        h, r, w, s, _, _ = norm_inputs(2, 3, 5, torch.float64, torch.float64, has_res, True, 11)
        ins = tuple(t for t in (h, r, w) if t is not None)
        fn = (lambda h, r, w: fused_add_rmsnorm_train(h, r, w, 1e-5, scale=s)) if has_res \\
            else (lambda h, w: fused_add_rmsnorm_train(h, None, w, 1e-5, scale=s))
        try:
            gradcheck.append(bool(torch.autograd.gradcheck(fn, ins, eps=1e-6, atol=1e-7)))
        except Exception as e:
            gradcheck.append(str(e)[:500])

    # ---- bf16 autocast: bf16 hidden, fp32 residual and weight (the block under autocast)
    norm16 = []
    for B, L, D, has_res, has_scale in [(3, 9, 40, True, True), (2, 7, 24, True, False),
                                        (2, 7, 24, False, False)]:
        h, r, w, s, go, gr = norm_inputs(B, L, D, torch.float32, torch.bfloat16, has_res,
                                         has_scale, 3 + D)
        go = go.bfloat16()
        norm = RMSNorm(D, eps=1e-5)
        with torch.no_grad():
            norm.weight.copy_(w)
        ins = [t for t in (h, r, norm.weight) if t is not None]
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out, res = fused_add_rmsnorm_train(h, r, norm.weight, 1e-5, scale=s)
            x = reference_stream(h, r, s).float()
            ref = norm(x)
        got = torch.autograd.grad([out, res], ins, [go, gr])
        want = torch.autograd.grad([ref, x], ins, [go.float(), gr])
        names = ['dh', 'dr', 'dw'] if has_res else ['dh', 'dw']
        norm16.append(dict(case=[B, L, D, has_res, has_scale], out=rel(out, ref),
                           res=rel(res, x), dtypes=[str(out.dtype), str(res.dtype)],
                           grad_dtypes=[str(t.dtype) for t in got],
                           **{n: rel(a, b) for n, a, b in zip(names, got, want, strict=True)}))

    # ---- the trainable fused embedding against the unfused embed
    embed_calls = []
    kernel = fe.fused_patch_embed
    def counting_kernel(*a, **k):
        embed_calls.append(1)
        return kernel(*a, **k)
    fe.fused_patch_embed = counting_kernel
    embeds = []
    for with_cls, (H, W), dt in [(True, (64, 64), None), (True, (72, 56), None),
                                 (False, (64, 64), None), (False, (80, 48), None),
                                 (True, (72, 56), torch.float16)]:
        torch.manual_seed(3)
        m = MODELS.build(dict(type='Vim', arch='test', img_size=64, with_cls_token=with_cls,
                              out_type='featmap')).train()
        pe = m.patch_embed
        x = torch.randn(2, 3, H, W, requires_grad=True)
        names = ['weight', 'bias', 'pos_embed', 'image'] + (['cls_token'] if with_cls else [])
        params = [pe.proj.weight, pe.proj.bias, m.pos_embed, x] + \\
            ([m.cls_token] if with_cls else [])
        got = {}
        for fused in (False, True):
            n0 = len(embed_calls)
            with torch.autocast('cpu', dtype=dt or torch.float32, enabled=dt is not None):
                tok, ctx = m.embed(x, m.execution_plan(x, fused))
            go = torch.randn(tok.shape, generator=torch.Generator().manual_seed(4))
            got[fused] = (tok, torch.autograd.grad(tok, params, go), len(embed_calls) - n0,
                          (ctx.cls_index, tuple(ctx.grid)))
        (a, ga, na, ca), (b, gb, nb, cb) = got[True], got[False]
        mid = (m.pos_embed.shape[1] - 1) // 2    # the class token's entry of the parameter
        embeds.append(dict(case=[with_cls, H, W, str(dt)], calls=[nb, na], ctx=ca == cb,
                           shape=list(a.shape), same_shape=a.shape == b.shape,
                           dtype=a.dtype == b.dtype, out=rel(a, b),
                           pos_resized=tuple(ca[1]) != (4, 4),
                           pos_grad_nonzero=bool(gb[2].abs().sum() > 0),
                           mid_row_zero=[bool(g[2][0, mid].abs().sum() == 0) for g in (ga, gb)],
                           **{n: rel(p, q) for n, p, q in zip(names, ga, gb, strict=True)}))
    fe.fused_patch_embed = kernel

    # ---- VimBlock.forward on the Triton routes under autograd against the PyTorch ones
    train_calls, infer_calls = [], []
    train_fn, infer_fn = blockmod.fused_add_rmsnorm_train, blockmod.fused_add_rmsnorm
    def counting_train(*a, **k):
        train_calls.append(k.get('scale'))
        return train_fn(*a, **k)
    def counting_infer(*a, **k):
        infer_calls.append(1)
        return infer_fn(*a, **k)
    blockmod.fused_add_rmsnorm_train = counting_train
    blockmod.fused_add_rmsnorm = counting_infer

    def force_unfused_mixers(model):
        # the block hands the Triton route to its mixer; the mixer itself is not trainable on the
        # fused path here, so its unfused forward runs (same math)
        for layer in model.layers:
            inner = type(layer.mixer).forward.__get__(layer.mixer)
            layer.mixer.forward = \\
                lambda h, ctx, paths, route=None, mixer=layer.mixer: mixer.forward_torch(
                    h, ctx, paths)

    from amvim_mm.models.reduction.state import init_reduction_state, plan_merge_step
    from dataclasses import replace
    from amvim_mm.models.execution import call_facts, plan_vim

    def block_route(blk, h, r, ctx, fused):
        # the block's routes under the caller's Triton decision (the forward's plan, forced)
        facts = call_facts(h, blk.mixer.mixer_facts(), blk.block_facts(blk.training),
                           blk.training, ctx=ctx, residual=r)
        return plan_vim(replace(facts, forced=fused)).block(0)

    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64, drop_path_rate=0.6,
                          out_type='featmap')).train()
    force_unfused_mixers(m)
    blk = m.layers[-1]
    Bsz = 4
    with torch.no_grad():
        x0 = torch.randn(Bsz, 3, 64, 64)
        tok, ctx = m.embed(x0, m.execution_plan(x0, False))
    seed = next(i for i in range(1000) if 0 < int(torch.empty(Bsz, 1, 1).bernoulli_(
        1 - blk.drop_path.drop_prob, generator=torch.Generator().manual_seed(i)).sum()) < Bsz)
    g = torch.Generator().manual_seed(5)
    hidden0 = torch.randn(tok.shape, generator=g)
    resid0 = tok + torch.randn(tok.shape, generator=g)
    # a ToMe step planned for the block: 3 tokens of each sample merged into survivors
    rctx = init_reduction_state(ctx, Bsz, 'cpu')
    patches = [i for i in range(tok.shape[1]) if i != ctx.cls_index]
    removed = torch.stack([torch.tensor(sorted(patches[j] for j in torch.randperm(
        len(patches), generator=g)[:3].tolist())) for _ in range(Bsz)])
    dst = torch.stack([torch.tensor([next(p for p in patches if p not in row.tolist())] * 3)
                       for row in removed])
    plan, mctx = plan_merge_step(rctx, removed, dst)
    blocks = []
    for name, with_res, merge, training in [('residual+drop_path', True, False, True),
                                           ('no residual', False, False, True),
                                           ('merge plan', True, True, True),
                                           ('eval', True, False, False)]:
        blk.train(training)
        got = {}
        for fused in (False, True):
            h = hidden0.clone().requires_grad_()
            r = resid0.clone().requires_grad_() if with_res else None
            n_train, n_infer = len(train_calls), len(infer_calls)
            torch.manual_seed(seed)
            c = mctx if merge else ctx
            out_h, out_r = blk(h, r, c, merge=plan if merge else None,
                               route=block_route(blk, h, r, c, fused))
            gh = torch.randn(out_h.shape, generator=torch.Generator().manual_seed(6))
            gr = torch.randn(out_r.shape, generator=torch.Generator().manual_seed(7))
            ins = [h] + ([r] if with_res else []) + [blk.norm.weight, blk.mixer.in_proj.weight,
                                                     blk.mixer.out_proj.weight]
            grads = torch.autograd.grad([out_h, out_r], ins, [gh, gr])
            got[fused] = (out_h, out_r, grads, len(train_calls) - n_train,
                          len(infer_calls) - n_infer)
        names = ['d_hidden'] + (['d_residual'] if with_res else []) + [
            'd_norm.weight', 'd_in_proj', 'd_out_proj']
        (ah, ar, ag, at, ai), (bh, br, bg, bt, bi) = got[True], got[False]
        scale = train_calls[-1] if at else None
        blocks.append(dict(case=name, calls=[[bt, bi], [at, ai]], hidden=rel(ah, bh),
                           residual=rel(ar, br), res_dtype=str(ar.dtype),
                           scale=None if scale is None else scale.tolist(),
                           drop_prob=blk.drop_path.drop_prob,
                           **{n: rel(p, q) for n, p, q in zip(names, ag, bg, strict=True)}))
    with torch.no_grad():   # eval without gradients: the inference kernel, as before
        blk.eval()
        n_train, n_infer = len(train_calls), len(infer_calls)
        a = blk(hidden0, resid0, ctx, route=block_route(blk, hidden0, resid0, ctx, True))
        b = blk(hidden0, resid0, ctx, route=block_route(blk, hidden0, resid0, ctx, False))
        blocks.append(dict(case='no_grad', calls=[len(train_calls) - n_train,
                                                  len(infer_calls) - n_infer],
                           hidden=rel(a[0], b[0]), residual=rel(a[1], b[1])))

    # ---- a whole backbone: mixers switched to fused=True (the forward's decision), so the
    # embedding and every block's add + RMSNorm take the trainable Functions
    torch.manual_seed(1)
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64, drop_path_rate=0.5,
                          out_type='featmap', out_indices=(1, 3))).train()
    force_unfused_mixers(m)
    x = torch.randn(Bsz, 3, 72, 56)
    named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
    got = {}
    for fused in (False, True):
        for layer in m.layers:
            layer.mixer.fused = fused      # the mixers' switch: the forward's Triton decision
        n_train, n_embed = len(train_calls), len(embed_calls)
        fe.fused_patch_embed = counting_kernel
        decision = m.execution_plan(x).fused
        torch.manual_seed(2)
        outs = m(x)
        fe.fused_patch_embed = kernel
        gos = [torch.randn(o.shape, generator=torch.Generator().manual_seed(8)) for o in outs]
        grads = torch.autograd.grad(outs, [p for _, p in named], gos, allow_unused=True)
        got[fused] = (outs, grads, decision, len(train_calls) - n_train,
                      len(embed_calls) - n_embed)
    (ao, ag, ad, at, ae), (bo, bg, bd, bt, be) = got[True], got[False]
    grad_errs = {n: (None if (p is None or q is None) else rel(p, q))
                 for (n, _), p, q in zip(named, ag, bg, strict=True)}
    backbone = dict(decision=[bd, ad], calls=[[bt, be], [at, ae]], layers=len(m.layers),
                    outs=[rel(p, q) for p, q in zip(ao, bo, strict=True)],
                    none_match=all((p is None) == (q is None) for p, q in zip(ag, bg, strict=True)),
                    grads=grad_errs)
    print('RESULT' + json.dumps(dict(norm32=norm32, partial=partial, norm64=norm64,
                                     gradcheck=gradcheck, norm16=norm16, embeds=embeds,
                                     blocks=blocks, backbone=backbone)))
''')


@pytest.fixture(scope='module')
def interp():
    """Run the interpreter script once; its JSON result."""
    if not HAS_TRITON:
        pytest.skip('triton is not installed')
    env = dict(os.environ, TRITON_INTERPRET='1', OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', FAST_INTERPRETER + INTERPRETER_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT')][-1]
    return json.loads(line[len('RESULT'):])


def _grad_keys(case):
    return [k for k in ('dh', 'dr', 'dw') if k in case]


@needs_triton
def test_add_rmsnorm_fp32_matches_rmsnorm_module(interp):
    """fp32: outputs and the gradients of h, r, w within 1e-5 (relative to the largest value)
    of ``residual + s * h`` and the RMSNorm module, with / without residual and drop-path
    scale, D = 24 and 40 (non-powers of two), rows crossing the kernel's row blocks, upstream
    gradients on both outputs or on one only."""
    cases = interp['norm32']
    assert len(cases) == 8
    for c in cases:
        assert c['dtypes'] == ['torch.float32', 'torch.float32'], c
        assert c['out'] < 1e-5 and c['res'] < 1e-6, c
        keys = _grad_keys(c)
        assert len(keys) == (3 if c['case'][3] else 2), c
        for k in keys:
            assert c[k] < 1e-5, (k, c)
    assert interp['partial']['dh'] < 1e-5 and interp['partial']['dw'] < 1e-5, interp['partial']


@needs_triton
def test_add_rmsnorm_fp64_and_gradcheck(interp):
    """fp64 streams are computed in fp64: against the formula in fp64 to 1e-12, and
    ``torch.autograd.gradcheck`` (finite differences) passes with and without residual."""
    for c in interp['norm64']:
        assert c['dtypes'] == ['torch.float64', 'torch.float64'], c
        assert c['out'] < 1e-12 and c['res'] < 1e-15, c
        for k in _grad_keys(c):
            assert c[k] < 1e-12, (k, c)
    assert interp['gradcheck'] == [True, True]


@needs_triton
def test_add_rmsnorm_bf16_autocast(interp):
    """bf16 autocast (bf16 hidden, fp32 residual and weight): ``out`` is bf16 and within one
    bf16 step (1e-2 of the largest value: the interpreter truncates fp32 -> bf16, a GPU
    rounds), ``res`` and the fp32 gradients (residual, weight) within 1e-5 of the fp32
    reference, the bf16 ``dh`` within one bf16 step."""
    for c in interp['norm16']:
        assert c['dtypes'] == ['torch.bfloat16', 'torch.float32'], c
        assert c['grad_dtypes'][0] == 'torch.bfloat16', c
        assert all(d == 'torch.float32' for d in c['grad_dtypes'][1:]), c
        assert c['out'] < 1e-2 and c['res'] < 1e-6, c
        assert c['dh'] < 1e-2 and c['dw'] < 1e-5, c
        if 'dr' in c:
            assert c['dr'] < 1e-5, c


@needs_triton
def test_fused_embedding_gradients_match_unfused_embed(interp):
    """The trainable fused embedding against ``embed(fused=False)``: tokens, and the
    gradients of the patch weight, bias, position embedding (resized for 72x56 / 80x48
    inputs: the gradient flows through the interpolation), class token and image, fp32 to
    1e-5; under fp16 autocast to 1e-2 (16-bit GEMMs in both; the fused product is rounded
    once more). The fused side really ran the kernel once (the unfused side never)."""
    cases = interp['embeds']
    assert len(cases) == 5
    for c in cases:
        assert c['calls'] == [0, 1] and c['ctx'] and c['same_shape'] and c['dtype'], c
        assert c['pos_grad_nonzero'], c
        with_cls, half = c['case'][0], c['case'][3] != 'None'
        if not with_cls:   # the class token's entry of pos_embed is skipped: no gradient
            assert c['mid_row_zero'] == [True, True], c
        keys = ['weight', 'bias', 'pos_embed', 'image'] + (['cls_token'] if with_cls else [])
        tol = 1e-2 if half else 1e-5
        assert c['out'] < (2e-3 if half else 1e-5), c
        for k in keys:
            assert c[k] < tol, (k, c)
    assert [c['pos_resized'] for c in cases] == [False, True, False, True, True]


@needs_triton
def test_block_fused_training_matches_unfused_block(interp):
    """``VimBlock.forward`` on the Triton routes under autograd (the mixer on its unfused path) equals
    ``fused=False``: outputs and gradients (hidden, residual, norm weight, mixer weights) to
    1e-5, with stochastic depth drawn from the same seed (some samples dropped, some kept),
    block 0 without a residual, and a ToMe merge plan (applied in PyTorch, then the trainable
    add + RMSNorm); in eval mode with gradients too. Without gradients the inference kernel
    stays."""
    cases = {c['case']: c for c in interp['blocks']}
    assert set(cases) == {'residual+drop_path', 'no residual', 'merge plan', 'eval', 'no_grad'}
    for name in ('residual+drop_path', 'no residual', 'merge plan', 'eval'):
        c = cases[name]
        assert c['calls'] == [[0, 0], [1, 0]], c      # unfused: no kernel; fused: trainable
        assert c['res_dtype'] == 'torch.float32'
        for k in ('hidden', 'residual', 'd_hidden', 'd_norm.weight', 'd_in_proj',
                  'd_out_proj') + (('d_residual', ) if name != 'no residual' else ()):
            assert c[k] < 1e-5, (k, c)
    c = cases['residual+drop_path']
    drop, keep = c['scale'], 1 - c['drop_prob']
    assert c['drop_prob'] > 0 and len(drop) == 4, c
    assert 0. in drop and any(abs(v - 1 / keep) < 1e-6 for v in drop), drop
    assert all(v == 0. or abs(v - 1 / keep) < 1e-6 for v in drop), drop
    for name in ('no residual', 'merge plan', 'eval'):   # no stochastic depth there
        assert cases[name]['scale'] is None, cases[name]
    c = cases['no_grad']
    assert c['calls'] == [0, 1] and c['hidden'] < 1e-5 and c['residual'] < 1e-5, c


@needs_triton
def test_backbone_takes_both_trainable_pieces_on_the_fused_decision(interp):
    """A Vim-test backbone in training (stochastic depth, a 72x56 input: position embedding
    resized) whose mixers are switched to ``fused=True``: the forward's decision is True, the
    embedding and every block's add + RMSNorm run the trainable Functions, and outputs and
    every parameter's gradient equal the unfused backbone's to 1e-5."""
    b = interp['backbone']
    assert b['decision'] == [False, True]
    assert b['calls'] == [[0, 0], [b['layers'], 1]], b
    assert max(b['outs']) < 1e-5, b
    assert b['none_match'], b
    errs = {k: v for k, v in b['grads'].items() if v is not None}
    assert 'pos_embed' in errs and 'cls_token' in errs and 'patch_embed.proj.weight' in errs
    assert 'layers.0.norm.weight' in errs and len(errs) > 20
    assert max(errs.values()) < 1e-5, errs


def test_drop_path_scale_is_forwards_factor():
    """``DropPath.scale`` draws the mask ``forward`` draws (same seed, same numbers) and returns
    ``mask / keep_prob`` per sample; None where ``forward`` is the identity."""
    from amvim_mm.models.skeleton.drop import DropPath
    dp = DropPath(0.4).train()
    x = torch.randn(16, 5, 3)
    torch.manual_seed(0)
    ref = dp(x)
    torch.manual_seed(0)
    s = dp.scale(x)
    assert s.shape == (16, ) and s.dtype == torch.float32
    assert all(v == 0. or abs(v - 1 / 0.6) < 1e-6 for v in s.tolist())
    assert 0 < int((s > 0).sum()) < 16
    torch.testing.assert_close(x * s[:, None, None], ref, rtol=1e-6, atol=0)
    assert dp.eval().scale(x) is None and DropPath(0.).train().scale(x) is None


def test_autograd_functions_need_the_interpreter_on_cpu():
    """Without TRITON_INTERPRET the CPU call says how to enable it (this process has none)."""
    if not HAS_TRITON:
        pytest.skip('triton is not installed')
    import triton as _triton
    if _triton.knobs.runtime.interpret:
        pytest.skip('this process runs with TRITON_INTERPRET=1')
    from amvim_mm.ops.fused_add_rmsnorm import fused_add_rmsnorm_train
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET=1'):
        fused_add_rmsnorm_train(torch.randn(2, 3, 8), None, torch.ones(8), 1e-5)


# ------------------------------------------------------------------------------------- GPU
def gpu(fn):
    """GPU test: marked ``gpu`` and skipped with the reason where CUDA is absent."""
    fn = pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA is not available')(fn)
    return pytest.mark.gpu(fn)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize('D', [192, 384])
@pytest.mark.parametrize('dtype', [None, torch.bfloat16])
@pytest.mark.parametrize('has_res, has_scale', [(True, True), (True, False), (False, False)])
@gpu
def test_gpu_add_rmsnorm_gradients(D, dtype, has_res, has_scale):
    """At Vim's shapes (B = 8, L = 1025): outputs and gradients against ``residual + s * h``
    and the RMSNorm module. fp32: 1e-5 (``dw``, a sum over 8200 rows in another order: 2e-5);
    bf16 autocast (bf16 hidden): ``out`` and ``dh`` within one bf16 step (1e-2), the fp32
    ``res`` / ``dr`` / ``dw`` as in fp32."""
    from amvim_mm.ops.fused_add_rmsnorm import fused_add_rmsnorm_train
    torch.manual_seed(0)
    B, L = 8, 1025
    h = torch.randn(B, L, D, device='cuda').to(dtype or torch.float32).requires_grad_()
    r = (torch.randn(B, L, D, device='cuda') * 2).requires_grad_() if has_res else None
    norm = RMSNorm(D).cuda()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(D) + 0.5)
    s = (torch.tensor([1., 0., 1., 1., 0., 1., 1., 1.], device='cuda') / 0.7) \
        if has_scale else None
    go = torch.randn(B, L, D, device='cuda').to(dtype or torch.float32)
    gr = torch.randn(B, L, D, device='cuda')
    ins = [t for t in (h, r, norm.weight) if t is not None]
    with torch.autocast('cuda', dtype=dtype or torch.float32, enabled=dtype is not None):
        out, res = fused_add_rmsnorm_train(h, r, norm.weight, norm.eps, scale=s)
        sh = h if s is None else s[:, None, None] * h
        x = (sh if r is None else r + sh).float()
        ref = norm(x)
    assert out.dtype == (dtype or torch.float32) and res.dtype == torch.float32
    got = torch.autograd.grad([out, res], ins, [go, gr])
    want = torch.autograd.grad([ref, x], ins, [go.float(), gr])
    assert _rel(res, x) < 1e-6
    assert _rel(out, ref) < (1e-2 if dtype else 1e-5)
    assert _rel(got[0], want[0]) < (1e-2 if dtype else 1e-5)          # dh
    if has_res:
        assert _rel(got[1], want[1]) < 1e-5                            # dr
    assert _rel(got[-1], want[-1]) < 2e-5                              # dw


@pytest.mark.parametrize('arch', ['tiny', 'small'])
@pytest.mark.parametrize('with_cls', [True, False])
@gpu
def test_gpu_fused_embedding_gradients(exact_fp32, monkeypatch, arch, with_cls):
    """B = 8 images of 512 x 512 (L = 1025 with the class token; position embedding resized
    from 224's grid), D = 192 / 384. fp32: the Function (the model keeps cuBLAS in fp32 on
    CUDA, so it is called directly) against ``embed(fused=False)``, tokens and gradients to
    1e-5; bf16 autocast through ``embed`` (the fused decision forced): tokens 1e-2, gradients
    1e-2 (16-bit GEMMs on both sides)."""
    from amvim_mm.ops.fused_embed import fused_patch_embed_train
    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch=arch, img_size=224, with_cls_token=with_cls,
                          out_type='featmap')).cuda().train()
    pe = m.patch_embed
    x = torch.randn(8, 3, 512, 512, device='cuda', requires_grad=True)
    params = [pe.proj.weight, pe.proj.bias, m.pos_embed, x] + ([m.cls_token] if with_cls else [])
    ref, _ = m.embed(x, m.execution_plan(x, False))
    assert ref.shape == (8, 1024 + with_cls, m.embed_dims)
    go = torch.randn_like(ref)
    want = torch.autograd.grad(ref, params, go)
    tok = fused_patch_embed_train(x, pe.proj.weight, pe.proj.bias, m.pos_embed_for((32, 32)),
                                  m.cls_token if with_cls else None, 16, (32, 32))
    got = torch.autograd.grad(tok, params, go)
    assert _rel(tok, ref) < 1e-5
    for a, b in zip(got, want, strict=True):
        assert _rel(a, b) < 1e-5
    import amvim_mm.ops.fused_embed as fe
    calls, kernel = [], fe.fused_patch_embed
    monkeypatch.setattr(fe, 'fused_patch_embed', lambda *a: calls.append(1) or kernel(*a))
    with torch.autocast('cuda', dtype=torch.bfloat16):
        ref16, _ = m.embed(x, m.execution_plan(x, False))
        tok16, _ = m.embed(x, m.execution_plan(x, True))
    assert len(calls) == 1 and tok16.dtype == ref16.dtype == torch.float32
    assert _rel(tok16, ref16) < 1e-2
    got = torch.autograd.grad(tok16, params, go)
    want = torch.autograd.grad(ref16, params, go)
    for a, b in zip(got, want, strict=True):
        assert _rel(a, b) < 1e-2
