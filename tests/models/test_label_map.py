"""Label maps without the resized logits (issue 50): the labels of mmseg's ``postprocess_result``,
bit for bit, chunk by chunk; the ``LabelMapEncoderDecoder`` type and ``use_label_map``."""
import copy
import importlib
import os
import os.path as osp
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from mmseg.models.segmentors.base import BaseSegmentor
from mmseg.models.utils import resize
from mmseg.structures import SegDataSample

import amvim_mm  # noqa: F401  (registers the types)
from amvim_mm.errors import ConfigError
from amvim_mm.models.segmentors import (chunk_bounds, label_map, label_map_postprocess,
                                        restore_postprocess, segmentor_class, use_label_map,
                                        uses_label_map)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')
LABEL_MAP_MODULE = importlib.import_module('amvim_mm.models.segmentors.label_map')
LABEL_MAP_SEGMENTOR = importlib.import_module('amvim_mm.models.segmentors.label_map_segmentor')
NAN, INF = float('nan'), float('inf')

#: (input h, w) -> (output H, W): non-integer up, integer up, down, mixed, up with H + W > 128
SIZES = [((37, 53), (97, 131)), ((16, 16), (64, 64)), ((64, 80), (33, 47)),
         ((20, 90), (75, 40)), ((9, 7), (150, 170))]


def _reference(logits, size, align_corners):
    """mmseg's labels: the whole resize (mmseg's ``resize``), then argmax over the classes."""
    return resize(logits[None], size=size, mode='bilinear', align_corners=align_corners,
                  warning=False).squeeze(0).argmax(dim=0, keepdim=True)


def _calls(monkeypatch):
    """Records the channel count of every ``F.interpolate`` call ``label_map`` makes."""
    seen = []

    def spy(x, *args, **kwargs):
        seen.append(x.shape[1])
        return F.interpolate(x, *args, **kwargs)
    monkeypatch.setattr(LABEL_MAP_MODULE, 'F', SimpleNamespace(interpolate=spy))
    return seen


def _assert_same(logits, size, align_corners, chunks=(1, 2, 3, 5, 8, 16, 1000)):
    ref = _reference(logits, size, align_corners)
    for chunk in chunks:
        got = label_map(logits, size, align_corners, chunk=chunk)
        assert got.dtype == ref.dtype == torch.int64 and got.shape == ref.shape
        assert torch.equal(got, ref), f'chunk {chunk}: {(got != ref).sum().item()} labels differ'
    return ref


# ---------------------------------------------------------------------- the pure function


@pytest.mark.parametrize('align_corners', [False, True])
@pytest.mark.parametrize('in_hw,out_hw', SIZES)
@pytest.mark.parametrize('classes', [2, 7, 19])
def test_random_logits(classes, in_hw, out_hw, align_corners):
    torch.manual_seed(classes)
    _assert_same(torch.randn(classes, *in_hw), out_hw, align_corners)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes(dtype):
    """bf16 rounds coarsely: many ties after the resize."""
    torch.manual_seed(0)
    _assert_same(torch.randn(23, 21, 30).to(dtype), (97, 131), False)


def test_the_chunked_path_runs(monkeypatch):
    """The comparisons above exercise the chunks: one interpolate call per chunk, none of
    exactly 3 channels (the CPU kernel takes another path for 3)."""
    seen = _calls(monkeypatch)
    label_map(torch.randn(19, 20, 20), (97, 131), False, chunk=8)
    assert seen == [8, 8, 2, 1]
    for C in range(1, 40):
        for chunk in range(1, 12):
            bounds = chunk_bounds(C, chunk)
            assert [b for _, b in bounds[:-1]] == [a for a, _ in bounds[1:]]
            assert bounds[0][0] == 0 and bounds[-1][1] == C
            assert all(0 < b - a <= chunk and b - a != 3 for a, b in bounds)


def _tied_logits(classes=40, hw=(24, 31), seed=0):
    """Logits with exact ties at most pixels: zeros and ones (equal neighbourhoods give equal
    interpolated values), with some channels copies of others across chunk boundaries."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 2, (classes, *hw), generator=g).float()
    for src, dst in [(0, 39), (7, 8), (15, 16), (3, 31), (12, 13)]:
        x[dst] = x[src]
    return x


@pytest.mark.parametrize('align_corners', [False, True])
def test_ties_go_to_the_lowest_class(align_corners):
    x = _tied_logits()
    ref = _assert_same(x, (97, 131), align_corners, chunks=(1, 2, 4, 8, 16, 39))
    resized = resize(x[None], size=(97, 131), mode='bilinear', align_corners=align_corners,
                     warning=False)[0]
    at_max = resized == resized.max(0, keepdim=True).values
    assert (at_max.sum(0) > 1).float().mean() > 0.5          # ties at most pixels
    # ... and across chunk boundaries: a later chunk holds the maximum as well
    later = at_max[8:].any(0) & (ref[0] < 8)
    assert later.sum() > 1000


def test_constant_maps_give_class_0():
    for value in (0.0, -3.5, 7.25, INF, -INF):
        x = torch.full((37, 20, 25), value)
        ref = _assert_same(x, (97, 131), False)
        assert (ref == 0).all()


def test_signed_zeros_tie():
    """-0.0 == 0.0: the lower class wins whichever sign it has."""
    x = torch.zeros(20, 12, 12)
    x[:10] = -0.0
    assert (_assert_same(x, (100, 90), False) == 0).all()
    x = torch.full((20, 12, 12), -1.0)
    x[5], x[17] = -0.0, 0.0
    assert (_assert_same(x, (100, 90), False) == 5).all()


def test_argmax_nan_rule():
    """What is replicated: torch.argmax takes NaN as the maximum, the first NaN wins."""
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [INF, NAN, 2.0, 2.0], [NAN, 1.0, INF, 5.0]])
    assert x.argmax(1).tolist() == [1, 1, 0]
    assert torch.tensor([[2.0, 2.0, 1.0]]).argmax(1).tolist() == [0]


@pytest.mark.parametrize('align_corners', [False, True])
def test_nan(align_corners):
    torch.manual_seed(0)
    x = torch.randn(40, 20, 24)
    x[3, 2, 2] = x[30, 2, 2] = NAN           # first NaN in the first chunk
    x[5, 10, 10] = INF
    x[25, 10, 10] = NAN                      # a later chunk's NaN beats an earlier inf
    x[17, 15, 5] = x[9, 15, 6] = NAN         # neighbouring NaNs in two chunks
    x[33, 0, 23] = NAN                       # a NaN in the last chunk only
    x[12, 18:, :4] = NAN                     # a NaN patch in the middle
    ref = _assert_same(x, (97, 131), align_corners, chunks=(1, 2, 4, 8, 16))
    assert set(ref.unique().tolist()) >= {3, 9, 12, 25, 33}


def test_all_nan_and_nan_with_ties():
    x = torch.full((20, 10, 10), NAN)
    assert (_assert_same(x, (100, 90), False) == 0).all()
    x = _tied_logits(classes=40, hw=(12, 12))
    x[20:, 4:8, 4:8] = NAN
    _assert_same(x, (100, 90), False)


@pytest.mark.parametrize('case', ['channels_last', 'small_output', 'three_classes'])
def test_whole_resize_where_a_chunk_could_differ(case, monkeypatch):
    """Where a chunk's interpolation could run another kernel than the full call's, the
    whole resize runs (one call): channels-last logits, CPU outputs with H + W <= 128,
    3 classes on the CPU."""
    torch.manual_seed(0)
    x, size = torch.randn(40, 17, 23), (97, 131)
    if case == 'channels_last':
        x = x[None].contiguous(memory_format=torch.channels_last)[0]
    elif case == 'small_output':
        size = (40, 50)
    else:
        x = x[:3]
    seen = _calls(monkeypatch)
    got = label_map(x, size, False, chunk=2)
    assert seen == [x.shape[0]]
    monkeypatch.undo()
    assert torch.equal(got, _reference(x, size, False))


def test_bad_arguments():
    x = torch.randn(4, 8, 8)
    for kwargs in [dict(chunk=0), dict(chunk=2.0), dict(chunk=True)]:
        with pytest.raises(ConfigError, match='chunk'):
            label_map(x, (16, 16), False, **kwargs)
    with pytest.raises(ConfigError, match='size'):
        label_map(x, (16, ), False)
    with pytest.raises(ConfigError, match='logits'):
        label_map(x[None], (16, 16), False)


# ------------------------------------------------------------- the post-processing rule


def _owner(align_corners, threshold=0.3):
    """What mmseg's ``postprocess_result`` reads from the segmentor."""
    return SimpleNamespace(align_corners=align_corners,
                           decode_head=SimpleNamespace(threshold=threshold))


def _samples(metas):
    return [SegDataSample(metainfo=m) for m in metas]


METAS = [
    dict(ori_shape=(97, 131)),
    dict(ori_shape=(150, 170), padding_size=[0, 5, 0, 3]),
    dict(ori_shape=(33, 47), img_padding_size=[2, 1, 4, 0], padding_size=[9, 9, 9, 9]),
    dict(ori_shape=(101, 77), flip=True, flip_direction='horizontal'),
    dict(ori_shape=(88, 140), flip=True, flip_direction='vertical', padding_size=[3, 0, 1, 2]),
    dict(ori_shape=(64, 80), flip=False),
]


def _compare_postprocess(logits, align_corners, chunk, threshold=0.3):
    ours = label_map_postprocess(_owner(align_corners, threshold), logits, _samples(METAS),
                                 chunk=chunk)
    theirs = BaseSegmentor.postprocess_result(_owner(align_corners, threshold), logits,
                                              _samples(METAS))
    for a, b in zip(ours, theirs, strict=True):
        assert a.pred_sem_seg.data.dtype == b.pred_sem_seg.data.dtype
        assert torch.equal(a.pred_sem_seg.data, b.pred_sem_seg.data)
        assert 'seg_logits' not in a and 'seg_logits' in b
    return ours


@pytest.mark.parametrize('align_corners', [False, True])
@pytest.mark.parametrize('chunk', [1, 4, 16])
def test_postprocess_matches_mmseg(align_corners, chunk):
    torch.manual_seed(chunk)
    _compare_postprocess(torch.randn(len(METAS), 21, 40, 44), align_corners, chunk)


def test_postprocess_ties_and_nan_match_mmseg():
    logits = torch.stack([_tied_logits(hw=(40, 44), seed=s) for s in range(len(METAS))])
    logits[1, 20:, 5:9, 30:33] = NAN
    logits[4] = 2.5                                  # every class ties everywhere
    out = _compare_postprocess(logits, False, 8)
    assert (out[4].pred_sem_seg.data == 0).all()


def test_postprocess_one_class_threshold():
    torch.manual_seed(0)
    _compare_postprocess(torch.randn(len(METAS), 1, 40, 44), False, 4, threshold=0.4)


def test_keep_logits_and_no_samples():
    torch.manual_seed(0)
    logits = torch.randn(len(METAS), 6, 40, 44)
    ours = label_map_postprocess(_owner(False), logits, _samples(METAS), keep_logits=True)
    for i, (sample, meta) in enumerate(zip(ours, METAS, strict=True)):
        cropped = LABEL_MAP_SEGMENTOR.crop_and_flip(logits[i:i + 1], meta)[0]
        assert torch.equal(sample.seg_logits.data, cropped)
        assert sample.pred_sem_seg.shape == tuple(meta['ori_shape'])
    # no data samples: no crop or resize, as in mmseg
    ours = label_map_postprocess(_owner(False), logits, None, keep_logits=False)
    theirs = BaseSegmentor.postprocess_result(_owner(False), logits, None)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.pred_sem_seg.data, b.pred_sem_seg.data) and 'seg_logits' not in a


def test_bad_flip_direction():
    with pytest.raises(ConfigError, match='flip_direction'):
        label_map_postprocess(_owner(False), torch.randn(1, 3, 8, 8),
                              _samples([dict(ori_shape=(8, 8), flip=True,
                                             flip_direction='diagonal')]))


# --------------------------------------------------------------- the segmentor, tiny UperNet


@pytest.fixture(scope='module')
def tiny_upernet():
    """mmseg's EncoderDecoder from the demo config (narrower), 5 classes, eval mode."""
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS
    from amvim_mm.apis.runner import load_config
    cfg = load_config(DEMO, cfg_options={
        'model.backbone.arch': dict(embed_dims=32, num_layers=4, d_state=4),
        'model.backbone.out_indices': (0, 1, 2, 3), 'model.neck.in_channels': 32,
        'model.decode_head.in_channels': [32] * 4, 'model.decode_head.channels': 16})
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model).eval()
        ours = MODELS.build(dict(copy.deepcopy(cfg.model), type='LabelMapEncoderDecoder',
                                 label_map_chunk=2)).eval()
    ours.load_state_dict(model.state_dict(), strict=True)
    return model, ours


def _predict(model, inputs):
    metas = [dict(ori_shape=(96, 80), img_shape=(64, 64), pad_shape=(64, 64)),
             dict(ori_shape=(96, 80), img_shape=(64, 64), pad_shape=(64, 64),
                  padding_size=[0, 4, 0, 8]),
             dict(ori_shape=(96, 80), img_shape=(64, 64), pad_shape=(64, 64), flip=True,
                  flip_direction='horizontal'),
             dict(ori_shape=(120, 97), img_shape=(64, 64), pad_shape=(64, 64), flip=True,
                  flip_direction='vertical')]
    with torch.no_grad():
        return model.predict(inputs, _samples(metas))


def test_upernet_same_labels(tiny_upernet):
    model, ours = tiny_upernet
    assert type(ours).__name__ == 'LabelMapEncoderDecoder'
    assert isinstance(ours, type(model)) and uses_label_map(ours) and not uses_label_map(model)
    torch.manual_seed(1)
    inputs = torch.randn(4, 3, 64, 64)
    theirs, mine = _predict(model, inputs), _predict(ours, inputs)
    for a, b in zip(mine, theirs, strict=True):
        assert a.pred_sem_seg.shape == b.pred_sem_seg.shape == b.metainfo['ori_shape']
        assert torch.equal(a.pred_sem_seg.data, b.pred_sem_seg.data)
        assert 'seg_logits' not in a and 'seg_logits' in b
    assert len(torch.cat([b.pred_sem_seg.data.flatten() for b in theirs]).unique()) > 1


def test_use_label_map_and_restore(tiny_upernet):
    model = copy.deepcopy(tiny_upernet[0])
    torch.manual_seed(2)
    inputs = torch.randn(4, 3, 64, 64)
    before = _predict(model, inputs)
    assert use_label_map(model, chunk=2) is model and uses_label_map(model)
    switched = _predict(model, inputs)
    assert restore_postprocess(model) is model and not uses_label_map(model)
    assert 'postprocess_result' not in model.__dict__
    after = _predict(model, inputs)
    for a, b, c in zip(before, switched, after, strict=True):
        assert torch.equal(a.pred_sem_seg.data, b.pred_sem_seg.data)
        assert torch.equal(a.pred_sem_seg.data, c.pred_sem_seg.data)
        assert 'seg_logits' not in b and torch.equal(a.seg_logits.data, c.seg_logits.data)
    use_label_map(model, keep_logits=True)
    kept = _predict(model, inputs)
    assert kept[0].seg_logits.shape == (64, 64)         # cropped, not resized
    assert restore_postprocess(restore_postprocess(model)) is model   # twice is harmless


def test_use_label_map_refuses(tiny_upernet):
    with pytest.raises(ConfigError, match='mmseg segmentor'):
        use_label_map(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match='chunk'):
        use_label_map(tiny_upernet[0], chunk=0)
    with pytest.raises(ConfigError, match='keep_logits'):
        use_label_map(tiny_upernet[0], keep_logits='yes')

    class Custom(type(tiny_upernet[0])):
        def postprocess_result(self, seg_logits, data_samples=None):
            return data_samples
    custom = copy.deepcopy(tiny_upernet[0])
    custom.__class__ = Custom
    with pytest.raises(ConfigError, match='its own postprocess_result'):
        use_label_map(custom)


def test_the_type_pickles_and_registers(tiny_upernet):
    from amvim_mm.registry import MODELS
    cls = segmentor_class()
    assert pickle.loads(pickle.dumps(cls)) is cls
    assert LABEL_MAP_SEGMENTOR.LabelMapEncoderDecoder is cls
    assert MODELS.get('LabelMapEncoderDecoder') is LABEL_MAP_SEGMENTOR.build_label_map_segmentor
    ours = pickle.loads(pickle.dumps(tiny_upernet[1]))
    assert type(ours) is cls and ours.label_map_chunk == 2
    with pytest.raises(ConfigError, match='chunk'):
        MODELS.build(dict(type='LabelMapEncoderDecoder', label_map_chunk=-1))


def test_import_does_not_import_mmseg():
    code = "import sys, amvim_mm; assert 'mmseg' not in sys.modules, 'mmseg imported'"
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_benchmark_helper_runs_on_cpu():
    """The GPU benchmark's helper, tiny and on the CPU (no timing is asserted)."""
    from amvim_mm.bench.label_map import format_rows, time_postprocess
    result = time_postprocess(batch=2, classes=7, in_hw=(10, 12), out_hw=(70, 90),
                              device='cpu', chunks=(2, 4), iters=1, rounds=2, warmup=1)
    assert result['identical'] and [(r['path'], r['chunk']) for r in result['rows']] == \
        [('mmseg', None), ('label_map', 2), ('label_map', 4)]
    assert all(len(r['ms_rounds']) == 2 for r in result['rows'])
    assert result['rows'][0]['stored_mib'] > 0 and result['rows'][1]['stored_mib'] == 0
    assert 'labels identical' in format_rows(result)
