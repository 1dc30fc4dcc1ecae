"""Vim / AMVim backbones: official equivalence, arch validation, sizes, outputs, loading."""
import argparse
import math

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.models.skeleton.embed import resize_pos_embed
from amvim_mm.registry import MODELS
from amvim_mm.utils.checkpoint import CheckpointMismatchError
from tests.reference.official_vim import official_vim_forward, random_official_state_dict


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def build(**kw):
    cfg = dict(type='Vim', arch='test', img_size=64)
    cfg.update(kw)
    return MODELS.build(cfg)


@pytest.fixture(scope='module')
def official_tiny_112(tmp_path_factory):
    """An official-format Vim-T file for 112x112 (pos_embed of 50 tokens), random weights."""
    model = MODELS.build(dict(type='Vim', arch='tiny', img_size=112))
    sd = random_official_state_dict(model)
    assert sd['pos_embed'].shape == (1, 50, 192)
    path = tmp_path_factory.mktemp('ckpt') / 'vim_t_112.pth'
    torch.save({'model': sd, 'args': argparse.Namespace(model='vim_tiny')}, path)
    return path, sd


def test_contract_official_tiny_112(official_tiny_112):
    """The acceptance contract: official file -> Pretrained init -> official features."""
    path, sd = official_tiny_112
    m = MODELS.build(dict(type='Vim', arch='tiny', img_size=112, out_type='cls_token',
                          init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    m.init_weights()
    m.eval()
    x = torch.randn(2, 3, 112, 112, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = m(x)[-1]
        ref, _ = official_vim_forward(sd, x)
    assert ours.shape == (2, 192)
    assert rel_err(ours, ref) < 1e-4


def test_official_even_grid_and_tokens():
    """Even grid (cls at the exact middle of both paths), all tokens, test arch."""
    m = build(out_type='raw').eval()
    sd = random_official_state_dict(m, seed=3)
    m.load_state_dict({k: v for k, v in sd.items() if not k.startswith('head')})
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ours = m(x)[-1]
        ref = official_vim_forward(sd, x, return_tokens=True)
    assert rel_err(ours, ref) < 1e-5


@pytest.mark.parametrize('arch,dims', [('tiny', 192), ('t', 192), ('small', 384), ('S', 384),
                                       ('b', 768)])
def test_arch_zoo_aliases(arch, dims):
    # only the settings are checked here (building Vim-B would be slow)
    from amvim_mm.models.vim.vim import VIM_ARCHS
    from amvim_mm.models.vim.family import _canonical_arch
    cfg = _canonical_arch(VIM_ARCHS, arch, 'Vim')
    assert cfg['embed_dims'] == dims and cfg['num_layers'] == 24
    assert cfg['dt_rank'] == math.ceil(dims / 16) and cfg['d_state'] == 16


def test_tiny_param_count_and_key_shapes():
    m = MODELS.build(dict(type='Vim', arch='tiny'))
    n = sum(p.numel() for p in m.parameters()) + 192 * 1000 + 1000  # + classifier head
    assert abs(n / 1e6 - 7.15) < 0.05, n
    sd = m.state_dict()
    assert sd['layers.0.mixer.in_proj.weight'].shape == (768, 192)
    assert sd['layers.0.mixer.conv1d.weight'].shape == (384, 1, 4)
    assert sd['layers.0.mixer.x_proj.weight'].shape == (44, 384)
    assert sd['layers.0.mixer.dt_proj.weight'].shape == (384, 12)
    assert sd['layers.0.mixer.A_b_log'].shape == (384, 16)
    assert sd['layers.0.mixer.out_proj.weight'].shape == (192, 384)
    assert sd['pos_embed'].shape == (1, 197, 192)


def test_arch_errors():
    with pytest.raises(KeyError, match="unknown Vim arch 'huge'"):
        build(arch='huge')
    with pytest.raises(ValueError, match=r"missing keys \['num_layers'\]"):
        build(arch=dict(embed_dims=64))
    with pytest.raises(ValueError, match=r"unknown keys \['heads'\]"):
        build(arch=dict(embed_dims=64, num_layers=2, heads=3))
    with pytest.raises(ValueError, match='num_layers must be a positive int'):
        build(arch=dict(embed_dims=64, num_layers=0))
    with pytest.raises(ValueError, match='out_type must be one of'):
        build(out_type='patches')
    with pytest.raises(ValueError, match='out_indices 4 is out of range for 4 layers'):
        build(out_indices=4)
    with pytest.raises(ValueError, match='needs with_cls_token=True'):
        build(with_cls_token=False)


def test_custom_arch_dict():
    m = build(arch=dict(embed_dims=48, num_layers=2, d_state=4), out_type='raw')
    assert m.layers[0].mixer.dt_rank == 3 and m.layers[0].mixer.d_state == 4
    assert m(torch.randn(1, 3, 32, 32))[0].shape == (1, 5, 48)


@pytest.mark.parametrize('hw', [(64, 64), (48, 80), (33, 50), (16, 16), (100, 36)])
def test_any_input_size(hw):
    m = build(out_type='featmap', out_indices=(0, -1)).eval()
    x = torch.randn(2, 3, *hw)
    outs = m(x)
    gh, gw = math.ceil((hw[0] - 16) / 16) + 1, math.ceil((hw[1] - 16) / 16) + 1
    assert len(outs) == 2
    for o in outs:
        assert o.shape == (2, 32, gh, gw)
        assert torch.isfinite(o).all()


def test_input_errors():
    m = build()
    with pytest.raises(ValueError, match='smaller than one patch'):
        m(torch.randn(1, 3, 8, 64))
    with pytest.raises(ValueError, match='expected 3 input channels, got 1'):
        m(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match=r'expected images of shape \(B, C, H, W\)'):
        m(torch.randn(3, 64, 64))


def test_out_indices_negative_and_types():
    m = build(out_indices=(-1, 1, -3), out_type='cls_token').eval()
    assert m.out_indices == [1, 3]
    outs = m(torch.randn(2, 3, 64, 64))
    assert [o.shape for o in outs] == [(2, 32), (2, 32)]
    raw = build(out_type='raw')(torch.randn(2, 3, 64, 64))[0]
    assert raw.shape == (2, 17, 32)


def test_featmap_matches_raw_tokens():
    torch.manual_seed(0)
    raw_m = build(out_type='raw', out_indices=(1, )).eval()
    fm = build(out_type='featmap', out_indices=(1, )).eval()
    fm.load_state_dict(raw_m.state_dict())
    x = torch.randn(1, 3, 64, 64)
    raw = raw_m(x)[0]
    feat = fm(x)[0]
    patches = torch.cat([raw[:, :8], raw[:, 9:]], 1)  # class token at index 16 // 2
    assert torch.equal(feat.flatten(2).transpose(1, 2), patches)


def test_without_cls_token_runs():
    m = build(with_cls_token=False, out_type='featmap').eval()
    assert m(torch.randn(1, 3, 64, 64))[0].shape == (1, 32, 4, 4)


def test_pos_embed_resize_round_trip_and_middle_token():
    pe = torch.randn(1, 1 + 14 * 14, 8)
    same = resize_pos_embed(pe, (14, 14), (14, 14))
    assert torch.equal(same, pe)
    up = resize_pos_embed(pe, (14, 14), (28, 28))
    assert up.shape == (1, 1 + 28 * 28, 8)
    # the middle class-token entry is carried over unchanged to the new middle
    assert torch.equal(up[:, 28 * 28 // 2], pe[:, 98])
    back = resize_pos_embed(up, (28, 28), (14, 14))
    assert torch.equal(back[:, 98], pe[:, 98])
    # bicubic up x2 then down x2 (no antialias) approximately returns the grid
    grid = torch.cat([pe[:, :98], pe[:, 99:]], 1)
    grid_back = torch.cat([back[:, :98], back[:, 99:]], 1)
    assert (grid_back - grid).abs().mean() < 0.2 * grid.abs().mean()
    with pytest.raises(ValueError, match='pos_embed has 197 tokens, but a 7x7 grid'):
        resize_pos_embed(pe, (7, 7), (14, 14))


def test_resized_pos_embed_is_cached_at_inference_only():
    """Without grad mode the resized embedding is computed once per grid and weights (a load
    or an in-place change recomputes it); with grad mode every call resizes (and the result
    carries the gradient)."""
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32))
    with torch.no_grad():
        a = m.pos_embed_for((3, 3))
        assert m.pos_embed_for((3, 3)) is a
        assert torch.equal(a, resize_pos_embed(m.pos_embed, m.patch_resolution, (3, 3)))
        m.pos_embed.mul_(2.0)                       # a new version: recomputed
        b = m.pos_embed_for((3, 3))
        assert b is not a and torch.allclose(b, 2 * a)
        m.load_state_dict(MODELS.build(dict(type='Vim', arch='test', img_size=32)).state_dict())
        assert torch.equal(m.pos_embed_for((3, 3)), resize_pos_embed(
            m.pos_embed, m.patch_resolution, (3, 3)))
        assert m.pos_embed_for(m.patch_resolution) is m.pos_embed
    g = m.pos_embed_for((3, 3))
    assert g.requires_grad and g is not m.pos_embed_for((3, 3))


def test_load_resizes_pos_embed_from_other_resolution(tmp_path):
    small = build(img_size=32)
    sd = random_official_state_dict(small, seed=2)
    path = tmp_path / 'ckpt.pth'
    torch.save({'model': sd}, path)
    big = build(img_size=64, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    big.init_weights()
    assert big.pos_embed.shape == (1, 17, 32)
    assert torch.equal(big.pos_embed[:, 8], sd['pos_embed'][:, 2])


def test_strict_loading_reports_keys(tmp_path):
    m = build()
    sd = random_official_state_dict(m)
    del sd['layers.1.mixer.A_b_log']
    sd['layers.9.mixer.D'] = torch.ones(64)
    path = tmp_path / 'bad.pth'
    torch.save({'model': sd}, path)
    m2 = build(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointMismatchError) as e:
        m2.init_weights()
    msg = str(e.value)
    assert "missing keys (1): ['layers.1.mixer.A_b_log']" in msg
    assert "unexpected keys (1): ['layers.9.mixer.D']" in msg
    assert 'strict=False' in msg
    # opting out loads what matches, and says what did not
    m3 = build(init_cfg=dict(type='Pretrained', checkpoint=str(path), strict=False))
    m3.init_weights()
    assert torch.equal(m3.layers[0].mixer.D, sd['layers.0.mixer.D'])


def test_loading_wrong_arch_names_shapes(tmp_path):
    sd = random_official_state_dict(build(arch=dict(embed_dims=48, num_layers=4)))
    path = tmp_path / 'w.pth'
    torch.save({'model': sd}, path)
    m = build(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointMismatchError, match='size mismatch for patch_embed.proj'):
        m.init_weights()


def test_init_cfg_typo():
    m = build(init_cfg=dict(type='Pretrained', checkpint='x.pth'))
    with pytest.raises(ValueError, match=r"does not take \['checkpint'\]"):
        m.init_weights()


def test_drop_path_schedule():
    m = build(arch=dict(embed_dims=32, num_layers=5), drop_path_rate=0.4)
    rates = [layer.drop_path.drop_prob for layer in m.layers]
    assert rates == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])
    assert m.drop_path.drop_prob == pytest.approx(0.4)
    # eval is deterministic, train with drop path is not
    x = torch.randn(4, 3, 64, 64)
    m.eval()
    assert torch.equal(m(x)[0], m(x)[0])
    m.train()
    torch.manual_seed(0)
    a = m(x)[0]
    torch.manual_seed(1)
    b = m(x)[0]
    assert not torch.equal(a, b)


def test_layer_depth():
    m = build()
    assert m.get_layer_depth('backbone.cls_token', 'backbone.') == (0, 6)
    assert m.get_layer_depth('backbone.patch_embed.proj.weight', 'backbone.') == (0, 6)
    assert m.get_layer_depth('backbone.layers.2.mixer.A_log', 'backbone.') == (3, 6)
    assert m.get_layer_depth('backbone.norm_f.weight', 'backbone.') == (5, 6)
    assert m.get_layer_depth('head.fc.weight', 'backbone.') == (5, 6)


def test_frozen_stages():
    m = build(frozen_stages=2)
    m.train()
    assert not m.patch_embed.proj.weight.requires_grad and not m.pos_embed.requires_grad
    assert not any(p.requires_grad for p in m.layers[1].parameters())
    assert all(p.requires_grad for p in m.layers[2].parameters())
    assert not m.layers[1].training and m.layers[2].training


def test_backward_reaches_all_parameters():
    m = build(out_type='cls_token')
    m.train()
    m(torch.randn(2, 3, 64, 64))[0].sum().backward()
    no_grad = [n for n, p in m.named_parameters() if p.grad is None]
    assert no_grad == []


def test_bf16_autocast_keeps_fp32_residual():
    m = build(out_type='raw').eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = m(x)[0]
    assert out.dtype == torch.float32  # the residual stream stays fp32
    assert torch.isfinite(out).all()
    assert rel_err(out, m(x)[0]) < 5e-2


def test_unused_parameters_get_no_gradient_for_ddp():
    """Dense configs drop the class token and the final norm: those parameters stay loadable
    but do not require grad, so plain DDP (no find_unused_parameters) does not stall."""
    import torch
    from amvim_mm.registry import MODELS
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32, out_type='featmap',
                          with_cls_token=False, final_norm=False, out_indices=(1, 3)))
    outs = m(torch.randn(2, 3, 32, 32))
    sum(o.sum() for o in outs).backward()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    assert not m.cls_token.requires_grad and not m.norm_f.weight.requires_grad
    assert 'cls_token' in m.state_dict() and 'norm_f.weight' in m.state_dict()
