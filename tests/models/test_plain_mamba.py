"""PlainMamba: structure, the snake directions, loading of released files."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.errors import AmvimError, CheckpointMismatchError, ConfigError
from amvim_mm.models.plain_mamba.scan import SNAKE_DIRECTIONS, snake_directions
from amvim_mm.models.layout.scan_orders import scan_rank
from amvim_mm.registry import MODELS


def _build(**kw):
    torch.manual_seed(0)
    kw.setdefault('arch', 'test')
    return MODELS.build(dict(type='PlainMamba', **kw)).eval()


def test_snake_orders_and_codes_of_a_4x5_grid():
    """The official example (orders and the direction codes of the moves)."""
    index, codes = snake_directions(4, 5, torch.device('cpu'))
    o = index.perm[:, 0]
    assert o[0].tolist() == [0, 1, 2, 3, 4, 9, 8, 7, 6, 5, 10, 11, 12, 13, 14, 19, 18, 17, 16, 15]
    assert o[2].tolist() == [0, 5, 10, 15, 16, 11, 6, 1, 2, 7, 12, 17, 18, 13, 8, 3, 4, 9, 14, 19]
    assert torch.equal(o[1], o[0].flip(0)) and torch.equal(o[3], o[2].flip(0))
    assert codes[0].tolist() == [0, 1, 1, 1, 1, 4, 2, 2, 2, 2, 4, 1, 1, 1, 1, 4, 2, 2, 2, 2]
    assert codes[2].tolist() == [0, 4, 4, 4, 1, 3, 3, 3, 1, 4, 4, 4, 1, 3, 3, 3, 1, 4, 4, 4]
    # the reversed walks move the other way: right <-> left, down -> up
    assert codes[1].tolist() == [0, 1, 1, 1, 1, 3, 2, 2, 2, 2, 3, 1, 1, 1, 1, 3, 2, 2, 2, 2]
    for k, spec in enumerate(SNAKE_DIRECTIONS):   # the orders are the registered scan orders
        rank = scan_rank(4, 5, {a: b for a, b in spec.items() if a != 'reverse'})
        want = torch.argsort(rank)
        assert torch.equal(o[k], want.flip(0) if spec.get('reverse') else want)


@pytest.mark.parametrize('H,W', [(3, 3), (5, 2), (1, 7)])
def test_every_step_of_a_snake_is_a_neighbour(H, W):
    index, codes = snake_directions(H, W, torch.device('cpu'))
    for o in index.perm[:, 0]:
        assert sorted(o.tolist()) == list(range(H * W))
        steps = torch.stack([o // W, o % W], 1).diff(dim=0).abs().sum(1)
        assert bool((steps == 1).all())
    assert bool((codes[:, 0] == 0).all()) and bool((codes[:, 1:] > 0).all())


@pytest.mark.parametrize('arch,params,gflops', [('l1', 7.359, 3.021), ('l2', 25.761, 8.089),
                                                ('l3', 50.507, 14.454)])
def test_parameter_counts_and_official_flops(arch, params, gflops):
    """Backbone parameters as published; FLOPs as fvcore counts the official model with a
    1000-class head and the papers' scan handle (224)."""
    from amvim_mm.analysis.flops import backbone_flops
    m = MODELS.build(dict(type='PlainMamba', arch=arch))
    assert round(sum(p.numel() for p in m.parameters()) / 1e6, 3) == params
    f = backbone_flops(m, 224, None, num_classes=1000, convention='official')
    assert round(f['gflops'], 3) == gflops and f['tokens'] == [196] * m.num_layers
    assert backbone_flops(m, 224, None, 1000, convention='mamba')['gflops'] < f['gflops']


def test_contract_shapes_at_a_non_square_input():
    m = _build(arch='l1', out_indices=(5, 11, 17, 23))
    assert [f'norm_layer{i}' in dict(m.named_modules()) for i in (5, 11, 17, 23)] == \
        [True, True, True, False]
    with torch.no_grad():
        out = m(torch.randn(2, 3, 64, 96))
    assert [tuple(o.shape) for o in out] == [(2, 192, 4, 6)] * 4


def test_classifier_input_and_odd_sizes():
    m = _build(out_type='avg_featmap')
    with torch.no_grad():
        out = m(torch.randn(2, 3, 70, 50))     # stem 35 x 25, padded to 40 x 32: 5 x 4 grid
    assert [tuple(o.shape) for o in out] == [(2, 32)]
    d = _build(out_indices=(0, -1))
    with torch.no_grad():
        assert [tuple(o.shape) for o in d(torch.randn(1, 3, 70, 50))] == [(1, 32, 5, 4)] * 2


@pytest.mark.parametrize('bad,msg', [
    (dict(arch='l4'), 'unknown PlainMamba arch'),
    (dict(arch=dict(embed_dims=32)), 'missing keys'),
    (dict(arch=dict(embed_dims=32, num_layers=2, layers_with_dwconv=(5, ))), 'layers_with_dw'),
    (dict(out_indices=4), 'out of range'),
    (dict(out_type='avg_featmap', out_indices=(1, 3)), 'needs out_indices=-1'),
    (dict(drop_path_rate=1.0), 'drop_path_rate'),
    (dict(img_size=8), 'img_size'),
])
def test_bad_arguments_are_named(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        MODELS.build(dict(type='PlainMamba', **dict(dict(arch='test'), **bad)))


def test_bad_images_are_named():
    m = _build()
    for x in (torch.randn(1, 1, 32, 32), torch.randn(0, 3, 32, 32), torch.randn(1, 3, 8, 32)):
        with pytest.raises(ConfigError, match='PlainMamba'):
            m(x)


def test_frozen_stages_layer_depth_and_gradients():
    m = MODELS.build(dict(type='PlainMamba', arch='test', frozen_stages=2,
                          drop_path_rate=0.1)).train()
    assert not m.pos_embed.requires_grad
    assert not any(p.requires_grad for p in m.layers[1].parameters())
    assert all(p.requires_grad for p in m.layers[2].parameters())
    assert not m.patch_embed.stem[1].training
    n = m.num_layers + 2
    assert m.get_layer_depth('backbone.pos_embed', 'backbone.') == (0, n)
    assert m.get_layer_depth('backbone.layers.3.mamba.A_log', 'backbone.') == (4, n)
    assert m.get_layer_depth('backbone.ln1.weight', 'backbone.') == (n - 1, n)
    out = m(torch.randn(2, 3, 48, 48))
    out[0].square().mean().backward()
    assert m.layers[3].mamba.direction_Bs.grad is not None
    assert m.layers[0].mamba.A_log.grad is None


def _released_file(path, model, extra=None):
    """A released-style file: mmcls ``state_dict`` with ``backbone.*`` (BN buffers included)
    and ``head.*``, plus EMA buffers."""
    sd = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith('norm_layer')}
    full = {'backbone.' + k: v for k, v in sd.items()}
    full['head.fc.weight'] = torch.randn(1000, model.embed_dims)
    full['head.fc.bias'] = torch.zeros(1000)
    full['ema_backbone_ln1_weight'] = torch.ones(model.embed_dims)
    full.update(extra or {})
    torch.save(dict(state_dict=full, meta=dict(epoch=300)), path)
    return sd


def test_released_file_loads_strictly(tmp_path):
    src = _build()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        src.patch_embed.stem[1].running_var.uniform_(0.5, 2)
    path = str(tmp_path / 'l1.pth')
    sd = _released_file(path, src)
    m = MODELS.build(dict(type='PlainMamba', arch='test', out_indices=(1, 3),
                          init_cfg=dict(type='Pretrained', checkpoint=path)))
    m.init_weights()
    own = m.state_dict()
    assert all(torch.equal(own[k], v) for k, v in sd.items())
    assert torch.equal(own['norm_layer1.weight'], torch.ones(32))
    # a position embedding of another grid is resized (bicubic), as the official code does
    big = MODELS.build(dict(type='PlainMamba', arch='test', img_size=96,
                            init_cfg=dict(type='Pretrained', checkpoint=path)))
    big.init_weights()
    assert big.pos_embed.shape == (1, 36, 32)


@pytest.mark.parametrize('ckpt,msg', [('', 'needs "checkpoint"'), ('nope/l1.pth', 'nope/l1.pth')])
def test_missing_or_empty_pretrained_is_an_error(ckpt, msg):
    m = MODELS.build(dict(type='PlainMamba', arch='test',
                          init_cfg=dict(type='Pretrained', checkpoint=ckpt)))
    with pytest.raises((AmvimError, FileNotFoundError), match=msg):
        m.init_weights()


def test_wrong_arch_file_names_the_mismatch(tmp_path):
    path = str(tmp_path / 'l1.pth')
    _released_file(path, _build())
    m = MODELS.build(dict(type='PlainMamba', arch=dict(embed_dims=32, num_layers=5, d_state=8,
                                                        num_convs_patch_embed=1,
                                                        layers_with_dwconv=(0, )),
                          init_cfg=dict(type='Pretrained', checkpoint=path)))
    with pytest.raises(CheckpointMismatchError, match=r'layers\.4\.'):
        m.init_weights()


def test_whole_model_load_skips_ema_buffers(tmp_path):
    """Released training files may carry mmcls's EMA buffers (``ema_*``) next to the weights:
    our tools' strict whole-model load skips them, and loads every weight."""
    from amvim_mm.bench.measure import Classifier
    from amvim_mm.apis.runner import load_model_weights
    src = Classifier(_build(out_type='avg_featmap'), num_classes=5)
    sd = {k: v.clone() for k, v in src.state_dict().items()}
    path = tmp_path / 'l1.pth'
    torch.save(dict(state_dict=dict(sd, ema_backbone_ln1_weight=torch.ones(32))), path)
    dst = Classifier(MODELS.build(dict(type='PlainMamba', arch='test', out_type='avg_featmap')),
                     num_classes=5)
    load_model_weights(dst, str(path), strict=True)
    assert all(torch.equal(dst.state_dict()[k], v) for k, v in sd.items())
