"""VMamba: structure, loading of official files, FLOPs, and token reduction in stage 3."""

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.analysis.vmamba_flops import vmamba_flops
from amvim_mm.errors import AmvimError, CheckpointMismatchError, ConfigError
from amvim_mm.models.vmamba.ss2d import SS2D
from amvim_mm.models.vmamba.vmamba import VMAMBA_ARCHS
from amvim_mm.models.layout.scan_context import ScanContext
from amvim_mm.models.reduction.state import init_reduction_state, reduce_tokens
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS


def _build(**kw):
    torch.manual_seed(0)
    kw.setdefault('arch', 'test')
    return MODELS.build(dict(type='VMamba', **kw)).eval()


# ------------------------------------------------------------------------------ structure
# (arch, parameters with the 1000-class classifier in M, official GFLOPs at 224 or None)
PUBLISHED = [('tiny', 30.25, 4.906), ('small', 50.15, 8.716), ('base', 88.56, 15.359),
             ('tiny-s2l5', 30.71, 4.858), ('small-s1l20', 49.01, 8.612),
             ('base-s1l20', 86.61, 15.221), ('vanilla-tiny', 22.89, None)]


@pytest.mark.parametrize('arch,params,gflops', PUBLISHED)
def test_parameters_and_flops_of_the_released_models(arch, params, gflops):
    m = MODELS.build(dict(type='VMamba', arch=arch, out_type='avg_featmap', out_indices=(3, )))
    n = sum(p.numel() for p in m.parameters()) + m.dims[-1] * 1000 + 1000
    assert round(n / 1e6, 2) == params
    if gflops is not None:
        f = vmamba_flops(m, 224, None, num_classes=1000)
        assert round(f['gflops'], 3) == gflops
        assert f['stage_tokens'] == [3136, 784, 196, 49]


def test_dense_outputs_strides_and_channels():
    m = _build(arch='tiny')
    with torch.no_grad():
        outs = m(torch.randn(2, 3, 128, 96))
    assert [tuple(o.shape) for o in outs] == [(2, 96, 32, 24), (2, 192, 16, 12),
                                              (2, 384, 8, 6), (2, 768, 4, 3)]
    assert all(o.is_contiguous() for o in outs)


def test_odd_sizes_round_up_and_negative_out_indices():
    m = _build(out_indices=(-1, 1))
    assert m.out_indices == [1, 3]
    with torch.no_grad():
        outs = m(torch.randn(1, 3, 50, 38))
    # patch embed v2: 50 -> 25 -> 13; downsample v3: 13 -> 7 -> 4
    assert [tuple(o.shape[2:]) for o in outs] == [(7, 5), (2, 2)]
    assert hasattr(m, 'outnorm1') and hasattr(m, 'outnorm3') and not hasattr(m, 'outnorm0')


@pytest.mark.parametrize('bad,msg', [
    (dict(arch='huge'), 'unknown VMamba arch'),
    (dict(arch=dict(embed_dims=16)), 'missing keys'),
    (dict(arch=dict(embed_dims=16, depths=(1, 1, 1))), 'depths must be four'),
    (dict(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), forward_type='v9')), 'forward_type'),
    (dict(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), heads=4)), 'unknown keys'),
    (dict(out_indices=4), 'out of range'),
    (dict(out_indices='3'), 'out_indices must be'),
    (dict(out_type='avg_featmap'), 'needs out_indices=(3,)'),
    (dict(drop_path_rate=1.5), 'drop_path_rate'),
    (dict(reduction_stage=4), 'reduction_stage'),
    (dict(token_reduction=dict(type='ToMe', ratio=0.95)), 'ToMe'),
])
def test_bad_arguments_are_named(bad, msg):
    with pytest.raises(ConfigError, match=msg.replace('(', r'\(').replace(')', r'\)')):
        MODELS.build(dict(type='VMamba', **dict(dict(arch='test'), **bad)))


def test_bad_images_are_named():
    m = _build()
    for x in (torch.randn(2, 4, 32, 32), torch.randn(0, 3, 32, 32), torch.randn(1, 3, 2, 32)):
        with pytest.raises(ConfigError, match='VMamba'):
            m(x)


def test_frozen_stages_and_layer_depth():
    m = MODELS.build(dict(type='VMamba', arch='test', frozen_stages=2)).train()
    assert not any(p.requires_grad for p in m.patch_embed.parameters())
    assert not any(p.requires_grad for p in m.layers[1].parameters())
    assert not m.outnorm1.weight.requires_grad and m.outnorm2.weight.requires_grad
    assert all(p.requires_grad for p in m.layers[2].parameters())
    assert not m.layers[0].training and m.layers[2].training
    n = m.num_layers + 2          # depths (1, 1, 2, 1)
    assert m.get_layer_depth('backbone.patch_embed.0.weight', 'backbone.') == (0, n)
    assert m.get_layer_depth('backbone.layers.2.blocks.1.op.A_logs', 'backbone.') == (4, n)
    assert m.get_layer_depth('backbone.layers.1.downsample.1.weight', 'backbone.') == (2, n)
    assert m.get_layer_depth('backbone.outnorm3.weight', 'backbone.') == (n - 1, n)


def test_drop_path_schedule_over_all_blocks():
    m = MODELS.build(dict(type='VMamba', arch='test', drop_path_rate=0.4))
    rates = [b.drop_path.drop_prob for layer in m.layers for b in layer.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def test_training_step_gives_gradients_everywhere():
    m = MODELS.build(dict(type='VMamba', arch='test', drop_path_rate=0.1)).train()
    outs = m(torch.randn(2, 3, 32, 32))
    sum(o.square().mean() for o in outs).backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing


# ------------------------------------------------------------------------------ loading
def _official_file(path, model, extra=None):
    """An official-format file: {'model': classification VSSM keys} of plain tensors."""
    sd = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith('outnorm')}
    C = model.dims[-1]
    sd['classifier.norm.weight'] = torch.rand(C) + 0.5
    sd['classifier.norm.bias'] = torch.randn(C)
    sd['classifier.head.weight'] = torch.randn(1000, C)
    sd['classifier.head.bias'] = torch.zeros(1000)
    sd.update(extra or {})
    torch.save(dict(model=sd), path)
    return sd


def test_official_file_loads_strictly_through_init_cfg(tmp_path):
    src = MODELS.build(dict(type='VMamba', arch='test'))
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = str(tmp_path / 'vssm.pth')
    sd = _official_file(path, src)
    m = MODELS.build(dict(type='VMamba', arch='test', out_indices=(0, 1, 2, 3),
                          init_cfg=dict(type='Pretrained', checkpoint=path)))
    m.init_weights()
    own = m.state_dict()
    for k, v in sd.items():
        if not k.startswith('classifier.'):
            assert torch.equal(own[k], v), k
    for i in range(4):   # no output norms in the file: weight 1, bias 0 (Backbone_VSSM)
        assert torch.equal(own[f'outnorm{i}.weight'], torch.ones_like(own[f'outnorm{i}.weight']))
        assert torch.equal(own[f'outnorm{i}.bias'], torch.zeros_like(own[f'outnorm{i}.bias']))
    # the classifier input loads classifier.norm
    c = MODELS.build(dict(type='VMamba', arch='test', out_type='avg_featmap', out_indices=(3, ),
                          init_cfg=dict(type='Pretrained', checkpoint=path)))
    c.init_weights()
    assert torch.equal(c.classifier.norm.weight, sd['classifier.norm.weight'])


def test_old_names_and_single_file_layout_load(tmp_path):
    src = _build()
    sd = {k: v for k, v in src.state_dict().items() if not k.startswith('outnorm')}
    old = {}
    for k, v in sd.items():
        k = k.replace('patch_embed.0.', 'patch_embed.proj.').replace('.op.', '.self_attention.')
        k = k.replace('.norm.', '.ln_1.') if '.blocks.' in k else k
        if k.endswith('x_proj_weight'):
            k, v = k[:-len('x_proj_weight')] + 'x_proj.weight', v.reshape(-1, v.shape[-1], 1)
        if k.endswith('dt_projs_weight'):
            k, v = k[:-len('dt_projs_weight')] + 'dt_projs.weight', v.reshape(-1, v.shape[-1], 1)
        old[k] = v
    m = MODELS.build(dict(type='VMamba', arch='test'))
    m.load_state_dict(old, strict=True)
    assert torch.equal(m.layers[2].blocks[1].op.x_proj_weight,
                       src.layers[2].blocks[1].op.x_proj_weight)


@pytest.mark.parametrize('ckpt,msg', [('', 'needs "checkpoint"'), ('   ', 'needs "checkpoint"'),
                                      (None, 'needs "checkpoint"'),
                                      ('missing/vssm.pth', 'missing/vssm.pth')])
def test_missing_or_empty_pretrained_is_an_error(ckpt, msg):
    m = MODELS.build(dict(type='VMamba', arch='test',
                          init_cfg=dict(type='Pretrained', checkpoint=ckpt)))
    with pytest.raises((AmvimError, FileNotFoundError), match=msg):
        m.init_weights()


def test_wrong_arch_file_names_the_mismatch(tmp_path):
    path = str(tmp_path / 'vssm.pth')
    _official_file(path, _build())
    m = MODELS.build(dict(type='VMamba', arch=dict(embed_dims=16, depths=(1, 1, 3, 1)),
                          init_cfg=dict(type='Pretrained', checkpoint=path)))
    with pytest.raises(CheckpointMismatchError, match=r'layers\.2\.blocks\.2'):
        m.init_weights()


# ------------------------------------------------------------------------------ reduction
def test_aligned_scan_equals_full_length_zero_input_scan_per_direction():
    """Stage-3 ToP alignment: the kept tokens' scan of every direction equals the full-grid
    scan with zero input at the pruned cells (their step softplus(dt_bias)), read at the kept
    cells."""
    torch.manual_seed(0)
    op = SS2D(24, d_state=2, ssm_ratio=1.0).eval()
    with torch.no_grad():
        op.dt_projs_bias.uniform_(-3, 0)
    H, W, B, E = 6, 5, 2, op.d_inner
    full = ScanContext((H, W), cls_index=NO_CLS)
    x = torch.randn(B, H * W, E)
    ctx = init_reduction_state(full, B, 'cpu')
    removed = torch.stack([torch.randperm(H * W)[:12] for _ in range(B)])
    _, _, red = reduce_tokens(ctx, x, None, removed, torch.full_like(removed, -1),
                              merges=False)
    red.align = 'bias'
    kept = red.pos                                                  # (B, L) raster cells
    xk = torch.gather(x, 1, kept.unsqueeze(-1).expand(-1, -1, E))
    zero = x.clone()
    zero.scatter_(1, removed.unsqueeze(-1).expand(-1, -1, E), 0.0)
    with torch.no_grad():
        ys = _token_order(*op.directions(xk, red), (H, W))
        ref = _token_order(*op.directions(zero, full), (H, W))
    for y, r in zip(ys, ref, strict=True):
        r = torch.gather(r, 2, kept.unsqueeze(1).expand(-1, E, -1))
        assert (y - r).abs().max() <= 1e-5 * r.abs().max()
    # without alignment the result differs: the test can fail
    red.align = None
    with torch.no_grad():
        plain = _token_order(*op.directions(xk, red), (H, W))
    assert (plain[1] - ys[1]).abs().max() > 1e-3


def _token_order(ys, index, grid):
    """(B, K, E, L) path-order outputs -> K tensors (B, E, L) in token order."""
    from amvim_mm.ops.cross_scan import direction_indices
    B, K, E, L = ys.shape
    inv = (torch.argsort(direction_indices(*grid, ys.device), 1)[:, None] if index is None
           else index.inv.long())                                         # (K, B|1, L)
    return [ys[:, k].gather(2, inv[k][:, None].expand(B, E, L)) for k in range(K)]


def test_scattered_conv_holds_zero_at_pruned_cells():
    torch.manual_seed(0)
    op = SS2D(8, d_state=1).eval()
    H, W, B = 4, 4, 1
    x = torch.randn(B, H * W, op.d_inner)
    full = ScanContext((H, W), cls_index=NO_CLS)
    ctx = init_reduction_state(full, B, 'cpu')
    removed = torch.tensor([[1, 6, 11]])
    _, _, red = reduce_tokens(ctx, x, None, removed, torch.full_like(removed, -1), merges=False)
    zero = x.clone()
    zero[:, removed[0]] = 0
    with torch.no_grad():
        got = op.grid_conv(torch.gather(x, 1, red.pos.unsqueeze(-1).expand(-1, -1, x.shape[-1])),
                           red)
        ref = op.grid_conv(zero, full)[:, red.pos[0]]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


REDUCTIONS = [dict(type='ToMe', ratio=0.4), dict(type='RandomPrune', ratio=0.4, seed=1),
              dict(type='EViT', keep_rate=0.6, locations=(0, )),
              dict(type='ToP', keep_rate=0.6, locations=(0, ))]


@pytest.mark.parametrize('cfg', REDUCTIONS, ids=lambda c: c['type'])
def test_stage3_reduction_dense_maps(cfg):
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    plain = _build()
    with torch.no_grad():
        ref = plain(x)
        zero = {k: (0.0 if k == 'ratio' else 1.0 if k == 'keep_rate' else v)
                for k, v in cfg.items()}
        plain.set_token_reduction(zero)
        same = plain(x)
        m = _build(token_reduction=cfg)
        out = m(x)
    # a schedule that removes nothing is exactly no reduction
    for a, b in zip(same, ref, strict=True):
        assert torch.equal(a, b)
    assert [o.shape for o in out] == [o.shape for o in ref]
    assert all(torch.isfinite(o).all() for o in out)
    # stages 0-1 untouched, stage 2 reduced to about 60 % of its 196 tokens, stage 3 full
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert m.token_counts[:2] == [3136, 784] and m.token_counts[-1] == 49
    stage3 = m.token_counts[2:4]
    assert stage3[0] >= stage3[1] and min(stage3) <= 0.65 * 196
    assert not torch.equal(out[2], ref[2])
    f = vmamba_flops(m, 224, 'model')
    assert f['tokens'] == m.token_counts and f['gflops'] < vmamba_flops(plain, 224, None)['gflops']


def test_reduction_trains_and_restores_gradients():
    m = MODELS.build(dict(type='VMamba', arch='test',
                          token_reduction=dict(type='ToMe', ratio=0.3))).train()
    outs = m(torch.randn(2, 3, 64, 64))
    assert m.token_counts[2] < 16
    sum(o.mean() for o in outs).backward()
    assert m.layers[2].blocks[1].op.A_logs.grad is not None


def test_flops_conventions_and_reduction_counts():
    m = MODELS.build(dict(type='VMamba', arch='tiny'))
    off = vmamba_flops(m, 224, None)
    red = vmamba_flops(m, 224, dict(type='ToMe', ratio=0.4))
    assert red['removals'][0] > 0 and abs(red['realised_ratio'] - 0.4) < 0.01
    saved = off['stage_gflops'][2] - red['stage_gflops'][2]
    assert red['stage_gflops'][:2] == off['stage_gflops'][:2]
    assert saved == pytest.approx(off['gflops'] - red['gflops'])
    # the stage-3 blocks scale linearly with their tokens (no attention): the saving is the
    # realised ratio of the stage's block FLOPs (its downsample conv excepted)
    down = (768 * 384 * 9 * 49 + 5 * 768 * 49) / 1e9
    assert saved == pytest.approx(red['realised_ratio'] * (off['stage_gflops'][2] - down),
                                  rel=1e-9)
    mam = vmamba_flops(m, 224, None, convention='mamba')
    assert 4.8 < mam['gflops'] < off['gflops']


def test_arch_zoo_names():
    assert {'tiny', 'small', 'base', 'vanilla-tiny', 'test'} <= set(VMAMBA_ARCHS)
    assert _build(arch='t').arch_settings == _build(arch='tiny-s1l8').arch_settings
