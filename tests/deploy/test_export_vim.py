"""ONNX export of the Vim family and ViL: ONNX Runtime equals PyTorch fp32 (max relative error
<= 1e-4, features and class token) with and without each reducer, by plain
``torch.onnx.export`` and by :func:`amvim_mm.deploy.export_onnx`; the export route itself
(frozen switches, no environment read, constant index tensors); one-line errors."""
import warnings

import pytest
import torch

pytest.importorskip('onnxruntime')
pytest.importorskip('onnx')

import amvim_mm  # noqa: E402,F401
from amvim_mm import runtime  # noqa: E402
from amvim_mm.deploy import compare_onnx, export_mode, export_onnx  # noqa: E402
from amvim_mm.errors import ConfigError  # noqa: E402
from amvim_mm.registry import MODELS  # noqa: E402
from tests.deploy.matrix import FULL  # noqa: E402

TOL = 1e-4
SIZE = (64, 96)


def _build(typ, reduction=None, **kw):
    torch.manual_seed(0)
    cfg = dict(type=typ, arch='test', img_size=SIZE, token_reduction=reduction)
    cfg.update(kw)
    return MODELS.build(cfg).eval()


def _images(batch, seed=1):
    return torch.randn(batch, 3, *SIZE, generator=torch.Generator().manual_seed(seed))


def _assert_close(model, path, batch=3):
    errs = compare_onnx(model, str(path), _images(batch), threads=1)
    assert errs and all(e['max_rel_err'] <= TOL for e in errs.values()), errs
    return errs


@pytest.mark.parametrize('family', ['Vim', 'AMVim'])
def test_plain_torchscript_export_tome(tmp_path, family):
    """The issue's acceptance check, what a user tries first: plain torch.onnx.export (the
    TorchScript exporter; its failure was a file ONNX Runtime refused) of Vim / AMVim with ToMe
    0.27, the batch of the export run at another batch."""
    m = _build(family, REDUCERS['ToMe'])
    f = tmp_path / 'm.onnx'
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(m, (_images(2), ), str(f), dynamo=False, opset_version=17,
                          input_names=['input'], dynamic_axes={'input': {0: 'batch'}})
    errs = _assert_close(m, f, batch=3)
    assert [e['shape'] for e in errs.values()] == [(3, 32)]


def test_exporting_freezes_switches(monkeypatch):
    """Inside an export the switches are the export's, without reading the environment."""
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'reference')
    assert runtime.settings().scan_backend == 'reference'
    with export_mode() as s:
        assert runtime.exporting()
        assert s.scan_backend == 'torch' and s.fused_mixer is False and not s.cuda_graph
        monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'nonsense')   # never parsed in the block
        with runtime.pinned() as p:
            assert p.scan_backend == 'torch' and runtime.settings() is p
    assert not runtime.exporting()
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'torch')
    assert runtime.settings().scan_backend == 'torch'


def test_export_onnx_errors(tmp_path):
    m = _build('Vim')
    with pytest.raises(ConfigError, match='opset must be an int >= 17'):
        export_onnx(m, tmp_path / 'a.onnx', _images(1), opset=13)
    with pytest.raises(ConfigError, match='expected 3 input channels'):
        export_onnx(m, tmp_path / 'a.onnx', torch.randn(1, 4, *SIZE))
    with pytest.raises(ConfigError, match='inputs must be a tensor'):
        export_onnx(m, tmp_path / 'a.onnx', [1, 2])
    assert not list(tmp_path.iterdir())      # nothing written on an error


def test_a_fixed_batch_where_a_dynamic_one_was_asked_is_an_error(tmp_path, monkeypatch):
    """Issue 52: ``--dynamo`` with the dynamic deploy config wrote a graph with a fixed batch
    of 1 without a word (torch.export fixes an example dimension of size 1). An export whose
    graph has a fixed batch although a dynamic one was asked for now stops in one line, and
    nothing is written."""
    m = _build('Vim')
    real = torch.onnx.export

    def fixing_batch(*args, **kwargs):        # an exporter that drops the dynamic batch
        kwargs.pop('dynamic_axes', None)
        return real(*args, **kwargs)
    monkeypatch.setattr(torch.onnx, 'export', fixing_batch)
    with pytest.raises(ConfigError, match="fixed the batch of input 'input' at 1") as err:
        export_onnx(m, tmp_path / 'a.onnx', _images(1), input_names=('input', ))
    assert '\n' not in str(err.value) and not list(tmp_path.glob('*.onnx'))


#: the reducers at the issue's ratios (ToMe 0.27, random with a fixed seed, ToP aligned)
REDUCERS = {
    'ToMe': dict(type='ToMe', ratio=0.27),
    'RandomPrune': dict(type='RandomPrune', ratio=0.27, seed=0),
    'EViT': dict(type='EViT', keep_rate=0.7, locations=(1, )),
    'ToP': dict(type='ToP', keep_rate=0.7, locations=(1, ), align=True),
    'DynamicViT': dict(type='DynamicViT', keep_rate=0.7, locations=(1, )),
}
#: family x reducer pairs through export_onnx: by default ToP's alignment (AMVim), ViL with
#: the learned reducer, AMViL with ToMe (ToMe on Vim / AMVim: the plain-export test; random
#: pruning and EViT: tests/deploy/test_export_vsp.py); the rest with AMVIM_EXPORT_FULL=1
CASES = [('AMVim', 'ToP'), ('ViL', 'DynamicViT'), ('AMViL', 'ToMe'),
         pytest.param('Vim', None, marks=FULL), pytest.param('Vim', 'ToMe', marks=FULL),
         pytest.param('AMVim', 'RandomPrune', marks=FULL),
         pytest.param('LocalVim', 'EViT', marks=FULL), pytest.param('Vim', 'EViT', marks=FULL)]


@pytest.mark.parametrize('family,reducer', CASES)
def test_export_onnx_family_reducer(tmp_path, family, reducer):
    """export_onnx (TorchScript exporter, dynamic batch: exported at 2, run at 3) of featmaps
    of two blocks; a reducer really removes tokens in the exported forward."""
    m = _build(family, REDUCERS.get(reducer), out_type='featmap', out_indices=(1, 3))
    with torch.no_grad():
        m(_images(2))
    full = (SIZE[0] // 16) * (SIZE[1] // 16)
    assert (min(m.token_counts) < full) == (reducer is not None), m.token_counts
    path = export_onnx(m, tmp_path / 'm.onnx', _images(2))
    errs = _assert_close(m, path, batch=3)
    assert [(e['shape'][0], e['shape'][2:]) for e in errs.values()] == [(3, (4, 6))] * 2


@FULL
@pytest.mark.parametrize('family', ['Vim', 'AMVim'])
def test_plain_dynamo_export_tome(tmp_path, family):
    """The issue's acceptance check with the torch.export-based exporter (it stopped in
    torch.export at the environment read, then at fake index tensors): plain
    torch.onnx.export(dynamo=True) of ToMe 0.27, dynamic batch."""
    m = _build(family, REDUCERS['ToMe'])
    f = tmp_path / 'm.onnx'
    batch = torch.export.Dim('batch', min=1, max=64)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(m, (_images(2), ), str(f), dynamo=True, opset_version=18,
                          dynamic_shapes=({0: batch}, ))
    _assert_close(m, f, batch=3)


class _Cell(torch.nn.Module):
    def forward(self, q, k, v, i, f):
        from amvim_mm.ops.mlstm import mlstm
        return mlstm(q, k, v, i, f, chunk=16)


def test_mlstm_chunkwise_exports(tmp_path):
    """ViL's cell beyond PARALLEL_MAX_LEN steps (ViL-T at 224) is the chunkwise form: its
    chunk count must stay a ceil division in the graph (traced, -(-S // T) became a truncating
    ONNX Div: one chunk too few, ONNX Runtime's Gather out of bounds)."""
    from amvim_mm.ops.mlstm import mlstm_parallel
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(2, 2, 37, 8, generator=g) for _ in range(3)]
    x += [torch.randn(2, 2, 37, 1, generator=g) + 2 for _ in range(2)]
    path = export_onnx(_Cell(), tmp_path / 'cell.onnx', tuple(x),
                       input_names=('q', 'k', 'v', 'i', 'f'))
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    out = sess.run(None, {n: t.numpy() for n, t in zip('qkvif', x, strict=True)})[0]
    ref = mlstm_parallel(*x)
    assert float((torch.from_numpy(out) - ref).abs().max() / ref.abs().max()) <= TOL
