"""Token reduction on PlainMamba: the reduced mixer against independent re-statements (the
official mixer's zero-input full-length pass for ToP's alignment, the survivors' index pairing
without it), direction codes of survivors, dense restore, pooling, training and FLOPs."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.analysis.plainmamba_flops import plainmamba_flops
from amvim_mm.errors import ConfigError
from amvim_mm.models.plain_mamba.plain_mamba import L3_TOP_BUDGET
from amvim_mm.models.plain_mamba.mixer import PlainMamba2D
from amvim_mm.models.plain_mamba.scan import displacement_codes
from amvim_mm.models.layout import NO_CLS, ScanContext
from amvim_mm.models.reduction.state import init_reduction_state, reduce_tokens
from amvim_mm.registry import MODELS
from ..reference import official_plainmamba as ref


def _mixer(dtype=torch.float32, C=16, seed=0):
    torch.manual_seed(seed)
    m = PlainMamba2D(C, d_state=4, dt_rank=3, d_conv=3).to(dtype).eval()
    with torch.no_grad():                 # spread the parameters the quirks act on
        m.dt_proj.bias.uniform_(-3, 0.5)
        m.direction_Bs.normal_(0, 0.5)
        m.D.normal_(1, 0.5)
    return m


def _pruned(B, H, W, C, n_remove, dtype, seed=1):
    """Random tokens of an H x W grid and the context after pruning ``n_remove`` random cells
    per sample."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H * W, C, generator=g).to(dtype)
    ctx = init_reduction_state(ScanContext((H, W), cls_index=NO_CLS), B, 'cpu')
    removed = torch.stack([torch.randperm(H * W, generator=g)[:n_remove] for _ in range(B)])
    _, _, red = reduce_tokens(ctx, x, None, removed, torch.full_like(removed, -1),
                              merges=False)
    kept = torch.gather(x, 1, red.pos.unsqueeze(-1).expand(-1, -1, C))
    return x, kept, red


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize('dtype,tol', [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_aligned_scan_equals_full_length_zero_input_pass(dtype, tol):
    """ToP's alignment on PlainMamba: the reduced mixer equals the official mixer run over the
    full length with zero input at the pruned cells (their xc = 0: dt = the bias, B = the
    direction bias, C = 0, with the first quirk's raster pairing), read at the kept cells."""
    m = _mixer(dtype)
    H, W, B = 5, 6, 2
    x, kept, red = _pruned(B, H, W, 16, 11, dtype)
    red.align = 'bias'
    present = torch.zeros(B, H * W, dtype=torch.bool).scatter_(1, red.pos, True)
    sd = m.state_dict()
    with torch.no_grad():
        got = m(kept, red)
        full = ref.plain_mamba_2d(sd, '', x, (H, W), present=present)
    want = torch.gather(full, 1, red.pos.unsqueeze(-1).expand(-1, -1, 16))
    assert _rel(got, want) <= tol
    # without alignment the result differs: the test can fail
    red.align = None
    with torch.no_grad():
        plain = m(kept, red)
    assert _rel(plain, want) > 1e-3


def _reduced_official(sd, kept, pos, hw, zero_gap_steps=None):
    """The official mixer on a reduced sequence, sample by sample: the conv on the grid with
    zeros at the absent cells; each direction visits the survivors in its own order; step j
    takes delta, B, C of the survivor stored at index j (the first quirk's pairing) and the
    full-grid direction code of the survivor it visits."""
    H, W = hw
    orders, codes = ref.snake_orders(H, W)
    rank = ref.inverse_orders(orders)                                   # (4, M) step of a cell
    A = -torch.exp(sd['A_log'])
    N, R = A.shape[1], sd['dt_proj.weight'].shape[1]
    outs = []
    for b in range(kept.shape[0]):
        cells = pos[b]
        xz = torch.nn.functional.linear(kept[b], sd['in_proj.weight'], sd['in_proj.bias'])
        E = xz.shape[-1] // 2
        xi, z = xz[:, :E], xz[:, E:]
        grid = xi.new_zeros(H * W, E)
        grid[cells] = xi
        cw = sd['conv2d.weight']
        g = torch.nn.functional.conv2d(grid.t().reshape(1, E, H, W), cw, sd['conv2d.bias'],
                                       padding=cw.shape[-1] // 2, groups=E)
        xc = torch.nn.functional.silu(g.reshape(E, H * W)[:, cells])     # (E, L) storage
        proj = sd['x_proj.weight'] @ xc
        dt_low, Bm, Cm = proj[:R], proj[R:R + N], proj[R + N:]
        delta = sd['dt_proj.weight'] @ dt_low + sd['dt_proj.bias'][:, None]
        y = 0
        for k in range(4):
            perm = torch.argsort(rank[k][cells])                       # survivors in k's order
            code = codes[k][rank[k][cells[perm]]]                     # their full-grid codes
            Bk = Bm + sd['direction_Bs'][code].t()
            yk = ref.selective_scan_loop(xc[None][:, :, perm], delta[None], A, Bk[None],
                                         Cm[None], sd['D'], delta_bias=sd['dt_proj.bias'])
            y = y + yk[0][:, torch.argsort(perm)]
        y = y.t() * torch.nn.functional.silu(z)
        outs.append(torch.nn.functional.linear(y, sd['out_proj.weight'], sd['out_proj.bias']))
    return torch.stack(outs)


def test_unaligned_reduced_scan_pairs_steps_with_stored_survivors():
    """Without alignment (ToMe, random pruning, plain ToP) each direction's step j pairs the
    survivor it visits (u, its positional direction code) with delta, B, C of the j-th stored
    survivor, as the official code pairs a full sequence."""
    m = _mixer(torch.float64)
    H, W, B = 4, 5, 2
    _, kept, red = _pruned(B, H, W, 16, 7, torch.float64)
    with torch.no_grad():
        got = m(kept, red)
        want = _reduced_official(m.state_dict(), kept, red.pos, (H, W))
    assert _rel(got, want) <= 1e-10


def test_displacement_codes_by_hand():
    # a 4 x 5 grid: (0,0) (0,1) (0,3) (1,4) (1,2) (2,0) (0,0)->(2,0) ... as raster cells
    cells = torch.tensor([0, 1, 3, 9, 7, 10])
    # start, right, right (dj 2), tie di = dj = 1 -> the column move decides: right, left, left
    assert displacement_codes(cells, 5).tolist() == [0, 1, 1, 1, 2, 2]
    cells = torch.tensor([[0, 10, 6, 1, -2]])   # down (di 2), tie -> right, up, fused token: 0
    assert displacement_codes(cells, 5).tolist() == [[0, 4, 1, 3, 0]]


def test_direction_code_options():
    """'displacement' changes a reduced sequence's output, never the full grid's; an unknown
    option is named."""
    x = torch.randn(1, 3, 64, 80, generator=torch.Generator().manual_seed(0))
    red = dict(type='RandomPrune', ratio=0.3, seed=2)

    def run(codes, reduction):
        torch.manual_seed(0)
        m = MODELS.build(dict(type='PlainMamba', arch='test', out_indices=(3, ),
                              token_reduction=reduction, reduced_direction_codes=codes)).eval()
        with torch.no_grad():
            for layer in m.layers:
                layer.mamba.direction_Bs.normal_(0, 1)
            return m(x)[0]

    assert torch.equal(run('positional', None), run('displacement', None))
    assert not torch.allclose(run('positional', red), run('displacement', red), atol=1e-4)
    with pytest.raises(ConfigError, match='reduced_direction_codes'):
        MODELS.build(dict(type='PlainMamba', arch='test', reduced_direction_codes='nearest'))


def test_dense_restore_and_pooling():
    """ToP after layer 1: map 1 is untouched, map 3's pruned cells carry their last feature
    (layer 1's output, through the same default LayerNorm), survivors are new; the pooled
    vector is the mean over the survivors."""
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    red = dict(type='ToP', keep_rate=0.5, locations=(1, ))

    def build(reduction, **kw):
        torch.manual_seed(0)
        return MODELS.build(dict(type='PlainMamba', arch='test', token_reduction=reduction,
                                 **kw)).eval()

    with torch.no_grad():
        ref1, _ = build(None, out_indices=(1, 3))(x)
        m = build(red, out_indices=(1, 3))
        out1, out3 = m(x)
        tokens = m.layers[3].norm.normalized_shape[0]
        pooled = build(red, out_type='avg_featmap')(x)[0]
    assert m.token_counts == [24, 24, 12, 12] and tokens == 32
    assert torch.equal(out1, ref1)
    src = m.last_context.source                                          # (B, 24)
    flat1, flat3 = ref1.flatten(2), out3.flatten(2)
    pruned = src < 0
    assert int(pruned.sum()) == 24
    for b in range(2):
        torch.testing.assert_close(flat3[b][:, pruned[b]], flat1[b][:, pruned[b]])
        assert not torch.allclose(flat3[b][:, ~pruned[b]], flat1[b][:, ~pruned[b]])
        # pooled = ln1 of the survivors, averaged (ln1 is LayerNorm(eps 1e-6) at 1 / 0)
        surv = flat3[b][:, ~pruned[b]]
        torch.testing.assert_close(pooled[b], surv.mean(1), rtol=1e-5, atol=1e-6)


def test_merged_cells_share_their_token():
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    m = MODELS.build(dict(type='PlainMamba', arch='test', out_indices=(3, ),
                          token_reduction=dict(type='ToMe', ratio=0.4))).eval()
    with torch.no_grad():
        out = m(x)[0].flatten(2)[0]                                      # (C, 16)
    src = m.last_context.source[0]
    assert m.token_counts[-1] < 16 and int((src < 0).sum()) == 0
    for t in src.unique():
        cells = (src == t).nonzero().flatten()
        for c in cells[1:]:
            assert torch.equal(out[:, c], out[:, cells[0]])


def test_reduction_trains():
    torch.manual_seed(0)
    m = MODELS.build(dict(type='PlainMamba', arch='test', out_indices=(1, 3),
                          token_reduction=dict(type='ToP', keep_rate=0.6, locations=(1, )))
                     ).train()
    outs = m(torch.randn(2, 3, 64, 64))
    sum(o.square().mean() for o in outs).backward()
    grads = [m.layers[3].mamba.A_log.grad, m.layers[3].mamba.direction_Bs.grad,
             m.layers[0].dw[0].weight.grad]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_reduced_flops_and_the_l3_budget():
    """FLOPs follow the per-layer token counts; the L3 schedule that reproduces ToP-ViM's
    budget (keep 0.6 after layers 9, 18 and 27, counted from 1) gives about 8.44 G."""
    m = MODELS.build(dict(type='PlainMamba', arch='l3'))
    off = plainmamba_flops(m, 224, None, num_classes=1000)
    assert off['gflops'] == pytest.approx(14.454, abs=5e-4)
    red = plainmamba_flops(m, 224, dict(type='ToP', **L3_TOP_BUDGET), num_classes=1000)
    assert red['tokens'] == [196] * 9 + [117] * 9 + [69] * 9 + [41] * 9
    assert red['gflops'] == pytest.approx(8.44, abs=0.01)
    assert 1 - red['gflops'] / off['gflops'] == pytest.approx(0.416, abs=5e-4)
    # the spec's arithmetic: 1.403 G fixed + 0.3624 G per layer of 196 tokens
    approx = 1.403 + 0.3624 * sum(red['tokens']) / 196
    assert red['gflops'] == pytest.approx(approx, rel=5e-3)
    rho6 = plainmamba_flops(m, 224, dict(type='ToP', keep_rate=0.6, locations=(8, 17, 26)))
    assert rho6['gflops'] == pytest.approx(8.48 - 448 * 1000 / 1e9, abs=5e-3)
    per_token = (off['gflops'] - red['gflops']) / (36 * 196 - sum(red['tokens']))
    assert per_token == pytest.approx(0.3624 / 196, rel=0.02)
    # EViT's fused token counts as one more token after its first step
    evit = plainmamba_flops(m, 224, dict(type='EViT', keep_rate=0.6, locations=(8, 17, 26)))
    assert evit['tokens'][9] == 118 and evit['tokens'][8] == 196


def test_grid_conv_fills_merged_cells_and_zeroes_pruned_ones():
    """The depthwise conv of a reduced sequence sees the grid of the dense restore: a merged
    token at every cell it carries, zero at pruned cells; each token reads its own cell."""
    from amvim_mm.models.layout.grid_conv import grid_depthwise_conv
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 6, 3, padding=1, groups=6)
    H, W, B = 4, 5, 1
    x = torch.randn(B, H * W, 6)
    ctx = init_reduction_state(ScanContext((H, W), cls_index=NO_CLS), B, 'cpu')
    # merge cell 3 into 4 and 10 into 5; prune cell 12
    removed, dst = torch.tensor([[3, 10, 12]]), torch.tensor([[4, 5, -1]])
    xr, _, red = reduce_tokens(ctx, x, None, removed, dst, prunes=True)
    full = torch.gather(xr, 1, red.source.clamp(min=0).unsqueeze(-1).expand(-1, -1, 6))
    full[red.source < 0] = 0
    assert torch.equal(full[0, 3], xr[0, (red.pos[0] == 4).nonzero()[0, 0]])
    with torch.no_grad():
        got = grid_depthwise_conv(xr, red, conv)
        want = grid_depthwise_conv(full, ScanContext((H, W), cls_index=NO_CLS), conv)
    torch.testing.assert_close(got, want[:, red.pos[0]], rtol=0, atol=1e-6)
