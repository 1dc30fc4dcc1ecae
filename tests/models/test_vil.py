"""ViL / AMViL against the independent restatement of the official Vision-LSTM
(tests/reference/official_vil.py), and their traversals, reduction and training helpers."""
import pytest
import torch
import torch.nn.functional as F

import amvim_mm  # noqa: F401
from amvim_mm.analysis.flops import backbone_flops
from amvim_mm.errors import CheckpointMismatchError, ConfigError
from amvim_mm.models.vim.vim import AMVim
from amvim_mm.models.layout import ScanContext
from amvim_mm.models.layout.scan_orders import normalize_order
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS
from tests.reference.official_vil import official_forward, official_state_dict

V1_SHORT = dict(version=1, embed_dims=192, num_layers=4)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _maps(ref_blocks, idx, grid):
    return [ref_blocks[i].transpose(1, 2).reshape(ref_blocks[i].shape[0], -1, *grid)
            for i in idx]


@pytest.fixture(scope='module')
def v2_sd():
    return official_state_dict('v2', 192, 12, (3, 64, 96))


@pytest.fixture(scope='module')
def images():
    return torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))


def test_contract_v2_featmaps_from_a_released_layout_file(tmp_path, v2_sd, images):
    """THE CONTRACT: ViL-T built from an official file ({'state_dict': sd} and the raw sd)
    gives the official blocks[i] outputs as maps."""
    ref = official_forward(v2_sd, images, 'v2', 192, 12)
    want = _maps(ref['blocks'], (2, 5, 8, 11), (4, 6))
    for i, payload in enumerate(({'state_dict': v2_sd}, dict(v2_sd))):
        f = tmp_path / f'vil{i}.pth'
        torch.save(payload, f)
        m = MODELS.build(dict(type='ViL', arch='tiny', img_size=(64, 96), out_type='featmap',
                              out_indices=(2, 5, 8, 11),
                              init_cfg=dict(type='Pretrained', checkpoint=str(f))))
        m.init_weights()
        with torch.no_grad():
            outs = m.eval()(images)
        assert [tuple(o.shape) for o in outs] == [(2, 192, 4, 6)] * 4
        for o, r in zip(outs, want, strict=True):
            assert _rel(o, r) <= 1e-4
    # 'pooled' is the official classifier input (norm, bilateral concat, legacy_norm)
    p = MODELS.build(dict(type='ViL', arch='tiny', img_size=(64, 96), out_type='pooled'))
    p.load_state_dict(v2_sd)
    with torch.no_grad():
        feats = p.eval()(images)[0]
    assert feats.shape == (2, 384) and _rel(feats, ref['features']) <= 1e-4


def test_v1_equals_official(images):
    sd = official_state_dict('v1', 192, 4, (3, 64, 96))
    ref = official_forward(sd, images, 'v1', 192, 4)
    m = MODELS.build(dict(type='ViL', arch=V1_SHORT, img_size=(64, 96), out_indices=(0, -1)))
    m.load_state_dict(sd)
    p = MODELS.build(dict(type='ViL', arch=V1_SHORT, img_size=(64, 96), out_type='pooled'))
    p.load_state_dict(sd)
    with torch.no_grad():
        outs, feats = m.eval()(images), p.eval()(images)[0]
    for o, r in zip(outs, _maps(ref['blocks'], (0, 3), (4, 6)), strict=True):
        assert _rel(o, r) <= 1e-4
    assert feats.shape == (2, 192) and _rel(feats, ref['features']) <= 1e-4
    # v1: blocks of alternating direction, official names
    assert [b.path.get('reverse', False) for b in m.blocks] == [False, True, False, True]
    assert 'blocks.1.layer.conv1d.conv.weight' in sd and 'norm.bias' in sd


def test_position_embedding_resized_on_load_and_exact_in_fp64():
    """A 4 x 6 embedding loaded into a model of another grid is resized as the official
    load_state_dict does; in float64 the model equals the reference to the rounding of the
    float32 resize at load (the reference resizes in float64)."""
    sd = official_state_dict('v2', 32, 2, (3, 64, 96))
    x = torch.randn(1, 3, 96, 64, dtype=torch.float64)
    m = MODELS.build(dict(type='ViL', arch=dict(embed_dims=32, num_layers=2), img_size=(96, 64),
                          out_indices=(0, 1)))
    m.load_state_dict(sd)
    assert m.pos_embed.embed.shape == (1, 6, 4, 32)
    ref = official_forward(sd, x, 'v2', 32, 2)
    with torch.no_grad():
        outs = m.eval().double()(x)
    for o, r in zip(outs, _maps(ref['blocks'], (0, 1), (6, 4)), strict=True):
        assert _rel(o, r) < 1e-6


def test_checkpoint_key_errors_name_the_keys(tmp_path):
    sd = official_state_dict('v2', 32, 2, (3, 64, 64))
    bad = dict(sd)
    del bad['blocks.1.rowwise_from_bot_right.layer.learnable_skip']
    bad['blocks.2.rowwise_from_top_left.norm.weight'] = torch.zeros(32)
    f = tmp_path / 'bad.pth'
    torch.save(bad, f)
    m = MODELS.build(dict(type='ViL', arch=dict(embed_dims=32, num_layers=2), img_size=64,
                          init_cfg=dict(type='Pretrained', checkpoint=str(f))))
    with pytest.raises(CheckpointMismatchError) as e:
        m.init_weights()
    msg = str(e.value)
    assert 'blocks.1.rowwise_from_bot_right.layer.learnable_skip' in msg
    assert 'blocks.2.rowwise_from_top_left.norm.weight' in msg and '\n' not in msg


def test_flipped_grid_conv_is_the_rotated_kernel():
    """The official flipped sub-block convolves its flipped sequence reshaped to the grid:
    that is the conv of the true grid with the kernel rotated by 180 degrees."""
    g = torch.randn(2, 5, 4, 6)
    w = torch.randn(5, 1, 3, 3)
    flipped = g.flatten(2).flip(-1).reshape(2, 5, 4, 6)            # the official reshape
    official = F.conv2d(flipped, w, padding=1, groups=5).flatten(2).flip(-1).reshape(g.shape)
    ours = F.conv2d(g, w.flip(-1, -2), padding=1, groups=5)
    torch.testing.assert_close(ours, official)


def _test_model(typ, **kw):
    torch.manual_seed(0)
    m = MODELS.build(dict(type=typ, arch='test', img_size=64, out_indices=(1, 3), **kw))
    for p in m.parameters():      # non-trivial values everywhere (norm offsets, biases)
        p.data.add_(0.05 * torch.randn_like(p))
    return m.eval()


def test_amvil_window_1_is_vil_and_loads_vil_keys():
    vil = _test_model('ViL')
    amvil = MODELS.build(dict(type='AMViL', arch='test', img_size=64, out_indices=(1, 3),
                              window_size=1)).eval()
    amvil.load_state_dict(vil.state_dict())
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        for a, b in zip(amvil(x), vil(x), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    default = MODELS.build(dict(type='AMViL', arch='test', img_size=64)).eval()
    default.load_state_dict(vil.state_dict())        # 1:1, strict
    with torch.no_grad():
        assert not torch.allclose(default(x)[0], vil(x)[-1])


def test_amvil_traversal_is_the_amvim_windowed_order():
    """The windowed sub-block's mLSTM sees [q, k, v] in AMVim's windowed order (the rank
    order of AMVim's second path), the top-left one in raster order; v1 windows the blocks
    that traverse from the bottom right."""
    m = _test_model('AMViL', shift_odd_blocks=True)
    amvim = MODELS.build(dict(type='AMVim', arch='test', shift_odd_blocks=True))
    seen = {}
    for i, pair in enumerate(m.blocks):
        for name in ('rowwise_from_top_left', 'rowwise_from_bot_right'):
            layer = getattr(pair, name).layer
            for proj in ('q_proj', 'k_proj', 'v_proj'):
                getattr(layer, proj).register_forward_hook(
                    lambda mod, a, out, key=(i, name, proj): seen.__setitem__(key, out))
            layer.mlstm_cell.register_forward_pre_hook(
                lambda mod, a, key=(i, name): seen.__setitem__(key, a[0]))
    with torch.no_grad():
        m(torch.randn(1, 3, 64, 48))
    ctx = ScanContext((4, 3), NO_CLS)
    for i in range(m.num_layers):
        assert normalize_order(m.blocks[i].rowwise_from_bot_right.path) == \
            normalize_order(AMVim.layer_paths(amvim, i)[1])
        for name, spec in (('rowwise_from_top_left', dict(order='raster')),
                           ('rowwise_from_bot_right', AMVim.layer_paths(amvim, i)[1])):
            tokens = torch.cat([seen[(i, name, p)] for p in ('q_proj', 'k_proj', 'v_proj')], -1)
            perm = ctx.path_index(spec).indices(ctx.pos.unsqueeze(0))[0]
            assert torch.equal(seen[(i, name)], tokens[:, perm])
    v1 = MODELS.build(dict(type='AMViL', arch=dict(version=1, embed_dims=16, num_layers=4)))
    assert [b.path['order'] for b in v1.blocks] == ['raster', 'window', 'raster', 'window']


def _reduced_ctx(grid, keep):
    """The context of the sequence of the kept cells (B, M) bool, as a pruning step leaves it."""
    B, M = keep.shape
    K = int(keep[0].sum())
    pos = torch.stack([torch.nonzero(k).squeeze(1) for k in keep])
    source = torch.full((B, M), -1, dtype=torch.long)
    source.scatter_(1, pos, torch.arange(K).expand(B, -1))
    return ScanContext(grid, NO_CLS).successor(NO_CLS, pos, K, size=torch.ones(B, K),
                                               source=source, frozen=None, step='reduce')


V1_K1 = dict(version=1, embed_dims=32, num_layers=2, conv_kernel_size=1)


@pytest.mark.parametrize('typ,arch', [('ViL', 'test'), ('AMViL', 'test'), ('ViL', V1_K1),
                                      ('AMViL', dict(V1_K1, num_layers=4)),
                                      ('ViL', dict(version=1, embed_dims=32, num_layers=2))])
@pytest.mark.parametrize('at', [0, 1])
def test_masked_forward_equals_the_reduced_sequence(typ, arch, at):
    """A block's masked forward (a learned reducer's training) gives the kept tokens what the
    reduced sequence gives them (v2: the conv sees dropped cells as zero, the mLSTM skips
    them; v1's causal conv k4 reads the zeros in its window, so v1 is exact with k1 only)
    and leaves the dropped tokens' streams alone; importance = the clipped cell output
    summed over the block's traversals."""
    torch.manual_seed(0)
    m = MODELS.build(dict(type=typ, arch=arch, img_size=64)).eval()
    for p in m.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    grid, B = (4, 4), 2
    keep = torch.rand(B, 16, generator=torch.Generator().manual_seed(3)).argsort(1) < 11
    x = torch.randn(B, 16, m.embed_dims)
    block = m.blocks[at]
    with torch.no_grad():
        full = block(x, ScanContext(grid, NO_CLS), keep=keep)
        rctx = _reduced_ctx(grid, keep)
        rctx.want_importance = True
        red = block(x[keep].view(B, 11, -1), rctx)
    assert torch.equal(full[~keep], x[~keep])
    if m.version == 2 or m.arch_settings['conv_kernel_size'] == 1:
        torch.testing.assert_close(full[keep].view(B, 11, -1), red, rtol=1e-5, atol=1e-5)
    cells = []
    subs = m.traversals()[2 * at:2 * at + 2] if m.version == 2 else [m.blocks[at]]
    for sub in subs:
        sub.layer.mlstm_cell.register_forward_hook(lambda mod, a, out: cells.append((mod, out)))
    with torch.no_grad():
        block(x[keep].view(B, 11, -1), rctx)
    want = 0
    for sub, (_, out) in zip(subs, cells, strict=True):
        out = rctx.path_index(sub.path).to_tokens(out)
        want = want + out.clamp_min(0).sum(-1)
    torch.testing.assert_close(rctx.importance, want)


def test_arguments_and_training_helpers():
    m = MODELS.build(dict(type='ViL', arch='test', out_indices=(-1, 0), frozen_stages=2,
                          drop_path_rate=0.2))
    assert m.out_indices == [0, 3]
    assert [b.rowwise_from_top_left.drop_path.drop_prob for b in m.blocks] == [0.2] * 4
    decay = MODELS.build(dict(type='ViL', arch='test', drop_path_rate=0.3, drop_path_decay=True))
    assert [round(b.rowwise_from_bot_right.drop_path.drop_prob, 6) for b in decay.blocks] == \
        [0.0, 0.1, 0.2, 0.3]
    m.train()
    assert not m.pos_embed.embed.requires_grad and not m.blocks[1].training
    assert all(p.requires_grad for p in m.blocks[2].parameters()) and m.blocks[2].training
    assert m.get_layer_depth('backbone.pos_embed.embed', 'backbone.') == (0, 6)
    assert m.get_layer_depth('backbone.blocks.3.rowwise_from_top_left.norm.weight',
                             'backbone.') == (4, 6)
    assert m.get_layer_depth('backbone.legacy_norm.weight', 'backbone.') == (5, 6)
    for bad, what in ((dict(arch='huge'), 'unknown ViL arch'),
                      (dict(arch=dict(embed_dims=30, num_layers=2, expansion=1)), 'multiple'),
                      (dict(arch=dict(embed_dims=32)), 'missing keys'),
                      (dict(arch='test', out_type='pooled', out_indices=0), 'out_indices=-1'),
                      (dict(arch='test', out_type='cls'), 'out_type'),
                      (dict(arch='test', window_size=0, type='AMViL'), 'size')):
        with pytest.raises(ConfigError, match=what):
            MODELS.build(dict(dict(type='ViL'), **bad))


def test_flops_count_the_mlstm_parallel_form():
    """ViL-T at 224: 6.39 M parameters with a 1000-class head (the official count); the
    count of one sub-block written out; a reducer lowers it."""
    m = MODELS.build(dict(type='ViL', arch='tiny'))
    n = sum(p.numel() for p in m.parameters())
    assert round((n + 384 * 1000 + 1000) / 1e6, 2) == 6.39
    D, E, L = 192, 384, 196
    sub = L * D * 2 * E + L * E * 9 + 3 * L * E * 4 + 2 * L * 3 * E * 4 + 2 * L * L * E \
        + L * E * D
    want = L * 3 * 256 * D + 24 * sub + 2 * D * 1000
    res = backbone_flops(m, 224, num_classes=1000)
    assert res['gflops'] == pytest.approx(want / 1e9) and res['tokens'] == [196] * 12
    tome = backbone_flops(m, 224, dict(type='ToMe', ratio=0.1), num_classes=1000)
    assert tome['gflops'] < res['gflops']
