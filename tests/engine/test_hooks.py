"""TokenReductionHook and the layer-decay optimizer constructor."""
import logging

import pytest
import torch
import torch.nn as nn
from mmengine.optim import build_optim_wrapper

import amvim_mm  # noqa: F401
from amvim_mm.engine.hooks import TokenReductionHook, find_reducible_backbone
from amvim_mm.registry import HOOKS, MODELS


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = MODELS.build(dict(type='Vim', arch='test', img_size=64))
        self.head = nn.Linear(32, 3)


class FakeRunner:
    def __init__(self, model):
        self.model = model
        self.logger = logging.getLogger('test')


def test_hook_switches_reduction_for_its_phases_only():
    model = Model()
    runner = FakeRunner(model)
    hook = HOOKS.build(dict(type='TokenReductionHook', reduction=dict(type='ToMe', ratio=0.2),
                            phases=('test', )))
    hook.before_val(runner)
    assert model.backbone.token_reducer is None
    hook.before_test(runner)
    assert type(model.backbone.token_reducer).__name__ == 'ToMe'
    x = torch.randn(1, 3, 64, 64)
    model.backbone(x)
    assert model.backbone.token_counts[-1] < 17
    hook.after_test(runner)
    assert model.backbone.token_reducer is None


def test_hook_restores_the_models_own_reducer():
    model = Model()
    model.backbone.set_token_reduction(dict(type='RandomPrune', r=1))
    own = model.backbone.token_reducer
    hook = TokenReductionHook(reduction=None, phases='val')
    hook.before_val(FakeRunner(model))
    assert model.backbone.token_reducer is None
    hook.after_val(FakeRunner(model))
    assert model.backbone.token_reducer is own


def test_hook_errors():
    with pytest.raises(ValueError, match='phases must be a non-empty subset'):
        TokenReductionHook(reduction=None, phases=('eval', ))
    with pytest.raises(ValueError, match=r'ratio must be a number in \[0, 1\)'):
        TokenReductionHook(reduction=dict(type='ToMe', ratio=2))
    with pytest.raises(TypeError, match='has no reducible backbone'):
        find_reducible_backbone(nn.Linear(2, 2))


def test_layer_decay_groups():
    model = Model()
    ow = build_optim_wrapper(model, dict(
        type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
        constructor='LayerDecayOptimWrapperConstructor', paramwise_cfg=dict(layer_decay_rate=0.5)))
    lr_of = {}
    for g in ow.optimizer.param_groups:
        for p in g['params']:
            lr_of[p] = (g['lr'], g['weight_decay'])
    bb = model.backbone
    # depth 0 (embeddings) gets rate^(num_layers - 1) = 0.5^5; block i gets 0.5^(4 - i)
    assert lr_of[bb.patch_embed.proj.weight][0] == pytest.approx(1e-3 * 0.5 ** 5)
    assert lr_of[bb.layers[3].mixer.in_proj.weight][0] == pytest.approx(1e-3 * 0.5 ** 1)
    assert lr_of[model.head.weight] == (pytest.approx(1e-3), 0.05)
    # no weight decay for 1-D params, the position embedding, the class token and A_log
    for p in (bb.pos_embed, bb.cls_token, bb.layers[0].mixer.A_log, bb.layers[0].norm.weight,
              model.head.bias):
        assert lr_of[p][1] == 0.0
    assert lr_of[bb.layers[0].mixer.x_proj.weight][1] == 0.05
    with pytest.raises(ValueError, match=r"unknown paramwise_cfg keys \['decay'\]"):
        build_optim_wrapper(model, dict(
            type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3),
            constructor='LayerDecayOptimWrapperConstructor', paramwise_cfg=dict(decay=0.5)))


def test_layer_decay_accepts_mmseg_keys_when_they_agree():
    """Configs written for mmseg's LayerDecayOptimizerConstructor carry num_layers/decay_type."""
    model = Model()
    depth = model.backbone.num_layers

    def build(**paramwise):
        return build_optim_wrapper(model, dict(
            type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3),
            constructor='LayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(layer_decay_rate=0.5, **paramwise)))

    same = build(num_layers=depth, decay_type='layer_wise')
    ref = build()
    assert [g['lr'] for g in same.optimizer.param_groups] == \
        [g['lr'] for g in ref.optimizer.param_groups]
    with pytest.raises(ValueError, match=f'num_layers={depth + 1} but the backbone has {depth}'):
        build(num_layers=depth + 1)
    with pytest.raises(ValueError, match="decay_type='stage_wise' is not supported"):
        build(decay_type='stage_wise')


def test_frozen_warmup_hook_holds_parameters_for_the_warmup_epochs():
    """Parameters of the held module come back after every step of the warm-up epochs (as
    with learning rate 0), excluded ones train, and from the first epoch after it all train."""
    from types import SimpleNamespace

    import torch.nn as nn

    from amvim_mm.engine import FrozenWarmupHook
    from amvim_mm.errors import ConfigError

    model = nn.Module()
    model.student = nn.Module()
    model.student.backbone = nn.Module()
    model.student.backbone.layer = nn.Linear(2, 2)
    model.student.backbone.token_reducer = nn.Linear(2, 1)
    runner = SimpleNamespace(model=model, iter=0, epoch=0)
    hook = FrozenWarmupHook(epochs=1)
    layer, red = model.student.backbone.layer, model.student.backbone.token_reducer
    start_w, start_r = layer.weight.detach().clone(), red.weight.detach().clone()

    def step(i, epoch):
        runner.iter, runner.epoch = i, epoch
        hook.before_train_iter(runner, i)
        with torch.no_grad():          # what an optimizer step would do
            layer.weight.add_(1.0)
            red.weight.add_(1.0)
        hook.after_train_iter(runner, i)

    step(0, 0)
    step(1, 0)
    assert torch.equal(layer.weight, start_w)                 # held through epoch 0
    assert torch.allclose(red.weight, start_r + 2)            # the reducer trains
    step(2, 1)
    assert torch.allclose(layer.weight, start_w + 1)          # released in epoch 1
    with pytest.raises(ConfigError, match='exactly one'):
        FrozenWarmupHook(iters=2, epochs=1)
    with pytest.raises(ConfigError, match='no module'):
        h = FrozenWarmupHook(module='student.nothing', iters=1)
        h.before_train_iter(SimpleNamespace(model=model, iter=0, epoch=0), 0)
