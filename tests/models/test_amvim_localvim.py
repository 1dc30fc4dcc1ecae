"""AMVim and LocalVim: official-weight equivalence, variants, LocalVim direction tables."""
import argparse

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import amvim_mm  # noqa: F401
from amvim_mm.registry import MODELS
from tests.models.test_scan_orders import windows_reference
from tests.reference import official_vim as ref


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def sequence_index(H, W, cells, cls_middle=True):
    """Token-sequence indices (raster with the class token at M//2) of a path's visiting order.

    ``cells`` is the forward visiting order of (row, col); the class token goes to the middle of
    the forward sequence.
    """
    M = H * W
    mid = M // 2

    def seq_idx(p):
        return p if p < mid else p + 1

    order = [seq_idx(r * W + c) for r, c in cells]
    if cls_middle:
        order = order[:M // 2] + [mid] + order[M // 2:]
    return torch.tensor(order)


def amvim_reference_mixer(H, W, k=3):
    """Path 1 raster, path 2 = reverse of (k x k windows row-major, column-major inside)."""
    fwd = sequence_index(H, W, windows_reference(H, W, k, 'col'))
    order2 = fwd.flip(0)

    def mixer(sd, p, h):
        L = h.shape[1]
        xz = rearrange(sd[p + 'in_proj.weight'] @ rearrange(h, 'b l d -> d (b l)'),
                       'd (b l) -> b d l', l=L)
        A = -torch.exp(sd[p + 'A_log'].float())
        A_b = -torch.exp(sd[p + 'A_b_log'].float())
        out = ref.inner_fn(xz, sd[p + 'conv1d.weight'], sd[p + 'conv1d.bias'],
                           sd[p + 'x_proj.weight'], sd[p + 'dt_proj.weight'], A,
                           sd[p + 'D'].float(), sd[p + 'dt_proj.bias'])
        out_b_path = ref.inner_fn(xz[:, :, order2], sd[p + 'conv1d_b.weight'],
                                  sd[p + 'conv1d_b.bias'], sd[p + 'x_proj_b.weight'],
                                  sd[p + 'dt_proj_b.weight'], A_b, sd[p + 'D_b'].float(),
                                  sd[p + 'dt_proj_b.bias'])
        out_b = torch.empty_like(out_b_path)
        out_b[:, :, order2] = out_b_path
        return F.linear(rearrange(out + out_b, 'b d l -> b l d') / 2, sd[p + 'out_proj.weight'])

    return mixer


@pytest.mark.parametrize('img', [112, 64])
def test_amvim_contract_official_file(tmp_path, img):
    arch = 'tiny' if img == 112 else 'test'
    vim = MODELS.build(dict(type='Vim', arch=arch, img_size=img))
    sd = ref.random_official_state_dict(vim, seed=4)
    path = tmp_path / 'vim.pth'
    torch.save({'model': sd, 'args': argparse.Namespace()}, path)
    m = MODELS.build(dict(type='AMVim', arch=arch, img_size=img, out_type='cls_token',
                          init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    m.init_weights()
    m.eval()
    x = torch.randn(2, 3, img, img, generator=torch.Generator().manual_seed(0))
    H = W = img // 16
    with torch.no_grad():
        ours = m(x)[-1]
        expect, _ = ref.official_vim_forward(sd, x, mixer_fn=amvim_reference_mixer(H, W))
        vim_out, _ = ref.official_vim_forward(sd, x)
    assert ours.shape == (2, m.embed_dims)
    assert rel_err(ours, expect) < 1e-4
    assert rel_err(ours, vim_out) > 1e-3  # the window path really changes the model


def _pair(**amvim_kw):
    torch.manual_seed(0)
    vim = MODELS.build(dict(type='Vim', arch='test', img_size=96, out_type='raw')).eval()
    am = MODELS.build(dict(type='AMVim', arch='test', img_size=96, out_type='raw',
                           **amvim_kw)).eval()
    am.load_state_dict(vim.state_dict())
    return vim, am


def test_same_keys_as_vim():
    vim, am = _pair()
    assert list(vim.state_dict()) == list(am.state_dict())


def test_window_size_one_is_exactly_vim():
    vim, am = _pair(window_size=1)
    x = torch.randn(2, 3, 96, 96)
    assert torch.equal(vim(x)[0], am(x)[0])


def test_window_as_large_as_grid_is_d1_d4():
    _, am = _pair(window_size=6)
    _, d14 = _pair(paths=[dict(order='raster'), dict(order='column', reverse=True)])
    x = torch.randn(1, 3, 96, 96)
    assert torch.equal(am(x)[0], d14(x)[0])


@pytest.mark.parametrize('kw', [dict(inner='row'), dict(inner='random', seed=1),
                                dict(window_size=2), dict(windowed_path=0),
                                dict(shift_odd_blocks=True)])
def test_variants_run_and_differ(kw):
    _, base = _pair()
    _, var = _pair(**kw)
    x = torch.randn(1, 3, 96, 96)
    a, b = base(x)[0], var(x)[0]
    assert a.shape == b.shape and torch.isfinite(b).all()
    assert not torch.equal(a, b)


def test_shift_only_on_odd_blocks():
    m = MODELS.build(dict(type='AMVim', arch='test', shift_odd_blocks=True))
    assert m.layers[0].paths[1]['shift'] == 0 and m.layers[1].paths[1]['shift'] == 1


def test_amvim_errors():
    with pytest.raises(ValueError, match='windowed_path must be 0 or 1'):
        MODELS.build(dict(type='AMVim', arch='test', windowed_path=2))
    with pytest.raises(ValueError, match='window size must be a positive int'):
        MODELS.build(dict(type='AMVim', arch='test', window_size=0))
    with pytest.raises(ValueError, match='paths must hold 2 scan orders'):
        MODELS.build(dict(type='AMVim', arch='test', paths=[dict(order='raster')]))


def test_amvim_any_size_and_featmaps():
    m = MODELS.build(dict(type='AMVim', arch='test', img_size=64, out_type='featmap',
                          out_indices=(1, -1))).eval()
    for hw in [(64, 64), (80, 48), (50, 70)]:
        outs = m(torch.randn(1, 3, *hw))
        gh, gw = -(-(hw[0] - 16) // 16) + 1, -(-(hw[1] - 16) // 16) + 1
        assert [o.shape for o in outs] == [(1, 32, gh, gw)] * 2


# --------------------------------------------------------------------------- LocalVim
def test_localvim_default_table_and_keys():
    m = MODELS.build(dict(type='LocalVim', arch='tiny'))
    assert m.num_layers == 20
    names = [d['order'] + ('_flip' if d['reverse'] else '') + (
        str(d.get('size', '')) if d['order'] == 'window' else '') for d in m.layers[0].paths]
    assert names == ['raster', 'column_flip', 'window7', 'window_flip7']
    sd = m.state_dict()
    for k in range(4):
        assert sd[f'layers.3.mixer.A_log_{k}'].shape == (384, 16)
        assert sd[f'layers.3.mixer.conv1d_{k}.weight'].shape == (384, 1, 4)
    assert sd['layers.0.mixer.attn.global_reduce.weight'].shape == (48, 384)
    assert sd['layers.0.mixer.attn.channel_select.weight'].shape == (384, 48)


def test_localvim_forward_backward_cpu():
    m = MODELS.build(dict(type='LocalVim', arch='test', img_size=64, out_type='cls_token'))
    m.train()
    out = m(torch.randn(2, 3, 64, 64))[0]
    assert out.shape == (2, 32)
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_localvim_directions_hand_written_4x4():
    """Visiting orders of the 8 directions on a 4x4 grid (no class token), by hand."""
    m = MODELS.build(dict(type='LocalVim', arch='test', img_size=64, with_cls_token=False,
                          out_type='featmap',
                          directions=[('h', 'v', 'w2', 'w2_flip'),
                                      ('h_flip', 'v_flip', 'w7', 'w7_flip')] * 2))
    from amvim_mm.models.layout.scan_context import ScanContext
    ctx = ScanContext((4, 4), cls_index=-1)
    got = [[ctx.path_index(p).perm.tolist() if ctx.path_index(p).kind == 'gather' else
            {'identity': list(range(16)), 'flip': list(range(15, -1, -1))}[
                ctx.path_index(p).kind] for p in layer.paths] for layer in m.layers]
    h = list(range(16))
    v = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]
    w2 = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    w7 = h  # one window covers the 4x4 grid, row-major inside
    assert got[0] == got[2] == [h, v, w2, w2[::-1]]
    assert got[1] == got[3] == [h[::-1], v[::-1], w7, w7[::-1]]


def test_localvim_table_errors():
    with pytest.raises(ValueError, match="unknown direction 'w3'"):
        MODELS.build(dict(type='LocalVim', arch='test', directions=[('h', 'w3')] * 4))
    with pytest.raises(ValueError, match='directions has 1 rows for 4 layers'):
        MODELS.build(dict(type='LocalVim', arch='test', directions=[('h', 'v')]))
