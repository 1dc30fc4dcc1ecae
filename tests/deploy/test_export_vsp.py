"""ONNX export of VMamba (SS2D) and PlainMamba, unreduced and with every reducer they take
(issue 39): ONNX Runtime (CPU) equals PyTorch fp32 to 1e-4 relative at 64 x 96, the batch
dimension symbolic (exported at batch 1, run at batch 2); the reduction steps are in the graph
(the reduced model's outputs differ from the unreduced ones, ONNX Runtime follows the reduced
one). Also the export-friendly lookups of PlainMamba's aligned scan against the binary searches
they replace."""
import pytest
import torch

pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')

from amvim_mm.deploy import compare_onnx, export_onnx, ort_session  # noqa: E402
from amvim_mm.ops.cross_scan import (cross_merge_grid, cross_merge_ref,  # noqa: E402
                                     cross_scan_grid, cross_scan_ref)
from amvim_mm.ops.plain_aligned import (_gap_slots, _gap_slots_table,  # noqa: E402
                                        step_lookup)
from amvim_mm.registry import MODELS  # noqa: E402
from tests.deploy.matrix import FULL  # noqa: E402

TOL = 1e-4
#: the schedules of tests/models/test_contract.py (VMamba reduces inside stage 2, whose 'test'
#: depth is 2: location 0; PlainMamba over its layers: location 1)
VMAMBA = dict(type='VMamba', arch='test', reduction_stage=2, img_size=(64, 96))
PLAIN = dict(type='PlainMamba', arch='test', img_size=(64, 96), out_indices=(1, 3))


def _reducer(name, loc):
    return dict(none=None, ToMe=dict(type='ToMe', ratio=0.27),
                RandomPrune=dict(type='RandomPrune', ratio=0.27, seed=0),
                EViT=dict(type='EViT', keep_rate=0.7, locations=(loc, )),
                ToP=dict(type='ToP', keep_rate=0.7, locations=(loc, )),
                DynamicViT=dict(type='DynamicViT', keep_rate=0.7, locations=(loc, )))[name]


#: every reducer once in the quick set (the blocks before the reducer's location run the
#: unreduced route in each); the other pairs of the matrix with AMVIM_EXPORT_FULL=1
QUICK = [('VMamba', 'ToMe'), ('VMamba', 'ToP'), ('VMamba', 'DynamicViT'),
         ('PlainMamba', 'EViT'), ('PlainMamba', 'RandomPrune'), ('PlainMamba', 'ToP')]
CASES = [pytest.param(fam, red, id=f'{fam}-{red}',
                      marks=() if (fam, red) in QUICK else FULL)
         for fam in ('VMamba', 'PlainMamba')
         for red in ('none', 'ToMe', 'RandomPrune', 'EViT', 'ToP', 'DynamicViT')]
pytestmark = pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')


def _build(family, red):
    torch.manual_seed(0)
    cfg = dict(VMAMBA if family == 'VMamba' else PLAIN)
    return MODELS.build(dict(cfg, token_reduction=_reducer(red, 0 if family == 'VMamba'
                                                            else 1))).eval()


def _images(batch, seed):
    return torch.randn(batch, 3, 64, 96, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize('family,red', CASES)
def test_onnx_runtime_equals_pytorch(family, red, tmp_path):
    model = _build(family, red)
    path = export_onnx(model, tmp_path / 'm.onnx', _images(1, 1))
    session = ort_session(str(path))
    x = _images(2, 2)
    res = compare_onnx(model, str(path), x, session=session)
    assert len(res) == (4 if family == 'VMamba' else 2)
    for name, r in res.items():
        assert r['max_rel_err'] <= TOL, (name, r)
    if red != 'none':   # the reduction is in the graph: ONNX follows the reduced model
        with torch.no_grad():
            ref = _build(family, 'none')(x)[-1]
        got = torch.from_numpy(session.run(None, {'input': x.numpy()})[-1])
        assert (got - ref).abs().max() > 1e-2 * ref.abs().max()
        assert model.token_counts[-1] < model.token_counts[0]


def _survivors(B, M, L, g):
    return torch.stack([torch.randperm(M, generator=g)[:L].sort().values for _ in range(B)])


@pytest.mark.parametrize('M,L', [(24, 24), (24, 17), (35, 9)])
def test_plain_aligned_tables_equal_the_searches(M, L):
    """The survivor lookup and the gap slots from scatter tables (the export route: ONNX has
    no search op) give the binary searches' integers (``idx`` where a survivor is)."""
    g = torch.Generator().manual_seed(M + L)
    B, K = 3, 4
    pos = _survivors(B, M, L, g)
    steps = torch.stack([_survivors(B, M, L, g) for _ in range(K)], 1)    # (B, K, L)
    idx, here = step_lookup(pos, steps)
    idx_t, here_t = step_lookup(pos, steps, M)
    assert torch.equal(here, here_t) and torch.equal(idx[here], idx_t[here])
    assert torch.equal(_gap_slots(steps, pos), _gap_slots_table(steps, pos, M))


@pytest.mark.parametrize('H,W', [(3, 5), (4, 4)])
def test_cross_scan_grid_route_equals_the_gathers(H, W):
    """The export route of the full grid's cross-scan / cross-merge (transposes and flips)
    against the index gathers."""
    x = torch.randn(2, H * W, 6, generator=torch.Generator().manual_seed(H * W))
    assert torch.equal(cross_scan_grid(x, H, W), cross_scan_ref(x, H, W))
    ys = torch.randn(2, 4, 6, H * W, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(cross_merge_grid(ys, H, W), cross_merge_ref(ys, H, W),
                               rtol=1e-6, atol=1e-6)
