"""ViL / AMViL ``tap``: ``'stream'`` (default) is the block's output as before; ``'mixer'`` is
the block's branch before the residual add (v2: the pair's second sub-block), with and without a
token reducer, checked against hooks on the blocks and against ``output - input`` of the last
residual add."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction import restore_grid
from amvim_mm.registry import MODELS

SIZE = (64, 96)      # a 4 x 6 patch grid
V1_TEST = dict(version=1, embed_dims=32, num_layers=4)
ARCHS = {'v2': 'test', 'v1': V1_TEST}
REDUCERS = {'none': None, 'tome': dict(type='ToMe', ratio=0.27)}


def _build(typ, version, reducer, **kw):
    torch.manual_seed(0)
    return MODELS.build(dict(type=typ, arch=ARCHS[version], img_size=SIZE, out_type='featmap',
                             out_indices=(0, 1, 2, 3), token_reduction=reducer, **kw)).eval()


def _last(m, block):
    return block if m.version == 1 else block.rowwise_from_bot_right


def _as_map(ctx, tokens):
    """(B, L, D) tokens of a block with its context -> the (B, D, h, w) map block_output forms."""
    full = restore_grid(ctx, tokens) if ctx.reduced else tokens
    B, _, D = full.shape
    return full.transpose(1, 2).reshape(B, D, *ctx.grid)


def _record(m, images):
    """Outputs of ``m`` and, per block, what hooks see: its context, its output, the input of
    its last residual add (the last traversal's norm input) and its last layer's output."""
    seen = [dict() for _ in m.blocks]
    handles = []
    for i, block in enumerate(m.blocks):
        last = _last(m, block)
        handles += [
            block.register_forward_hook(
                lambda mod, args, out, s=seen[i]: s.update(ctx=args[1], out=out)),
            last.norm.register_forward_hook(
                lambda mod, args, out, s=seen[i]: s.update(into=args[0])),
            last.layer.register_forward_hook(
                lambda mod, args, out, s=seen[i]: s.update(branch=out[0])),
        ]
    try:
        with torch.no_grad():
            outs = m(images)
    finally:
        for h in handles:
            h.remove()
    return outs, seen


@pytest.fixture(scope='module')
def images():
    return torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize('reducer', sorted(REDUCERS))
@pytest.mark.parametrize('version', sorted(ARCHS))
@pytest.mark.parametrize('typ', ['ViL', 'AMViL'])
def test_stream_is_todays_output_and_mixer_the_branch(typ, version, reducer, images):
    today = _build(typ, version, REDUCERS[reducer])
    stream = _build(typ, version, REDUCERS[reducer], tap='stream')
    mixer = _build(typ, version, REDUCERS[reducer], tap='mixer')
    assert today.tap == 'stream'
    stream.load_state_dict(today.state_dict())
    mixer.load_state_dict(today.state_dict())
    with torch.no_grad():
        base = today(images)
    got_stream, seen_stream = _record(stream, images)
    got_mixer, seen_mixer = _record(mixer, images)
    if reducer != 'none':
        assert today.token_counts[-1] < SIZE[0] * SIZE[1] // 256   # ToMe really merged
        assert mixer.token_counts == stream.token_counts == today.token_counts
    for i in range(4):
        # 'stream': exactly the output of today's code, which is the block's output
        assert torch.equal(got_stream[i], base[i])
        torch.testing.assert_close(got_stream[i], _as_map(seen_stream[i]['ctx'],
                                                          seen_stream[i]['out']),
                                   rtol=0, atol=0)
        # 'mixer': the branch of the block's last residual add, before the add
        s = seen_mixer[i]
        torch.testing.assert_close(got_mixer[i], _as_map(s['ctx'], s['branch']), rtol=0, atol=0)
        torch.testing.assert_close(got_mixer[i], _as_map(s['ctx'], s['out'] - s['into']),
                                   rtol=1e-4, atol=1e-5)
        assert not torch.allclose(got_mixer[i], got_stream[i], atol=1e-3)
    # the stream itself is untouched by the tap, and no tensor stays on the module
    torch.testing.assert_close(seen_mixer[-1]['out'], seen_stream[-1]['out'], rtol=0, atol=0)
    assert mixer._branch is None


def test_mixer_in_the_masked_training_forward(images):
    """A learned reducer's masked forward: kept tokens get the branch, dropped ones keep their
    stream (what the pruned inference's frozen cell gives)."""
    m = _build('ViL', 'v1', None, tap='mixer')
    x, ctx = m.embed(images, False)
    keep = torch.ones(2, x.shape[1], dtype=torch.bool)
    keep[:, 5:9] = False
    with torch.no_grad():
        out, _ = m.call_block_masked(m.blocks[0], x, None, ctx, keep)
        feat = m.block_output(0, out, None, ctx, keep)
        y, _ = m.blocks[0].layer(m.blocks[0].norm(x), ctx, m.blocks[0].path, False, keep)
    want = torch.where(keep.unsqueeze(-1), y, x)
    torch.testing.assert_close(feat, _as_map(ctx, want), rtol=0, atol=0)
    assert m._branch is None


@pytest.mark.parametrize('bad,what', [
    (dict(tap='residual'), "tap must be one of \\('stream', 'mixer'\\), got 'residual'"),
    (dict(tap=None), 'got None'),
    (dict(tap='mixer', out_type='pooled', out_indices=-1), "needs out_type='featmap'"),
    (dict(layer_depth_per_pair=1), 'layer_depth_per_pair must be a bool'),
])
def test_tap_is_validated(bad, what):
    kw = dict(type='ViL', arch='test', out_type='featmap')
    kw.update(bad)
    with pytest.raises(ConfigError, match=what):
        MODELS.build(kw)
    with pytest.raises(ConfigError, match=what):
        MODELS.build(dict(kw, type='AMViL'))
