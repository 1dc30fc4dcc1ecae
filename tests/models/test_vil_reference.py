"""The ViL reference (tests/reference/official_vil.py): official key names and shapes, sanity of
the forward, the parallel mLSTM cell against its recurrence, directions and pooling."""
import math

import pytest
import torch
import torch.nn.functional as F

from tests.reference.official_vil import (
    mlstm_parallel, mlstm_recurrent, official_forward, official_state_dict)

V2_BLOCK = {   # key suffix -> shape, dim 16 (inner 32), of a v2 sub-block
    'norm.weight': (16,), 'norm.bias': (16,), 'layer.learnable_skip': (32,),
    'layer.proj_up.weight': (64, 16), 'layer.proj_up.bias': (64,),
    'layer.q_proj.weight': (8, 4, 4), 'layer.q_proj.bias': (32,),
    'layer.k_proj.weight': (8, 4, 4), 'layer.k_proj.bias': (32,),
    'layer.v_proj.weight': (8, 4, 4), 'layer.v_proj.bias': (32,),
    'layer.conv.weight': (32, 1, 3, 3), 'layer.conv.bias': (32,),
    'layer.mlstm_cell.igate.weight': (4, 96), 'layer.mlstm_cell.igate.bias': (4,),
    'layer.mlstm_cell.fgate.weight': (4, 96), 'layer.mlstm_cell.fgate.bias': (4,),
    'layer.mlstm_cell.outnorm.weight': (32,), 'layer.mlstm_cell.outnorm.bias': (32,),
    'layer.proj_down.weight': (16, 32), 'layer.proj_down.bias': (16,)}
V1_BLOCK = {   # the same for v1: no biases except the conv's and the gates', causal conv1d
    'norm.weight': (16,), 'layer.learnable_skip': (32,), 'layer.proj_up.weight': (64, 16),
    'layer.q_proj.weight': (8, 4, 4), 'layer.k_proj.weight': (8, 4, 4),
    'layer.v_proj.weight': (8, 4, 4),
    'layer.conv1d.conv.weight': (32, 1, 4), 'layer.conv1d.conv.bias': (32,),
    'layer.mlstm_cell.igate.weight': (4, 96), 'layer.mlstm_cell.igate.bias': (4,),
    'layer.mlstm_cell.fgate.weight': (4, 96), 'layer.mlstm_cell.fgate.bias': (4,),
    'layer.mlstm_cell.outnorm.weight': (32,), 'layer.proj_down.weight': (16, 32)}
STEM = {'patch_embed.proj.weight': (16, 3, 16, 16), 'patch_embed.proj.bias': (16,),
        'pos_embed.embed': (1, 4, 6, 16)}


def _shapes(sd):
    return {k: tuple(v.shape) for k, v in sd.items()}


def test_v2_state_dict_keys_and_shapes():
    """The key set (in the official order) and shapes of VisionLSTM2(16, depth=2) at 64 x 96."""
    sd = official_state_dict('v2', 16, 2, (3, 64, 96), num_classes=7)
    want = dict(STEM)
    for i in range(2):
        for sub in ('rowwise_from_top_left', 'rowwise_from_bot_right'):
            want.update({f'blocks.{i}.{sub}.{k}': s for k, s in V2_BLOCK.items()})
    want.update({'norm.weight': (16,), 'norm.bias': (16,), 'legacy_norm.weight': (32,),
                 'legacy_norm.bias': (32,), 'head.weight': (7, 32), 'head.bias': (7,)})
    assert _shapes(sd) == want
    assert list(sd) == list(want)
    assert list(sd)[-6:] == ['norm.weight', 'norm.bias', 'legacy_norm.weight',
                             'legacy_norm.bias', 'head.weight', 'head.bias']
    assert sum(v.numel() for k, v in sd.items() if not k.startswith('head.')) == 26064


def test_v2_tiny_parameter_count():
    """ViL-T v2 (192 x 12 pairs, 1000 classes) at 224 x 224: 6.39 M parameters (the official
    module's count)."""
    sd = official_state_dict('v2', 192, 12, (3, 224, 224))
    assert sum(v.numel() for v in sd.values()) == 6391528


def test_v1_state_dict_keys_and_shapes():
    sd = official_state_dict('v1', 16, 3, (3, 64, 96), num_classes=5)
    want = dict(STEM)
    for i in range(3):
        want.update({f'blocks.{i}.{k}': s for k, s in V1_BLOCK.items()})
    want.update({'legacy_norm.weight': (16,), 'norm.weight': (16,), 'norm.bias': (16,),
                 'head.weight': (5, 16), 'head.bias': (5,)})
    assert _shapes(sd) == want
    assert list(sd) == list(want)


def test_state_dict_is_seeded_and_perturbed():
    a = official_state_dict('v2', 16, 1, (3, 32, 48), seed=3)
    b = official_state_dict('v2', 16, 1, (3, 32, 48), seed=3)
    c = official_state_dict('v2', 16, 1, (3, 32, 48), seed=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a['head.weight'], c['head.weight'])
    p = 'blocks.0.rowwise_from_top_left.layer.'
    for key in ('learnable_skip', 'mlstm_cell.igate.weight', 'mlstm_cell.fgate.bias',
                'mlstm_cell.outnorm.weight', 'mlstm_cell.outnorm.bias', 'proj_up.bias'):
        v = a[p + key]
        assert v.std() > 0.1 and (v != 0).all(), key     # away from the official init
    assert (a[p + 'learnable_skip'] - 1).abs().mean() > 0.1
    assert (a['legacy_norm.weight'] - 1).abs().max() < 1   # a plain LayerNorm weight, around 1


def test_state_dict_errors():
    with pytest.raises(ValueError, match="version must be 'v1' or 'v2'"):
        official_state_dict('v3', 16, 1, (3, 32, 32))
    with pytest.raises(ValueError, match='multiple of the patch size'):
        official_state_dict('v2', 16, 1, (3, 40, 32))


@pytest.mark.parametrize('version,depth', [('v2', 2), ('v1', 3)])
def test_forward_shapes_and_finite(version, depth):
    sd = official_state_dict(version, 16, depth, (3, 64, 96), num_classes=7)
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    out = official_forward(sd, x, version, 16, depth)
    assert len(out['blocks']) == depth
    assert all(b.shape == (2, 24, 16) for b in out['blocks'])
    assert out['tokens'].shape == (2, 24, 16)
    assert out['features'].shape == (2, 32 if version == 'v2' else 16)
    assert out['logits'].shape == (2, 7)
    for v in [*out['blocks'], out['tokens'], out['features'], out['logits']]:
        assert torch.isfinite(v).all() and v.dtype == torch.float32
    # samples are independent: the second image alone gives the second row
    alone = official_forward(sd, x[1:], version, 16, depth)
    torch.testing.assert_close(alone['logits'][0], out['logits'][1], rtol=1e-5, atol=1e-5)


def test_pooling_and_head():
    """v2 features = legacy_norm(concat(first, last normed token)); logits = head(features)."""
    sd = official_state_dict('v2', 16, 1, (3, 32, 48), num_classes=3)
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = official_forward(sd, x, 'v2', 16, 1)
    sdd = {k: v.double() for k, v in sd.items()}
    pooled = torch.cat([out['tokens'][:, 0], out['tokens'][:, -1]], 1)
    feats = F.layer_norm(pooled, (32,), sdd['legacy_norm.weight'], sdd['legacy_norm.bias'])
    torch.testing.assert_close(out['features'], feats)
    torch.testing.assert_close(out['logits'], F.linear(feats, sdd['head.weight'],
                                                       sdd['head.bias']))


def test_parallel_cell_matches_recurrence():
    g = torch.Generator().manual_seed(2)
    B, S, dh = 2, 9, 8
    q, k, v = (torch.randn(B, S, dh, generator=g, dtype=torch.float64) for _ in range(3))
    ig = 3 * torch.randn(B, S, generator=g, dtype=torch.float64)
    fg = 2 * torch.randn(B, S, generator=g, dtype=torch.float64)
    par = mlstm_parallel(q, k, v, ig, fg)
    torch.testing.assert_close(par, mlstm_recurrent(q, k, v, ig, fg), rtol=1e-12, atol=1e-12)
    # causal: token t only sees tokens <= t
    q2, v2 = q.clone(), v.clone()
    v2[:, 5:] += 1
    q2[:, 5:] += 1
    torch.testing.assert_close(mlstm_parallel(q2, k, v2, ig, fg)[:, :5], par[:, :5])
    # first token: m_0 = i_0, h_0 = v_0 c_0 / (max(|c_0|, e^{-m_0}) + eps), c_0 = q.k / sqrt(dh)
    c0 = (q[:, 0] * k[:, 0]).sum(-1) / math.sqrt(dh)
    want = v[:, 0] * (c0 / (torch.maximum(c0.abs(), torch.exp(-ig[:, 0])) + 1e-6))[:, None]
    torch.testing.assert_close(par[:, 0], want)


def test_whole_forward_with_recurrent_cell():
    sd = official_state_dict('v1', 16, 2, (3, 32, 48))
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    a = official_forward(sd, x, 'v1', 16, 2)
    b = official_forward(sd, x, 'v1', 16, 2, cell=mlstm_recurrent)
    torch.testing.assert_close(a['logits'], b['logits'], rtol=1e-10, atol=1e-10)


def _silence(sd, prefix):
    """Zero a (sub-)block's output projection: the block becomes the identity."""
    sd = dict(sd)
    for k in (prefix + 'layer.proj_down.weight', prefix + 'layer.proj_down.bias'):
        if k in sd:
            sd[k] = torch.zeros_like(sd[k])
    return sd


def _changed_tokens(sd, version, depth, block, patch):
    """Token indices of ``blocks[block]`` that change when image patch (row, col) changes."""
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    y = x.clone()
    r, c = patch
    y[:, :, 16 * r:16 * (r + 1), 16 * c:16 * (c + 1)] += 1
    a = official_forward(sd, x, version, 16, depth)['blocks'][block]
    b = official_forward(sd, y, version, 16, depth)['blocks'][block]
    return ((a - b).abs().amax(-1)[0] > 1e-12).nonzero()[:, 0].tolist()


def test_traversal_directions():
    """A sub-block from the top left reaches a token from earlier tokens only (plus, in v2, the
    3 x 3 conv's neighbours); one from the bottom right from later ones. Grid 4 x 6, 24 tokens."""
    sd = official_state_dict('v2', 16, 1, (3, 64, 96))
    top = _silence(sd, 'blocks.0.rowwise_from_bot_right.')
    # the last patch (token 23) reaches its conv neighbours 16, 17, 22, whose q, k, gates reach
    # every later token
    assert _changed_tokens(top, 'v2', 1, 0, (3, 5)) == list(range(16, 24))
    assert _changed_tokens(top, 'v2', 1, 0, (0, 0)) == list(range(24))
    bot = _silence(sd, 'blocks.0.rowwise_from_top_left.')
    assert _changed_tokens(bot, 'v2', 1, 0, (0, 0)) == list(range(8))
    assert _changed_tokens(bot, 'v2', 1, 0, (3, 5)) == list(range(24))
    # v1: causal conv1d; block 0 from the top left, block 1 from the bottom right
    sd = official_state_dict('v1', 16, 2, (3, 64, 96))
    assert _changed_tokens(sd, 'v1', 2, 0, (0, 3)) == list(range(3, 24))
    assert _changed_tokens(_silence(sd, 'blocks.0.'), 'v1', 2, 1, (0, 3)) == list(range(4))


def test_resized_position_embedding():
    """Another grid resizes the 2 x 3 position embedding bicubically (as the official load)."""
    sd = official_state_dict('v2', 16, 1, (3, 32, 48))
    x = torch.randn(1, 3, 48, 64, generator=torch.Generator().manual_seed(5))
    out = official_forward(sd, x, 'v2', 16, 1)
    assert out['blocks'][0].shape == (1, 12, 16)
    resized = F.interpolate(sd['pos_embed.embed'].permute(0, 3, 1, 2), size=(3, 4),
                            mode='bicubic').permute(0, 2, 3, 1)
    sd2 = dict(sd, **{'pos_embed.embed': resized})
    torch.testing.assert_close(official_forward(sd2, x, 'v2', 16, 1)['logits'], out['logits'])


def test_forward_dim_mismatch():
    sd = official_state_dict('v2', 16, 1, (3, 32, 48))
    with pytest.raises(ValueError, match='dim 8 does not match'):
        official_forward(sd, torch.zeros(1, 3, 32, 48), 'v2', 8, 1)
