"""PlainMamba equals the official model: our backbone against an independent re-statement of
the official forward (``tests/reference/official_plainmamba.py``, itself checked against the
official code run on CPU with stand-ins for its mmcv/mmcls helpers, to <= 7.5e-6 fp32 and
6.5e-9 fp64), on released-format checkpoints with random weights."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.registry import MODELS
from tests.reference import official_plainmamba as ref

ARCHS = {'l1': 'L1', 'l2': 'L2', 'l3': 'L3'}
# a wider step-size range than the official init, so that the scan matters for the outputs
DT_RANGE = (0.05, 1.0)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope='module')
def released_files(tmp_path_factory):
    """``{'state_dict': {'backbone.' + k: v}}`` of plain tensors (the contract's file: the
    released ``l*.pth`` without its head, BN statistics included, no ``norm_layer{i}``)."""
    root = tmp_path_factory.mktemp('plainmamba')
    files = {}
    for ours, theirs in ARCHS.items():
        sd = ref.random_official_state_dict(theirs, seed=0, with_head=True, num_classes=1000,
                                            dt_range=DT_RANGE)
        path = root / f'{ours}.pth'
        torch.save(dict(state_dict={('' if k.startswith('head.') else 'backbone.') + k: v
                                    for k, v in sd.items()}), path)
        files[ours] = (str(path), sd)
    return files


def _contract_model(arch, path, **kw):
    m = MODELS.build(dict(type='PlainMamba', arch=arch,
                          out_indices=kw.pop('out_indices', ref.OUT_INDICES[ARCHS[arch]]),
                          init_cfg=dict(type='Pretrained', checkpoint=path), **kw))
    m.init_weights()
    return m.eval()


CASES = [('l1', (64, 96)), ('l1', (224, 224)), ('l2', (64, 96)), ('l3', (64, 96))]


@pytest.mark.parametrize('arch,size', CASES, ids=[f'{a}-{h}x{w}' for a, (h, w) in CASES])
def test_dense_maps_and_logits_equal_the_official_model(arch, size, released_files):
    path, sd = released_files[arch]
    torch.manual_seed(1)
    x = torch.randn(2, 3, *size)
    dense = _contract_model(arch, path)
    cls = _contract_model(arch, path, out_indices=-1, out_type='avg_featmap')
    want = ref.official_plainmamba_forward(sd, x, ARCHS[arch],
                                           out_indices=ref.OUT_INDICES[ARCHS[arch]])
    with torch.no_grad():
        maps = dense(x)
        logits = torch.nn.functional.linear(cls(x)[0], sd['head.fc.weight'], sd['head.fc.bias'])
    assert isinstance(maps, tuple) and len(maps) == 4
    for i, (a, b) in enumerate(zip(maps, want['dense'], strict=True)):
        assert a.shape == b.shape, i
        assert _rel(a, b) < 1e-5, (i, _rel(a, b))
    assert _rel(logits, want['logits']) < 1e-5


def test_float64_equality_keeps_both_quirks(released_files):
    """In float64 the match is to rounding (1e-9): the twice-applied step bias, raster-order
    step sizes / B / C with the permuted input, and the direction biases are all there."""
    path, sd = released_files['l1']
    m = _contract_model('l1', path).double()
    x = torch.randn(1, 3, 64, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want = ref.official_plainmamba_forward(sd, x, 'L1', out_indices=ref.OUT_INDICES['L1'])
    with torch.no_grad():
        maps = m(x)
    for a, b in zip(maps, want['dense'], strict=True):
        assert _rel(a, b) < 1e-9
    # zeroed direction biases change the result: the comparison can fail
    with torch.no_grad():
        for layer in m.layers:
            layer.mamba.direction_Bs.zero_()
        assert _rel(m(x)[-1], want['dense'][-1]) > 1e-3


def test_contract_shapes_and_norms(released_files):
    path, sd = released_files['l1']
    m = _contract_model('l1', path)
    with torch.no_grad():
        out = m(torch.randn(2, 3, 64, 96))
    assert [tuple(o.shape) for o in out] == [(2, 192, 4, 6)] * 4
    assert torch.equal(m.ln1.weight, sd['ln1.weight'])
    assert torch.equal(m.norm_layer5.weight, torch.ones(192))
