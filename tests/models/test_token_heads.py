"""Segmenter's heads on the kept tokens (issue 54): the backbone's ``out_type='tokens'``
restores to its ``featmap`` exactly; the linear head on the carriers equals it on the restored
grid exactly; the mask transformer's proportional attention equals the dense head on the
restored grid (where a merged token appears once per cell) to rounding; without a reduction
both are mmseg's heads; an mmseg segmentor runs them end to end."""
import pytest
import torch

import amvim_mm  # noqa: F401  (registers the models)
from amvim_mm.models.heads import TokenGrid, proportional_attention_bias
from amvim_mm.registry import MODELS

REDUCERS = {'none': None, 'tome': dict(type='ToMe', ratio=0.3),
            'evit': dict(type='EViT', keep_rate=0.7, locations=(1, )),
            'random': dict(type='RandomPrune', ratio=0.3)}
NUM_CLASSES = 5


def _backbones(red, family='Vim'):
    """A test backbone with ``out_type='tokens'`` and the same weights as ``featmap``."""
    torch.manual_seed(0)
    cfg = dict(type=family, arch='test', img_size=64, out_indices=(-1, ), token_reduction=red)
    tok = MODELS.build(dict(cfg, out_type='tokens')).eval()
    feat = MODELS.build(dict(cfg, out_type='featmap')).eval()
    feat.load_state_dict(tok.state_dict())
    return tok, feat


def _to_map(grid: TokenGrid) -> torch.Tensor:
    d = grid.dense()
    B, M, D = d.tokens.shape
    return d.tokens.transpose(1, 2).reshape(B, D, *grid.grid)


@pytest.mark.parametrize('family', ['Vim', 'AMVim', 'ViL'])
@pytest.mark.parametrize('name', list(REDUCERS))
def test_tokens_restore_to_the_featmap_exactly(name, family):
    tok, feat = _backbones(REDUCERS[name], family)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        grid, ref = tok(x)[-1], feat(x)[-1]
    assert isinstance(grid, TokenGrid) and grid.grid == (4, 4) == tuple(ref.shape[-2:])
    assert torch.equal(_to_map(grid), ref)
    assert torch.equal(grid.size.sum(1), torch.full((2, ), 16.))   # every cell carried once
    if name != 'none':
        assert grid.tokens.shape[1] < 16 + 1 + (name == 'evit') + (name != 'tome') * 16


def _heads(kind):
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS as SEG
    common = dict(in_channels=32, channels=32, num_classes=NUM_CLASSES, dropout_ratio=0.0)
    extra = dict(num_layers=2, num_heads=4, embed_dims=32)
    with DefaultScope.overwrite_default_scope('mmseg'):
        if kind == 'linear':
            ours = SEG.build(dict(type='TokenFCNHead', **common))
            ref = SEG.build(dict(type='FCNHead', num_convs=0, concat_input=False, **common))
        else:
            ours = SEG.build(dict(type='TokenMaskTransformerHead', **common, **extra))
            ref = SEG.build(dict(type='SegmenterMaskTransformerHead', **common, **extra))
    ours.init_weights()
    ref.load_state_dict(ours.state_dict())
    return ours.eval(), ref.eval()


@pytest.mark.parametrize('kind', ['linear', 'mask'])
@pytest.mark.parametrize('name', list(REDUCERS))
def test_heads_on_tokens_equal_the_heads_on_the_restored_grid(kind, name):
    pytest.importorskip('mmseg')
    tok, _ = _backbones(REDUCERS[name])
    ours, ref = _heads(kind)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        grid = tok(x)[-1]
        got = ours([grid])
        on_dense = ours([grid.dense()])
        mmseg = ref([_to_map(grid)])
    assert got.shape == (2, NUM_CLASSES, 4, 4)
    if kind == 'linear':
        assert torch.equal(got, on_dense)        # the same linear map at every cell
    else:
        torch.testing.assert_close(got, on_dense, rtol=0, atol=2e-5)
    torch.testing.assert_close(on_dense, mmseg, rtol=0, atol=2e-5)   # mmseg's own head


def test_proportional_attention_equals_duplicated_tokens():
    """The rule on its own: attention over carriers with sizes s equals attention over the
    tokens repeated s times (size 0: not a key)."""
    g = torch.Generator().manual_seed(3)
    attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 4, 8, generator=g)
    size = torch.tensor([[3., 1., 0., 2.]])
    extra = torch.randn(1, 2, 8, generator=g)
    h = torch.cat([x, extra], 1)
    with torch.no_grad():
        got = attn(h, h, h, key_padding_mask=proportional_attention_bias(size, 2))[0]
        dup = torch.cat([x[:, [0, 0, 0, 1, 3, 3]], extra], 1)
        want = attn(dup, dup, dup)[0]
    torch.testing.assert_close(got[:, [0, 1, 3, 4, 5]], want[:, [0, 3, 4, 6, 7]],
                               rtol=0, atol=1e-6)


def test_a_segmentor_with_the_token_head_runs_and_trains():
    """mmseg's EncoderDecoder with the tokens backbone and the mask-transformer head: its
    prediction equals the featmap backbone + mmseg's head (same weights) without a reduction,
    and a training step's loss has gradients in the backbone and the head."""
    pytest.importorskip('mmseg')
    from mmengine.config import ConfigDict
    from mmengine.registry import DefaultScope
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS as SEG
    from mmseg.structures import SegDataSample

    def segmentor(out_type, head, red=None):
        torch.manual_seed(0)
        with DefaultScope.overwrite_default_scope('mmseg'):
            return SEG.build(dict(
                type='EncoderDecoder',
                data_preprocessor=dict(type='SegDataPreProcessor', mean=[127.5] * 3,
                                       std=[127.5] * 3, size=(64, 64)),
                backbone=dict(type='Vim', arch='test', img_size=64, out_indices=(-1, ),
                              out_type=out_type, token_reduction=red),
                decode_head=dict(type=head, in_channels=32, channels=32,
                                 num_classes=NUM_CLASSES, num_layers=1, num_heads=4,
                                 embed_dims=32, dropout_ratio=0.0),
                test_cfg=ConfigDict(mode='whole')))
    ours = segmentor('tokens', 'TokenMaskTransformerHead').eval()
    ref = segmentor('featmap', 'SegmenterMaskTransformerHead').eval()
    ref.load_state_dict(ours.state_dict())
    img = torch.randint(0, 255, (2, 3, 64, 64), generator=torch.Generator().manual_seed(4))
    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64),
                                        pad_shape=(64, 64)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, NUM_CLASSES, (1, 64, 64)))
        samples.append(s)
    data = dict(inputs=list(img.float()), data_samples=samples)
    with torch.no_grad():
        a = ours.test_step(data)
        b = ref.test_step(data)
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p.seg_logits.data, q.seg_logits.data, rtol=0, atol=1e-4)
    reduced = segmentor('tokens', 'TokenMaskTransformerHead',
                        dict(type='ToMe', ratio=0.3)).train()
    batch = reduced.data_preprocessor(data, True)
    losses = reduced.loss(batch['inputs'], batch['data_samples'])
    sum(v for k, v in losses.items() if 'loss' in k).backward()
    assert reduced.backbone.layers[0].mixer.in_proj.weight.grad.abs().sum() > 0
    assert reduced.decode_head.cls_emb.grad.abs().sum() > 0


def test_a_dense_neck_given_tokens_names_the_fix():
    """``out_type='tokens'`` into UperNet's pyramid neck: one line naming the heads it feeds,
    not a type error deep in a torch op."""
    pytest.importorskip('mmseg')
    from amvim_mm.errors import ConfigError
    tok, _ = _backbones(None)
    with torch.no_grad():
        grid = tok(torch.randn(1, 3, 64, 64))[-1]
    with pytest.raises(ConfigError, match="out_type='tokens' feeds TokenFCNHead"):
        torch.nn.functional.interpolate(grid, scale_factor=2)


def test_token_outputs_in_cuda_graphs():
    """A captured forward's outputs are cloned field by field (a TokenGrid too); a token
    output after a pruning step is capturable too: its pruned carriers' count is the static
    bound M - n_patches (no host sync), exact for pruning alone, with size-0 padding after
    merges."""
    from amvim_mm.models.skeleton.graphs import _clone
    tok, _ = _backbones(REDUCERS['evit'])
    with torch.no_grad():
        grid = tok(torch.randn(1, 3, 64, 64))[-1]
    copy = _clone((grid, ))[0]
    assert isinstance(copy, TokenGrid) and copy.grid == grid.grid
    assert torch.equal(copy.tokens, grid.tokens) and copy.tokens is not grid.tokens
    x = torch.randn(2, 3, 64, 64)
    top = dict(type='ToP', keep_rate=0.7, locations=(1, ))
    for red in (REDUCERS['evit'], top, REDUCERS['tome']):
        net, _ = _backbones(red)
        assert net.graph_misfit() is None, red      # nothing family-specific keeps it eager
        with torch.no_grad():
            out = net(x)[-1]
        M = out.grid[0] * out.grid[1]
        assert torch.equal(out.size.sum(1), torch.full((2, ), float(M)))   # each cell once
        if red is top:      # pruning alone: the bound is exact, no size-0 padding carrier
            # (the one size-0 carrier is the middle class token)
            assert out.tokens.shape[1] == M + 1 and (out.size == 0).sum(1).tolist() == [1, 1]
