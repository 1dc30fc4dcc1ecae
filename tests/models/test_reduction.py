"""Token reduction: contract, schedules, order preservation, alignment, dense restore, training."""
import pytest
import torch
import torch.nn.functional as F

import amvim_mm  # noqa: F401
from amvim_mm.analysis import token_survival, vim_family_flops
from amvim_mm.models.layout.scan_orders import is_reverse, scan_rank
from amvim_mm.models.reduction import ReductionSchedule, build_reducer
from amvim_mm.models.layout.scan_context import path_gaps
from amvim_mm.ops.selective_scan import selective_scan_ref
from amvim_mm.registry import MODELS


def build(typ='Vim', **kw):
    cfg = dict(type=typ, arch='test', img_size=64, out_type='featmap', out_indices=(0, 1, 2, 3))
    cfg.update(kw)
    return MODELS.build(cfg)


@pytest.fixture(scope='module')
def tiny_pair():
    torch.manual_seed(0)
    return {t: MODELS.build(dict(type=t, arch='tiny', img_size=224, out_type='featmap',
                                 out_indices=(5, 11, 17, 23))).eval() for t in ('Vim', 'AMVim')}


@pytest.mark.slow
@pytest.mark.parametrize('typ', ['Vim', 'AMVim'])
@pytest.mark.parametrize('method', ['ToMe', 'RandomPrune'])
def test_contract_tiny_224(tiny_pair, typ, method):
    base = tiny_pair[typ]
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    m0 = MODELS.build(dict(type=typ, arch='tiny', img_size=224, out_type='featmap',
                           out_indices=(5, 11, 17, 23),
                           token_reduction=dict(type=method, ratio=0))).eval()
    m0.load_state_dict(base.state_dict())
    m46 = MODELS.build(dict(type=typ, arch='tiny', img_size=224, out_type='featmap',
                            out_indices=(5, 11, 17, 23),
                            token_reduction=dict(type=method, ratio=0.46))).eval()
    m46.load_state_dict(base.state_dict())
    with torch.no_grad():
        ref = base(x)
        same = m0(x)
        red = m46(x)
    assert all(torch.equal(a, b) for a, b in zip(ref, same, strict=True))
    assert len(red) == 4
    for o in red:
        assert o.shape == (1, 192, 14, 14) and torch.isfinite(o).all()
    assert m46.token_counts[-1] == 29


@pytest.mark.parametrize('bad,match', [
    (dict(type='ToMe', ratio=1.0), r'ratio must be a number in \[0, 1\), got 1.0'),
    (dict(type='ToMe', ratio=-0.1), r'ratio must be a number in \[0, 1\), got -0.1'),
    (dict(type='RandomPrune', ratio=1.5), r'ratio must be a number in \[0, 1\)'),
    (dict(type='Tome', ratio=0.2), "unknown token_reduction type 'Tome'"),
    (dict(type='ToMe', r=20), 'removes 40 tokens but the input has only 16 patch tokens'),
    (dict(type='ToMe'), 'give exactly one of ratio, r or keep_rate'),
    (dict(type='ToMe', ratio=0.2, r=3), 'give exactly one of ratio, r or keep_rate'),
    (dict(type='ToP', keep_rate=0.8), 'keep_rate needs locations'),
    (dict(type='ToP', ratio=0.2), "cannot reduce before block 0"),
    (dict(type='ToMe', ratio=0.2, speed=3), "unexpected keyword argument 'speed'"),
    (dict(type='ToMe', r=[1, 2]), 'r has 2 entries for 4 blocks'),
])
def test_bad_schedules_fail_at_build(bad, match):
    with pytest.raises((ValueError, KeyError, TypeError), match=match):
        MODELS.build(dict(type='Vim', arch='test', img_size=64, token_reduction=bad))


def test_amvim_schedule_numbers():
    for ratio, r, final, realised in [(0.17, 5, 137, 0.166), (0.27, 8, 101, 0.265),
                                      (0.36, 11, 65, 0.365), (0.46, 14, 29, 0.464)]:
        s = ReductionSchedule.build(ratio=ratio)
        rem = s.removals(196, 24)
        assert rem == [r if i % 2 == 0 and i <= 22 else 0 for i in range(24)]
        assert ReductionSchedule.token_counts(rem, 196)[-1] == final
        assert round(ReductionSchedule.realised_ratio(rem, 196), 3) == realised
        same = ReductionSchedule.build(r=r).removals(196, 24)
        assert same == rem


def test_top_protocol_schedule():
    rem = ReductionSchedule.build(keep_rate=0.8, locations=(10, 20)).removals(196, 24)
    assert rem[11] == 196 - 156 and rem[21] == 156 - 124 and sum(rem) == 72


def test_flops_counter_tiny():
    m = MODELS.build(dict(type='Vim', arch='tiny'))
    g = [vim_family_flops(m, 224, dict(type='ToMe', ratio=r) if r else None,
                          num_classes=1000)['gflops'] for r in (0, 0.17, 0.27, 0.36, 0.46)]
    # FLOPs fall with the tokens and equal the analytic count of the convention
    assert g == sorted(g, reverse=True)
    D, E, N, R, L = 192, 384, 16, 12, 197
    per = L * D * 2 * E + L * E * D + 2 * (L * E * 4 + L * E * (R + 2 * N) + L * R * E
                                           + 9 * L * E * N)
    assert g[0] == pytest.approx((196 * 3 * 256 * D + 24 * per + D * 1000) / 1e9)


def test_flops_localmamba_convention_vs_published():
    """The papers' counter (LocalMamba's flops()) against the AMVim paper's Vim-T row."""
    m = MODELS.build(dict(type='Vim', arch='tiny'))
    published = [1.45, 1.27, 1.13, 1.00, 0.86]
    ratios = (0, 0.17, 0.27, 0.36, 0.46)

    def g(after):
        return [vim_family_flops(m, 224, dict(type='ToMe', ratio=r) if r else None,
                                 num_classes=1000, convention='localmamba',
                                 count_after_merge=after)['gflops'] for r in ratios]
    # merges counted from the block after each even block: every row within 3 %
    for ours, pub in zip(g(True), published, strict=True):
        assert abs(ours / pub - 1) < 0.03
    # as our protocol applies them (before the even blocks) the strongest ratio is 6 % lower
    assert abs(g(False)[-1] / published[-1] - 1) > 0.05
    with pytest.raises(ValueError, match="FLOPs convention 'fvcore' is not defined"):
        vim_family_flops(m, 224, None, convention='fvcore')


@pytest.mark.parametrize('typ', ['Vim', 'AMVim', 'LocalVim'])
@pytest.mark.parametrize('method', [dict(type='ToMe', r=2), dict(type='RandomPrune', r=3),
                                    dict(type='ToP', keep_rate=0.6, locations=(0, 1)),
                                    dict(type='EViT', keep_rate=0.6, locations=(0, 1))])
def test_zero_removal_is_identical_and_reduction_runs(typ, method):
    torch.manual_seed(0)
    extra = dict(img_size=64)
    base = build(typ, **extra).eval()
    x = torch.randn(2, 3, 64, 64)
    zero = dict(method)
    if 'r' in zero:
        zero['r'] = 0
    else:
        zero['keep_rate'] = 1.0
    for out_type in ('featmap', 'cls_token'):
        base.out_type = out_type
        m = build(typ, token_reduction=zero, out_type=out_type, **extra).eval()
        m.load_state_dict(base.state_dict())
        assert all(torch.equal(a, b) for a, b in zip(base(x), m(x), strict=True))
        m.set_token_reduction(method)
        outs = m(x)
        assert all(torch.isfinite(o).all() for o in outs)
        assert m.token_counts[-1] < 17  # 16 patches + class token
        if out_type == 'featmap':
            assert all(o.shape == (2, 32, 4, 4) for o in outs)


def _state_after(model, x):
    model.eval()
    with torch.no_grad():
        model(x)
    return model.last_context


@pytest.mark.parametrize('typ', ['Vim', 'AMVim'])
@pytest.mark.parametrize('method', [dict(type='ToMe', r=5), dict(type='RandomPrune', r=5,
                                                                   seed=3)])
def test_survivors_in_rank_order_sizes_and_middle_cls(typ, method):
    m = build(typ, img_size=128, out_type='raw', token_reduction=method)
    x = torch.randn(3, 3, 128, 128)
    ctx = _state_after(m, x)
    M = 64
    if method['type'] == 'ToMe':
        assert torch.allclose(ctx.size.sum(1) - 1, torch.full((3, ), float(M)))  # - cls size
    n_patch = int((ctx.pos[0] >= 0).sum())
    assert ctx.cls_index == n_patch // 2 and (ctx.pos[:, ctx.cls_index] == -1).all()
    # survivors stay in raster (token) order
    patches = ctx.pos[ctx.pos >= 0].view(3, -1)
    assert torch.equal(patches, patches.sort(1).values)
    for spec in m.layers[-1].paths:
        perm = ctx.path_index(spec).indices(ctx.pos)
        seq = torch.gather(ctx.pos, 1, perm)
        fwd = seq.flip(1) if is_reverse(spec) else seq
        assert (fwd[:, n_patch // 2] == -1).all()          # class token mid-path
        rank = scan_rank(8, 8, spec)
        r = rank[fwd[fwd >= 0].view(3, -1)]
        assert torch.equal(r, r.sort(1).values)               # survivors in the path's rank order


def test_random_prune_is_seeded():
    x = torch.randn(2, 3, 64, 64)
    a = build(token_reduction=dict(type='RandomPrune', r=3, seed=1)).eval()
    b = build(token_reduction=dict(type='RandomPrune', r=3, seed=1)).eval()
    b.load_state_dict(a.state_dict())
    c = build(token_reduction=dict(type='RandomPrune', r=3, seed=2)).eval()
    c.load_state_dict(a.state_dict())
    assert torch.equal(a(x)[-1], b(x)[-1]) and torch.equal(a(x)[-1], a(x)[-1])
    assert not torch.equal(a(x)[-1], c(x)[-1])


@pytest.mark.parametrize('hw', [(64, 64), (80, 48), (50, 100)])
def test_dense_restore_shapes_any_size(hw):
    m = build(token_reduction=dict(type='ToMe', r=2)).eval()
    outs = m(torch.randn(1, 3, *hw))
    gh, gw = -(-(hw[0] - 16) // 16) + 1, -(-(hw[1] - 16) // 16) + 1
    assert all(o.shape == (1, 32, gh, gw) for o in outs)


def test_merged_sources_carry_their_token():
    m = build(out_type='featmap', out_indices=(2, ), final_norm=False,
              token_reduction=dict(type='ToMe', r=4)).eval()
    raw = build(out_type='raw', out_indices=(2, ), final_norm=False,
                token_reduction=dict(type='ToMe', r=4)).eval()
    raw.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 64, 64)
    fmap = m(x)[0].flatten(2).transpose(1, 2)              # (B, M, D)
    tokens = raw(x)[0]
    ctx = raw.last_context
    for b in range(2):
        for p in range(16):
            s = int(ctx.source[b, p])
            assert s >= 0
            assert torch.equal(fmap[b, p], tokens[b, s])
    merged = (ctx.size > 1).any()
    assert merged


def test_pruned_positions_get_their_frozen_features():
    m = build(out_type='featmap', out_indices=(0, 3), final_norm=False,
              token_reduction=dict(type='RandomPrune', r=[0, 3, 0, 0])).eval()
    full = build(out_type='featmap', out_indices=(0, ), final_norm=False).eval()
    full.load_state_dict(m.state_dict())
    x = torch.randn(1, 3, 64, 64)
    early, late = m(x)
    ctx = m.last_context
    pruned = (ctx.source[0] < 0).nonzero().flatten()
    assert len(pruned) == 3
    # the frozen value is the stream entering block 1, i.e. block 0's output
    ref0 = full(x)[0].flatten(2)[0]
    for p in pruned:
        assert torch.allclose(late.flatten(2)[0, :, p], ref0[:, p])


def test_path_gaps_match_bruteforce():
    torch.manual_seed(0)
    m = build(img_size=128, out_type='raw', token_reduction=dict(type='RandomPrune', r=[0, 20,
                                                                                        0, 0]))
    ctx = _state_after(m, torch.randn(2, 3, 128, 128))
    for spec in [dict(order='raster'), dict(order='raster', reverse=True),
                 dict(order='window', size=3, inner='col', reverse=True)]:
        perm = ctx.path_index(spec).indices(ctx.pos)
        gaps = path_gaps(ctx, spec, perm)
        rank = scan_rank(8, 8, spec)
        full = torch.argsort(rank)
        if is_reverse(spec):
            full = full.flip(0)
        for b in range(2):
            pruned = set((ctx.source[b] < 0).nonzero().flatten().tolist())
            expect, run = {}, 0
            for p in full.tolist():
                if p in pruned:
                    run += 1
                else:
                    expect[p] = run
                    run = 0
            seq = ctx.pos[b, perm[b]].tolist()
            for j, p in enumerate(seq):
                assert gaps[b, j] == (expect[p] if p >= 0 else 0)
        # the context's own answer (the neighbour-difference form on the raster paths)
        ctx.align, ctx._gaps = 'bias', {}
        assert torch.equal(ctx.path_gaps(spec), gaps)


def test_aligned_mixer_scan_equals_full_length_with_zero_input():
    """In a mixer, the aligned scan of the kept tokens equals the full-length scan in which the
    pruned positions have zero input and step softplus(dt_bias), read at the kept tokens."""
    torch.manual_seed(0)
    m = build(arch=dict(embed_dims=16, num_layers=2, d_state=4), out_indices=(-1, ))
    mixer = m.layers[0].mixer
    B, L, E = 2, 40, mixer.d_inner
    keep = torch.zeros(L, dtype=torch.bool)
    keep[torch.tensor([0, 1, 5, 6, 7, 20, 21, 33, 39])] = True
    gaps = torch.zeros(int(keep.sum()), dtype=torch.long)
    run, j = 0, 0
    for t in range(L):
        if keep[t]:
            gaps[j] = run
            run, j = 0, j + 1
        else:
            run += 1
    xz = torch.randn(B, int(keep.sum()), 2 * E)
    y = mixer.scan_path(0, xz.transpose(1, 2), gaps.expand(B, -1))        # (B, E, L)
    # the reference: recompute the kept tokens' conv/proj exactly as the mixer does, then a
    # full-length sequential scan with zero input and bias-only steps at the pruned positions
    conv, x_proj, dt_proj, A_log, D = mixer.path_params(0)
    x, z = xz.transpose(1, 2).chunk(2, dim=1)
    x = F.silu(F.conv1d(x, conv.weight, conv.bias, padding=3, groups=E)[..., :x.shape[-1]])
    dbl = F.linear(x.transpose(1, 2), x_proj.weight)
    dt, Bm, Cm = torch.split(dbl, [mixer.dt_rank, mixer.d_state, mixer.d_state], -1)
    dt = F.linear(dt, dt_proj.weight).transpose(1, 2)
    full_u = torch.zeros(B, E, L)
    full_u[:, :, keep] = x
    full_dt = F.softplus(dt_proj.bias)[None, :, None].expand(B, E, L).clone()
    full_dt[:, :, keep] = F.softplus(dt + dt_proj.bias[None, :, None])
    full_B = torch.zeros(B, mixer.d_state, L)
    full_B[:, :, keep] = Bm.transpose(1, 2)
    full_C = torch.zeros(B, mixer.d_state, L)
    full_C[:, :, keep] = Cm.transpose(1, 2)
    full_z = torch.zeros(B, E, L)
    full_z[:, :, keep] = z
    ref = selective_scan_ref(full_u, full_dt, -torch.exp(A_log.float()), full_B, full_C,
                             D.float(), full_z)[:, :, keep]
    got = y
    assert ((got - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize('method', [dict(type='ToMe', r=2),
                                    dict(type='ToP', keep_rate=0.7, locations=(0, 1))])
def test_training_with_reduction(method):
    torch.manual_seed(0)
    m = build(out_type='cls_token', out_indices=(-1, ), token_reduction=method, drop_path_rate=0.1)
    head = torch.nn.Linear(32, 5)
    opt = torch.optim.AdamW(list(m.parameters()) + list(head.parameters()), lr=1e-3)
    m.train()
    x = torch.randn(4, 3, 64, 64)
    y = torch.tensor([0, 1, 2, 3])
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(head(m(x)[0]), y)
        opt.zero_grad()
        loss.backward()
        assert m.patch_embed.proj.weight.grad is not None
        assert m.patch_embed.proj.weight.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))


def test_survival_rates():
    m = build('AMVim', img_size=128, out_type='raw', token_reduction=dict(type='ToMe', r=8))
    s = token_survival(m, torch.randn(2, 3, 128, 128))
    assert 0 < s['edge_survival'] < 1 and 0 < s['connectivity'] <= 1
    m.set_token_reduction(None)
    s = token_survival(m, torch.randn(2, 3, 128, 128))
    assert s['edge_survival'] == 1.0 and s['connectivity'] == 1.0


def test_build_reducer_errors():
    with pytest.raises(TypeError, match='must be a dict with a "type" key'):
        build_reducer('ToMe')
    with pytest.raises(ValueError, match="metric must be 'norm_input' or 'stream'"):
        build_reducer(dict(type='ToMe', r=1, metric='cos'))
    with pytest.raises(ValueError, match="gap_delta must be one of"):
        build_reducer(dict(type='ToP', keep_rate=0.8, locations=(1, ), gap_delta='x'))


def test_eval_folds_the_two_streams_into_one_merge():
    """At inference ToMe merges ``residual + hidden`` once (``fold``); the result equals the
    training-time merge of both streams (the size-weighted average is linear)."""
    from amvim_mm.models.reduction.state import init_reduction_state, reduce_tokens
    torch.manual_seed(0)
    m = MODELS.build(dict(type='AMVim', arch='test', img_size=64, out_type='raw',
                          token_reduction=dict(type='ToMe', ratio=0.27))).eval()
    hidden, ctx = m.embed(torch.randn(2, 3, 64, 64))
    ctx = init_reduction_state(ctx, 2, hidden.device)
    hidden, residual = m.layers[0](hidden, None, ctx)
    stream = residual + hidden
    removed, dst, weight = m.token_reducer.select(1, 3, stream, ctx, m.layers[1])
    h1, r1, c1 = reduce_tokens(ctx, hidden, residual, removed, dst, weight, fold=False)
    h2, r2, c2 = reduce_tokens(ctx, hidden, residual, removed, dst, weight, fold=True)
    assert r2 is None and h2.dtype == torch.float32 and h2.shape == h1.shape
    torch.testing.assert_close(h2, r1 + h1, rtol=1e-6, atol=1e-6)
    assert torch.equal(c1.pos, c2.pos) and torch.equal(c1.source, c2.source)
    # and a whole eval forward (fold) against the same model in train mode (no fold)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        a = m(x)[0]
        b = m.train()(x)[0]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_merging_reducer_that_prunes_must_say_so():
    """merges=True with some dst = -1: the dense restore needs the pruned patches' features."""
    from amvim_mm.errors import ConfigError
    from amvim_mm.models.reduction import TOKEN_REDUCERS, ToMe

    class MergeOrPrune(ToMe):
        def select(self, block, k, stream, ctx, layer):
            removed, dst, weight = super().select(block, k, stream, ctx, layer)
            dst = dst.clone()
            dst[:, 0] = -1            # prune the first, merge the rest
            return removed, dst, weight

    TOKEN_REDUCERS.register_module(name='MergeOrPrune', module=MergeOrPrune)
    try:
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        m = MODELS.build(dict(type='Vim', arch='test', img_size=64, out_type='featmap',
                              token_reduction=dict(type='MergeOrPrune', r=3,
                                                   locations=(1, )))).eval()
        with torch.no_grad(), pytest.raises(ConfigError, match='set prunes = True'):
            m(x)
        MergeOrPrune.prunes = True
        with torch.no_grad():
            out = m(x)[-1]
        ctx = m.last_context
        pruned = ctx.source < 0
        assert pruned.sum() == 2 and ctx.frozen is not None
        # the pruned patches are restored from their own frozen feature, not from token 0
        assert torch.isfinite(out).all()
        assert torch.any(ctx.frozen[pruned].abs().sum(-1) > 0)
    finally:
        TOKEN_REDUCERS.module_dict.pop('MergeOrPrune', None)


def test_importance_is_scored_only_in_the_block_before_a_step(monkeypatch):
    """ToP / EViT need the SSM output's importance of the block right before each step; every
    other block keeps the fused-path-eligible mixer (no importance)."""
    from amvim_mm.models.vim.mixer import BiMambaMixer
    seen = []
    orig = BiMambaMixer.forward

    def spy(self, hidden, ctx, paths, route=None):
        seen.append(bool(ctx.want_importance))
        return orig(self, hidden, ctx, paths, route=route)

    monkeypatch.setattr(BiMambaMixer, 'forward', spy)
    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch=dict(embed_dims=32, num_layers=6), img_size=32,
                          patch_size=4, stride=4, fused_mixer=False,
                          token_reduction=dict(type='ToP', keep_rate=0.7, locations=(1, 3))))
    m.eval()
    with torch.no_grad():
        m(torch.randn(1, 3, 32, 32))
    assert seen == [False, True, False, True, False, False]
