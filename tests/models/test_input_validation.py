"""Bad backbone arguments, inputs and token-reduction schedules fail loudly with a ConfigError."""
import copy
import logging

import numpy as np
import math

import pytest
import torch

from amvim_mm import runtime

import amvim_mm  # noqa: F401
from amvim_mm.engine.hooks import TokenReductionHook
from amvim_mm.errors import ConfigError
from amvim_mm.models.skeleton.base import MambaBackbone
from amvim_mm.models.reduction import ReductionSchedule, ToMe, build_reducer
from amvim_mm.models.reduction.state import init_reduction_state, reduce_tokens
from amvim_mm.registry import MODELS


def build(type='Vim', **kw):
    cfg = dict(type=type, arch='test', img_size=64)
    cfg.update(kw)
    return MODELS.build(cfg)


# ----------------------------------------------------------------------- backbone arguments
@pytest.mark.parametrize('kw,match', [
    (dict(img_size=64.5), r'img_size must be a positive int or a pair \(H, W\).*got 64.5'),
    (dict(img_size=(64, 64.0)), r'img_size must be .*got \(64, 64.0\)'),
    (dict(img_size=(64, 64, 3)), r'img_size must be .*got \(64, 64, 3\)'),
    (dict(img_size=0), r'img_size must be .*got 0'),
    (dict(img_size=True), r'img_size must be .*got True'),
    (dict(img_size='64'), r"img_size must be .*got '64'"),
    (dict(out_indices='3'), r"out_indices must be an int or a non-empty sequence of ints, "
                            r"got '3'"),
    (dict(out_indices=True), r'out_indices must be .*got True'),
    (dict(out_indices=(1, False)), r'out_indices must be .*got \(1, False\)'),
    (dict(out_indices=(1.0, )), r'out_indices must be .*got \(1.0,\)'),
    (dict(out_indices=()), r'out_indices must be .*got \(\)'),
    (dict(out_indices=7), r'out_indices 7 is out of range for 4 layers'),
    (dict(drop_path_rate=1.5), r'drop_path_rate must be a number in \[0, 1\), got 1.5'),
    (dict(drop_path_rate=1), r'drop_path_rate must be a number in \[0, 1\), got 1'),
    (dict(drop_path_rate=-0.1), r'drop_path_rate must be a number in \[0, 1\), got -0.1'),
    (dict(drop_path_rate='0.1'), r"drop_path_rate must be a number in \[0, 1\), got '0.1'"),
    (dict(drop_rate=1.5), r'drop_rate must be a number in \[0, 1\), got 1.5'),
    (dict(drop_rate=float('nan')), r'drop_rate must be a number in \[0, 1\), got nan'),
    (dict(patch_size=16.0), r'patch_size must be a positive int, got 16.0'),
    (dict(patch_size=0), r'patch_size must be a positive int, got 0'),
    (dict(stride='8'), r"stride must be a positive int, got '8'"),
    (dict(stride=8.5), r'stride must be a positive int, got 8.5'),
    (dict(in_channels=3.0), r'in_channels must be a positive int, got 3.0'),
])
@pytest.mark.parametrize('type', ['Vim', 'AMVim', 'LocalVim'])
def test_bad_backbone_arguments_fail_at_build(type, kw, match):
    with pytest.raises(ConfigError, match=match):
        build(type, **kw)


@pytest.mark.parametrize('kw', [
    dict(img_size=(64, 48)), dict(img_size=[48, 64]), dict(img_size=np.int64(64)),
    dict(out_indices=-1), dict(out_indices=(-1, 1)), dict(out_indices=[0, -2]),
    dict(out_indices=(np.int64(1), )), dict(drop_path_rate=0), dict(drop_path_rate=0.3),
    dict(drop_rate=0.1), dict(patch_size=8, stride=8), dict(patch_size=16, stride=8),
])
def test_valid_backbone_arguments_still_build(kw):
    m = build(**kw).eval()
    size = m.img_size
    out = m(torch.randn(1, 3, *size))
    assert len(out) == len(m.out_indices)


# ----------------------------------------------------------------------- forward inputs
@pytest.fixture(scope='module')
def model():
    return build(out_type='featmap').eval()


@pytest.mark.parametrize('shape,match', [
    ((0, 3, 64, 64), r'empty batch: got input of shape \(0, 3, 64, 64\); expected '
                     r'\(B, 3, H, W\) with B >= 1'),
    ((3, 64, 64), r'expected images of shape \(B, C, H, W\) = \(B, 3, H, W\), got '
                  r'\(3, 64, 64\)'),
    ((1, 1, 3, 64, 64), r'expected images of shape .*got \(1, 1, 3, 64, 64\)'),
    ((2, 1, 64, 64), r'expected 3 input channels, got 1 \(input shape \(2, 1, 64, 64\), '
                     r'expected \(B, 3, H, W\)\)'),
    ((1, 3, 8, 64), r'input image 8x64 is smaller than one patch \(16x16\)'),
])
def test_bad_input_shapes(model, shape, match):
    with pytest.raises(ConfigError, match=match), torch.no_grad():
        model(torch.zeros(shape))


def test_input_not_a_tensor(model):
    with pytest.raises(ConfigError, match=r'expected images as a tensor of shape '
                                          r'\(B, 3, H, W\), got ndarray'):
        model(np.zeros((1, 3, 64, 64), dtype=np.float32))


def test_empty_batch_with_token_reduction():
    m = build(token_reduction=dict(type='ToMe', ratio=0.27)).eval()
    with pytest.raises(ConfigError, match='empty batch'), torch.no_grad():
        m(torch.zeros(0, 3, 64, 64))


@pytest.mark.parametrize('bad,count', [
    ([(0, 0, 3, 3, float('nan'))], 1),
    ([(0, 1, 0, 0, float('inf')), (1, 2, 5, 7, -float('inf')), (1, 0, 1, 1, float('nan'))], 3),
])
def test_non_finite_input_is_named(model, bad, count):
    x = torch.randn(2, 3, 64, 64)
    for b, c, h, w, v in bad:
        x[b, c, h, w] = v
    with pytest.raises(ConfigError, match=rf'Vim: the input images hold {count} non-finite '
                                          r'\(NaN or inf\) values of 24576 \(input shape '
                                          r'\(2, 3, 64, 64\)\)'), torch.no_grad():
        model(x)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.float16])
def test_the_input_check_takes_the_largest_magnitude_in_one_pass(model, dtype):
    """One ``aminmax`` pass gives the largest magnitude: NaN or inf anywhere is non-finite,
    and huge finite values (issue 52: 3e38 pixels gave non-finite outputs in every family) are
    refused too, in one line naming the largest value."""
    from amvim_mm.models.skeleton.input_check import MAX_INPUT
    from amvim_mm.models.vim.family import VimFamilyBackbone
    x = torch.full((2, 3, 8, 8), 2.0, dtype=dtype)
    x[0, 0, 0, 0] = -5.0
    assert VimFamilyBackbone._largest(x) == 5.0
    x[1, 2, 7, 7] = float('nan')
    assert math.isnan(VimFamilyBackbone._largest(x))
    x[1, 2, 7, 7] = float('-inf')
    assert VimFamilyBackbone._largest(x) == float('inf')
    big = torch.full((1, 3, 64, 64), 3e38)
    big[0, 0, 0, ::2] = -3e38
    with pytest.raises(ConfigError, match=r'values up to 3e\+38; the backbone takes '
                                          r'normalised images') as err, torch.no_grad():
        model(big)
    assert '\n' not in str(err.value) and MAX_INPUT == 1e6
    big[0, 1, 5, 5] = float('inf')
    with pytest.raises(ConfigError, match='hold 1 non-finite'), torch.no_grad():
        model(big)
    with torch.no_grad():                       # raw 0-255 pixels still pass
        model(torch.full((1, 3, 64, 64), 255.0))


def test_non_finite_check_can_be_switched_off():
    m = build().eval()
    m.check_finite_input = False
    x = torch.randn(1, 3, 64, 64)
    x[0, 0, 0, 0] = float('nan')
    with torch.no_grad():
        assert torch.isnan(m(x)[-1]).all()      # the documented consequence of one NaN


def test_non_finite_check_skipped_while_capturing(monkeypatch):
    """The check must not sync inside CUDA-graph capture; on CPU inputs it never asks."""
    m = build().eval()
    calls = []
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing',
                        lambda: calls.append(1) or True)
    x = torch.randn(1, 3, 64, 64)
    x[0, 0, 0, 0] = float('nan')
    with pytest.raises(ConfigError, match='1 non-finite'), torch.no_grad():
        m(x)
    assert not calls
    assert m._skip_finite_check(torch.zeros(1)) is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_non_finite_check_skipped_while_capturing_cuda(monkeypatch):
    x = torch.zeros(1, device='cuda')
    monkeypatch.setattr(torch.cuda, 'is_current_stream_capturing', lambda: True)
    assert build()._skip_finite_check(x) is True


# ----------------------------------------------------------------------- token reduction
@pytest.mark.parametrize('cfg,match', [
    (dict(type='ToMe', r=2.5),
     r'ToMe: r must be a non-negative int or a list of them \(one per block\), got 2.5'),
    (dict(type='ToMe', r='5'), r"ToMe: r must be .*got '5'"),
    (dict(type='ToMe', r=[1, 2.5, 0, 0]), r'ToMe: r must be .*got \[1, 2.5, 0, 0\]'),
    (dict(type='ToMe', r=True), r'ToMe: r must be .*got True'),
    (dict(type='ToMe', r=-1), r'ToMe: r must be .*got -1'),
    (dict(type='RandomPrune', r=2.5), r'RandomPrune: r must be .*got 2.5'),
    (dict(type='ToMe', r=2, locations='10'),
     r"ToMe: locations must be a list of block indices \(ints\), got '10'"),
    (dict(type='ToMe', r=2, locations=[1.0]), r'locations must be .*got \[1.0\]'),
    (dict(type='ToMe', r=2, locations=[True]), r'locations must be .*got \[True\]'),
    (dict(type='ToP', keep_rate=0.8, locations='1'), r"locations must be .*got '1'"),
])
def test_bad_reduction_values_every_route(cfg, match):
    # at build
    with pytest.raises(ConfigError, match=match):
        build(token_reduction=cfg)
    with pytest.raises(ConfigError, match=match):
        build_reducer(cfg)
    # set_token_reduction on a built model
    m = build()
    with pytest.raises(ConfigError, match=match):
        m.set_token_reduction(cfg)
    assert m.token_reducer is None
    # the hook
    with pytest.raises(ConfigError, match=match):
        TokenReductionHook(reduction=cfg)


def test_reduction_message_is_not_wrapped_twice():
    with pytest.raises(ConfigError) as info:
        build_reducer(dict(type='ToMe', r=2.5))
    assert str(info.value).count('ToMe') == 1


def test_valid_locations_and_r_still_accepted():
    s = ReductionSchedule.build(r=2, locations=(0, 2))
    assert s.locations == (0, 2) and s.removals(16, 4) == [2, 0, 2, 0]
    assert ReductionSchedule.build(r=2, locations=1).removals(16, 4) == [0, 2, 0, 0]
    assert ReductionSchedule.build(r=np.int64(2), locations=[np.int64(2)]).removals(
        16, 4) == [0, 0, 2, 0]
    assert ReductionSchedule.build(r=(1, 0, 2, 0)).removals(16, 4) == [1, 0, 2, 0]
    assert ReductionSchedule.build(r=range(4)).r == (0, 1, 2, 3)


def test_tome_bound_is_half_rounded_up():
    assert [ToMe.max_merge(n) for n in (0, 1, 2, 3, 16, 17)] == [0, 0, 1, 2, 8, 9]


@pytest.mark.parametrize('r,block,present,most', [
    ([0, 9, 0, 0], 1, 16, 8),     # 16 patch tokens at 64 / 16: at most 8 merge in one step
    ([8, 5, 0, 0], 1, 8, 4),      # after 8 merged, 8 are left: at most 4
    ([9, 0, 0, 0], 0, 16, 8),
])
def test_tome_more_than_half_fails_at_build(r, block, present, most):
    match = (rf'ToMe: the schedule merges {r[block]} tokens before block {block}, but only '
             rf'{present} patch tokens are present there and one bipartite step merges at most '
             rf'{most} .*class token is never merged.*img_size=\(64, 64\): 16 patch tokens')
    with pytest.raises(ConfigError, match=match):
        build(token_reduction=dict(type='ToMe', r=r))
    m = build()
    with pytest.raises(ConfigError, match=match):
        m.set_token_reduction(dict(type='ToMe', r=r))
    # through the hook: validated when it switches reduction on for the model's img_size
    hook = TokenReductionHook(reduction=dict(type='ToMe', r=r), phases=('val', ))

    class Runner:
        model = m
        logger = logging.getLogger('test')

    with pytest.raises(ConfigError, match=match):
        hook.before_val(Runner)


def test_tome_exactly_half_still_runs():
    """The bound is exact: ceil(n / 2) merges in one step is what ToMe.select can do."""
    m = build(token_reduction=dict(type='ToMe', r=[8, 4, 2, 1])).eval()
    with torch.no_grad():
        m(torch.randn(1, 3, 64, 64))
    assert m.token_counts == [9, 5, 3, 2]
    # pruning reducers are not bound by the matching: RandomPrune may drop more than half
    m = build(token_reduction=dict(type='RandomPrune', r=[9, 0, 0, 0])).eval()
    with torch.no_grad():
        m(torch.randn(1, 3, 64, 64))
    assert m.token_counts[0] == 8


def test_tome_bound_checked_for_the_input_size_at_forward():
    m = build(token_reduction=dict(type='ToMe', r=[8, 0, 0, 0])).eval()   # 16 tokens at 64
    with pytest.raises(ConfigError, match='merges at most 6'), torch.no_grad():
        m(torch.randn(1, 3, 48, 64))   # 12 patch tokens


# ----------------------------------------------------------------------- tracing and FLOPs
@pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')
@pytest.mark.parametrize('freeze_sources', [False, True])
def test_reduce_tokens_traces(freeze_sources):
    """``merged & (not freeze_sources)`` (Python bool & tensor) broke torch.jit.trace."""
    from amvim_mm.models.layout.scan_context import ScanContext
    ctx = init_reduction_state(ScanContext((4, 4), cls_index=8), 2, 'cpu')
    removed = torch.tensor([[0, 2], [4, 6]])
    dst = torch.tensor([[1, 3], [-1, 5]])

    def step(hidden, residual):
        h, r, _ = reduce_tokens(ctx, hidden, residual, removed, dst,
                                freeze_sources=freeze_sources)
        return h, r

    args = (torch.randn(2, 17, 8), torch.randn(2, 17, 8))
    traced = torch.jit.trace(step, args)
    for a, b in zip(step(*args), traced(*args), strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')
def test_jit_trace_with_tome_matches_eager():
    m = build(token_reduction=dict(type='ToMe', ratio=0.27)).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    # a trace records the PyTorch ops (the compiled CPU kernels step aside while tracing):
    # compared with the eager model on the same ops, bit for bit
    with torch.no_grad(), runtime.override(cpu_kernels=False):
        traced = torch.jit.trace(m, x)
        eager = m(x)
        assert m.token_counts == [14, 14, 11, 11]
        got = traced(x)
    assert len(got) == len(eager)
    for a, b in zip(eager, got, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.filterwarnings('ignore::torch.jit.TracerWarning')
def test_mmengine_flops_counter_on_reduced_model():
    from mmengine.analysis import get_model_complexity_info
    full = build().eval()
    reduced = build(token_reduction=dict(type='ToMe', ratio=0.27)).eval()
    reduced.load_state_dict(full.state_dict())
    flops = {}
    for name, m in (('full', full), ('reduced', reduced)):
        info = get_model_complexity_info(m, input_shape=(3, 64, 64), show_table=False,
                                         show_arch=False)
        flops[name] = info['flops']
    assert 0 < flops['reduced'] < flops['full']


def test_amvim_paths_override_refuses_ignored_arguments():
    from amvim_mm.registry import MODELS
    paths = [dict(order='raster'), dict(order='column', reverse=True)]
    MODELS.build(dict(type='AMVim', arch='test', img_size=32, paths=paths))
    with pytest.raises(ConfigError, match=r"\['window_size'\] would be ignored"):
        MODELS.build(dict(type='AMVim', arch='test', img_size=32, paths=paths, window_size=2))


def test_block_with_wrong_number_of_paths_fails_at_build():
    from amvim_mm.models.vim.block import VimBlock
    from amvim_mm.models.vim.mixer import BiMambaMixer
    mixer = BiMambaMixer(32, d_state=8, dt_rank=2)
    with pytest.raises(ConfigError, match='has 2 paths, but the block got 3 scan orders'):
        VimBlock(mixer, 32, [dict(order='raster')] * 3)


# ----------------------------------------------------------------------- every backbone
#: every registered backbone of ours (a new one is covered by registering it), dense outputs
BACKBONES = {n: dict(out_type='featmap') for n, c in MODELS.module_dict.items()
             if isinstance(c, type) and issubclass(c, MambaBackbone)}


@pytest.fixture(scope='module')
def backbones():
    return {t: MODELS.build(dict(type=t, arch='test', img_size=32, **kw)).eval()
            for t, kw in BACKBONES.items()}


def _bad(x, where, value):
    x = x.clone()
    x[where] = value
    return x


@pytest.mark.parametrize('name', list(BACKBONES))
def test_every_backbone_refuses_bad_images_by_name(backbones, name):
    """One check for all (NaN/inf passed through VMamba and PlainMamba; a wrong dtype was a
    traceback from the stem's convolution in every backbone)."""
    m = backbones[name]
    x = torch.randn(2, 3, 32, 32)
    cases = [
        (_bad(x, (1, 2, 3, 4), float('nan')),
         rf'^{name}: the input images hold 1 non-finite \(NaN or inf\) values of 6144 \(input '
         r'shape \(2, 3, 32, 32\)\); every output would be NaN$'),
        (_bad(_bad(x, (0, 0, 0, 0), float('inf')), (1, 1, 1, 1), -float('inf')),
         rf'^{name}: the input images hold 2 non-finite'),
        (x.half(), rf'^{name}: the input images are torch.float16 but the model is '
                   r'torch.float32; cast the images to torch.float32, convert the model, or '
                   r'run a float32 model under torch.autocast$'),
        (x.double(), rf'^{name}: the input images are torch.float64 but the model is '
                     r'torch.float32'),
        ((x * 60 + 100).clamp(0, 255).to(torch.uint8),
         rf'^{name}: the input images are torch.uint8, not floating point; normalise them to '
         r'float first'),
        (x[:, :1], rf'^{name}: expected 3 input channels, got 1 \(input shape '
                   r'\(2, 1, 32, 32\), expected \(B, 3, H, W\)\)$'),
        (x[0], rf'^{name}: expected images of shape \(B, C, H, W\) = \(B, 3, H, W\), got '
               r'\(3, 32, 32\)$'),
        (x[:0], rf'^{name}: empty batch'),
        (x[..., :2], rf'^{name}: input image 32x2 is smaller than one patch'),
    ]
    for bad, match in cases:
        with pytest.raises(ConfigError, match=match), torch.no_grad():
            m(bad)
    with pytest.raises(ConfigError, match=rf'^{name}: the model is torch.float16 but autocast '
                                          r'casts to torch.bfloat16'), torch.no_grad(), \
            torch.autocast('cpu', dtype=torch.bfloat16):
        copy.deepcopy(m).half()(x.half())


@pytest.mark.parametrize('name', list(BACKBONES))
def test_every_backbone_still_runs_half_and_under_autocast(backbones, name):
    m = backbones[name]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = m(x)[-1]
        with torch.autocast('cpu', dtype=torch.bfloat16):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                out = m(x.to(dtype))[-1]      # autocast casts the images for the stem
                assert out.shape == ref.shape and torch.isfinite(out).all()
                torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1)
        half = copy.deepcopy(m).half()
        out = half(x.half())[-1]
        assert out.shape == ref.shape and torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)
        # a 16-bit model under autocast to its own dtype takes float32 images too
        bf16 = copy.deepcopy(m).bfloat16()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = bf16(x)[-1]
        assert out.shape == ref.shape and torch.isfinite(out).all()
