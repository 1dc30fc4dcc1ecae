"""mmseg's and mmdet's own layer-decay constructors with our backbones: per-parameter learning
rates by ``get_layer_depth`` (was: a bare ``NotImplementedError``), one-line errors for what
they cannot do, and no change for the libraries' own backbones."""
import pytest
import torch.nn as nn
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

import amvim_mm  # noqa: F401
from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS

BASE_LR, WD, RATE = 1.0, 0.05, 0.5


def _segmentor(backbone):
    from mmseg.registry import MODELS as SEG
    init_default_scope('mmseg')
    return SEG.build(dict(
        type='EncoderDecoder', backbone=backbone,
        decode_head=dict(type='FCNHead', in_channels=32, channels=8, num_convs=1,
                         num_classes=2)))


def _optimizer(model, constructor, paramwise_cfg):
    return build_optim_wrapper(model, dict(
        type='OptimWrapper', optimizer=dict(type='AdamW', lr=BASE_LR, weight_decay=WD),
        constructor=constructor, paramwise_cfg=paramwise_cfg)).optimizer


def _lr_of(optimizer):
    return {id(p): g['lr'] for g in optimizer.param_groups for p in g['params']}


@pytest.mark.parametrize('constructor,paramwise_cfg', [
    ('LayerDecayOptimizerConstructor', dict(num_layers=4, layer_decay_rate=RATE)),
    ('LearningRateDecayOptimizerConstructor',
     dict(num_layers=4, decay_rate=RATE, decay_type='layer_wise')),
])
@pytest.mark.parametrize('backbone', [
    dict(type='Vim', arch='test', img_size=32, out_type='featmap'),
    dict(type='PlainMamba', arch='test', img_size=32),
])
def test_mmseg_constructor_follows_the_layer_depth(constructor, paramwise_cfg, backbone):
    model = _segmentor(backbone)
    lr = _lr_of(_optimizer(model, constructor, paramwise_cfg))
    bb = model.backbone
    for name, p in model.named_parameters():
        if name.startswith('backbone.'):
            depth, num = bb.get_layer_depth(name, 'backbone.')
            assert lr[id(p)] == pytest.approx(BASE_LR * RATE ** (num - 1 - depth)), name
        else:
            assert lr[id(p)] == BASE_LR, name
    # the embeddings, every block and the last depth are all there: 6 distinct rates
    assert len(set(lr.values())) == bb.num_layers + 2


@pytest.mark.parametrize('paramwise_cfg,match', [
    (dict(num_layers=4, decay_rate=RATE, decay_type='stage_wise'),
     r"LearningRateDecayOptimizerConstructor: decay_type='stage_wise' is not supported for "
     r"Vim; use decay_type='layer_wise' or amvim_mm's "
     r"constructor='LayerDecayOptimWrapperConstructor'"),
    (dict(num_layers=12, decay_rate=RATE),
     r'LearningRateDecayOptimizerConstructor: paramwise_cfg num_layers=12 but the Vim backbone '
     r'has 4 layers'),
    (dict(num_layers=4), r'LearningRateDecayOptimizerConstructor: paramwise_cfg needs '
                         r'decay_rate'),
])
def test_mmseg_constructor_one_line_errors(paramwise_cfg, match):
    model = _segmentor(dict(type='Vim', arch='test', img_size=32, out_type='featmap'))
    with pytest.raises(ConfigError, match=match):
        _optimizer(model, 'LearningRateDecayOptimizerConstructor', paramwise_cfg)
    # mmseg's LayerDecayOptimizerConstructor names its own key instead of a bare KeyError
    with pytest.raises(ConfigError, match=r"LayerDecayOptimizerConstructor: paramwise_cfg "
                                          r"needs 'layer_decay_rate', got the keys "
                                          r"\['decay_rate', 'num_layers'\]"):
        _optimizer(model, 'LayerDecayOptimizerConstructor', dict(num_layers=4, decay_rate=0.9))


class _Model(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(4, 2)


def _groups(ctor_cls, model, paramwise_cfg):
    params = []
    ctor_cls(dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=BASE_LR,
                                                       weight_decay=WD)),
             dict(paramwise_cfg)).add_params(params, model)
    names = {id(p): n for n, p in model.named_parameters()}
    return sorted((g['group_name'], g['lr'], g['weight_decay'],
                   tuple(names[id(p)] for p in g['params'])) for g in params)


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet'])
def test_the_libraries_own_backbones_see_no_change(scope):
    """ConvNeXt (mmseg and mmdet) and BEiT (mmseg): the taught constructor's groups equal
    the library's own class's, group for group."""
    from mmpretrain.models import ConvNeXt

    from amvim_mm.models.skeleton.layer_decay import teach_upstream_layer_decay
    registries = __import__(f'{scope}.registry', fromlist=['OPTIM_WRAPPER_CONSTRUCTORS'])
    MODELS.build(dict(type='Vim', arch='test', img_size=32))     # teaches the libraries
    teach_upstream_layer_decay()                                   # (idempotent)
    cases = [(ConvNeXt(arch=dict(depths=[1, 1, 4, 1], channels=[4, 8, 8, 4])),
              'LearningRateDecayOptimizerConstructor',
              dict(num_layers=6, decay_rate=RATE, decay_type=t))
             for t in ('layer_wise', 'stage_wise')]
    if scope == 'mmseg':
        from mmseg.models.backbones import BEiT
        cases.append((BEiT(img_size=32, patch_size=16, embed_dims=8, num_layers=2, num_heads=2),
                      'LayerDecayOptimizerConstructor', dict(num_layers=2, layer_decay_rate=RATE)))
    for backbone, key, cfg in cases:
        taught = registries.OPTIM_WRAPPER_CONSTRUCTORS.get(key)
        assert taught.taught_by_amvim_mm and taught.__name__ == key
        model = _Model(backbone)
        ours, theirs = _groups(taught, model, cfg), _groups(taught.__mro__[1], model, cfg)
        assert ours == theirs and len(ours) > 2
    # and any other backbone still gets the library's own answer
    taught = registries.OPTIM_WRAPPER_CONSTRUCTORS.get('LearningRateDecayOptimizerConstructor')
    with pytest.raises(NotImplementedError):
        _groups(taught, _Model(nn.Conv2d(3, 4, 1)), cases[0][2])


def test_mmdet_constructor_follows_the_layer_depth():
    from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS
    model = _Model(MODELS.build(dict(type='VMamba', arch='test', img_size=32)))
    ctor = OPTIM_WRAPPER_CONSTRUCTORS.get('LearningRateDecayOptimizerConstructor')
    params = []
    ctor(dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=BASE_LR, weight_decay=WD)),
         dict(num_layers=5, decay_rate=RATE, decay_type='layer_wise')).add_params(params, model)
    lr = _lr_of(type('O', (), dict(param_groups=params)))
    for name, p in model.backbone.named_parameters():
        depth, num = model.backbone.get_layer_depth(name)
        assert lr[id(p)] == pytest.approx(BASE_LR * RATE ** (num - 1 - depth)), name
    assert lr[id(model.head.weight)] == BASE_LR


@pytest.mark.parametrize('rate', [float('nan'), float('inf'), -0.5, 0.0, 1.5, 'fast'])
@pytest.mark.parametrize('constructor,key', [
    ('LayerDecayOptimizerConstructor', 'layer_decay_rate'),
    ('LearningRateDecayOptimizerConstructor', 'decay_rate'),
    ('LayerDecayOptimWrapperConstructor', 'layer_decay_rate')])
def test_a_layer_decay_rate_outside_0_1_stops_in_one_line(constructor, key, rate):
    """Issue 52: nan / inf / negative / 0 rates trained with nan, negative or zero learning
    rates (exit 0), 'fast' ended in a traceback; every constructor now stops in one line."""
    model = _segmentor(dict(type='Vim', arch='test', img_size=32, out_type='featmap'))
    cfg = {key: rate} if constructor == 'LayerDecayOptimWrapperConstructor' else \
        dict(num_layers=4, **{key: rate})
    with pytest.raises(ConfigError, match=r'decay_rate must be (a number )?in \(0, 1\]') as err:
        _optimizer(model, constructor, cfg)
    assert '\n' not in str(err.value)
