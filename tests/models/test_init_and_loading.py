"""The backbone inside other people's models: initialisation after an upstream ``init_cfg`` and
whole-model checkpoint loads through mmengine (what the libraries' own tools do)."""
import math

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.model import initialize
from mmengine.runner.checkpoint import load_checkpoint

import amvim_mm  # noqa: F401
from amvim_mm.errors import CheckpointMismatchError
from amvim_mm.models.backbones import Vim

DEIT_SWAP = """
_base_ = ['mmpretrain::deit/deit-tiny_4xb256_in1k.py']
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(_delete_=True, type='{type}', arch='test', img_size=32, out_type='cls_token'),
    head=dict(num_classes=3, in_channels=32))
"""


def _build(tmp_path, text, scope):
    path = tmp_path / 'cfg.py'
    path.write_text(text)
    cfg = Config.fromfile(str(path))
    if scope == 'mmpretrain':
        from mmpretrain.registry import MODELS
    else:
        from mmseg.registry import MODELS
    return MODELS.build(cfg.model)


@torch.no_grad()
def _check_mamba_init(backbone):
    for layer in backbone.layers:
        mixer = layer.mixer
        for k in range(mixer.num_paths):
            _, x_proj, dt_proj, A_log, D = mixer.path_params(k)
            step = F.softplus(dt_proj.bias.detach())
            assert step.min() >= 1e-4 - 1e-9 and step.max() <= 0.1 + 1e-6, step
            bound = dt_proj.in_features ** -0.5
            assert dt_proj.weight.abs().max() <= bound
            assert dt_proj.weight.std() > 0.5 * bound / math.sqrt(3)
            torch.testing.assert_close(A_log[0], torch.log(torch.arange(1., mixer.d_state + 1)))
            assert torch.all(D == 1)
        # nn.Linear's default (kaiming uniform, std = 1/sqrt(3 fan_in)), not TruncNormal(0.02)
        fan_in = mixer.in_proj.in_features
        assert mixer.in_proj.weight.std() == pytest.approx(1 / math.sqrt(3 * fan_in), rel=0.2)
        # out_proj: the same, rescaled by sqrt(depth) for the residual stream
        std = 1 / math.sqrt(3 * mixer.out_proj.in_features) / math.sqrt(backbone.num_layers)
        assert mixer.out_proj.weight.std() == pytest.approx(std, rel=0.2)


@pytest.mark.parametrize('type_', ['Vim', 'AMVim', 'LocalVim'])
def test_deit_init_cfg_keeps_the_mamba_initialisation(tmp_path, type_):
    """mmpretrain's deit-tiny config: TruncNormal(0.02) on every Linear at model level."""
    model = _build(tmp_path, DEIT_SWAP.format(type=type_), 'mmpretrain')
    # the check sees what the upstream init_cfg alone does to the backbone ...
    initialize(model.backbone, model.init_cfg)
    with pytest.raises(AssertionError):
        _check_mamba_init(model.backbone)
    # ... and after the model's init_weights (parent first, then children) it is undone
    model.init_weights()
    _check_mamba_init(model.backbone)


def _official_file(tmp_path, num_classes=3, img_size=32):
    torch.manual_seed(0)
    sd = {k: v.clone() for k, v in Vim(arch='test', img_size=img_size).state_dict().items()}
    sd['head.weight'] = torch.randn(num_classes, 32)
    sd['head.bias'] = torch.randn(num_classes)
    path = tmp_path / 'vim_official.pth'
    torch.save({'model': sd}, path)
    return path, sd


def test_official_file_loads_into_an_mmpretrain_classifier(tmp_path):
    """What mmpretrain's tools/test.py does with load_from: every weight arrives."""
    path, sd = _official_file(tmp_path)
    model = _build(tmp_path, DEIT_SWAP.format(type='Vim').replace(
        "head=dict(num_classes=3, in_channels=32)",
        "head=dict(_delete_=True, type='LinearClsHead', num_classes=3, in_channels=32)"),
        'mmpretrain')
    load_checkpoint(model, str(path), map_location='cpu')
    for k, v in sd.items():
        mine = model.state_dict()['head.fc.' + k[5:] if k.startswith('head.') else
                                  'backbone.' + k]
        assert torch.equal(mine, v), k


SEG_SWAP = """
_base_ = ['mmseg::vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py']
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=(32, 32)),
    backbone=dict(_delete_=True, type='Vim', arch='test', img_size=32, out_type='featmap',
                  out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[32] * 4, out_channels=32),
    decode_head=dict(in_channels=[32] * 4, channels=16, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=32, channels=16, norm_cfg=norm_cfg))
"""


def test_official_file_into_a_segmentor_is_an_error(tmp_path):
    """mmseg's tools/test.py with an ImageNet file would test random heads: refused."""
    path, _ = _official_file(tmp_path)
    model = _build(tmp_path, SEG_SWAP, 'mmseg')
    with pytest.raises(CheckpointMismatchError, match="classifier's"):
        load_checkpoint(model, str(path), map_location='cpu')


def test_whole_model_file_without_backbone_weights_is_an_error(tmp_path):
    model = _build(tmp_path, SEG_SWAP, 'mmseg')
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith('backbone.')}
    path = tmp_path / 'heads_only.pth'
    torch.save({'state_dict': sd}, path)
    with pytest.raises(CheckpointMismatchError, match="no weights for the Vim backbone"):
        load_checkpoint(model, str(path), map_location='cpu')
    # the model's own checkpoint loads (strict=False as mmengine's load_from)
    full = tmp_path / 'full.pth'
    torch.save({'state_dict': model.state_dict()}, full)
    load_checkpoint(model, str(full), map_location='cpu')


# ------------------------------------------- mmseg's ``pretrained=`` (EncoderDecoder passes it)
SEG_PRETRAINED = """
_base_ = ['mmseg::_base_/models/fpn_r50.py']
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)
model = dict(
    pretrained={pretrained!r},
    data_preprocessor=dict(size=(32, 32)),
    backbone=dict(_delete_=True, type='{type}', arch='test', img_size=32, {extra}),
    neck=None,
    decode_head=dict(_delete_=True, type='FCNHead', in_channels=32, channels=8, num_convs=1,
                     num_classes=2))
"""
BACKBONE_EXTRA = {'Vim': "out_type='featmap'", 'AMVim': "out_type='featmap'",
                  'LocalVim': "out_type='featmap'", 'VMamba': 'out_indices=(1, )',
                  'PlainMamba': ''}


@pytest.mark.parametrize('type_', list(BACKBONE_EXTRA))
def test_mmseg_pretrained_argument_loads_the_backbone(tmp_path, type_):
    """A config that keeps its base's ``pretrained=`` (was: TypeError: unexpected keyword
    argument 'pretrained' from every backbone of ours)."""
    from mmseg.registry import MODELS
    extra = BACKBONE_EXTRA[type_]
    source = MODELS.build(Config.fromstring(  # the backbone's own weights, moved off its init
        SEG_PRETRAINED.format(pretrained=None, type=type_, extra=extra), '.py').model).backbone
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.rand_like(p))
    path = tmp_path / f'{type_}.pth'
    torch.save(source.state_dict(), path)
    cfg = Config.fromstring(SEG_PRETRAINED.format(pretrained=str(path), type=type_,
                                                  extra=extra), '.py')
    with pytest.warns(UserWarning, match='DeprecationWarning: pretrained is deprecated, '
                                         'please use "init_cfg" instead'):
        model = MODELS.build(cfg.model)
    assert model.backbone.init_cfg == dict(type='Pretrained', checkpoint=str(path))
    model.init_weights()
    for k, v in source.state_dict().items():
        assert torch.equal(model.backbone.state_dict()[k], v), k


@pytest.mark.parametrize('type_', list(BACKBONE_EXTRA))
def test_pretrained_none_builds_and_bad_values_are_errors(tmp_path, type_):
    from amvim_mm.errors import ConfigError
    from amvim_mm.registry import MODELS
    cfg = dict(type=type_, arch='test', img_size=32)
    assert MODELS.build(dict(cfg, pretrained=None)).init_cfg is None
    with pytest.raises(ConfigError, match=rf"^{type_}: init_cfg and pretrained cannot be set at "
                                          r"the same time \(got pretrained='a.pth'\)"):
        MODELS.build(dict(cfg, pretrained='a.pth',
                          init_cfg=dict(type='Pretrained', checkpoint='b.pth')))
    for bad in (3, '', ['a.pth']):
        with pytest.raises(ConfigError, match=rf'^{type_}: pretrained must be a checkpoint path '
                                              rf'\(str\) or None, got {bad!r}'.replace('[', r'\[')
                           .replace(']', r'\]')):
            MODELS.build(dict(cfg, pretrained=bad))


@pytest.mark.parametrize('family', ['Vim', 'AMVim', 'LocalVim', 'PlainMamba', 'ViL', 'AMViL',
                                    'VMamba'])
@pytest.mark.parametrize('dtype', [torch.int64, torch.bool])
def test_an_integer_tensor_for_a_float_weight_is_refused(family, dtype):
    """Issue 52: a ViL file with an int64 tensor for a float weight loaded (cast without a
    word). Every family refuses it, loaded alone or inside a whole model."""
    from amvim_mm.registry import MODELS
    cfg = dict(type=family, arch='test') if family == 'VMamba' else \
        dict(type=family, arch='test', img_size=32)
    m = MODELS.build(cfg)
    sd = m.state_dict()
    key = next(k for k, v in sd.items() if v.is_floating_point() and v.ndim > 1)
    sd[key] = sd[key].to(dtype)
    with pytest.raises(CheckpointMismatchError, match=f'{key} is {dtype}') as err:
        m.load_state_dict(sd)
    assert '\n' not in str(err.value)
    wrapper = torch.nn.Module()
    wrapper.backbone = m
    with pytest.raises(CheckpointMismatchError, match=f'backbone.{key} is {dtype}'):
        wrapper.load_state_dict({f'backbone.{k}': v for k, v in sd.items()})
