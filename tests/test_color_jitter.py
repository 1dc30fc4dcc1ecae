"""``TorchvisionColorJitter`` (amvim_mm.datasets): torchvision's ColorJitter on an mmcv
pipeline's BGR uint8 image, found from mmseg's registry, and fine with negative hue shifts (where
mmpretrain's ColorJitter, through mmcv 2.1.0's adjust_hue, fails under NumPy 2)."""
import numpy as np
import pytest
import torch
from mmengine.registry import DefaultScope
from PIL import Image
from torchvision.transforms import ColorJitter

import amvim_mm.datasets  # noqa: F401  (registers the transform)
from amvim_mm.datasets import TorchvisionColorJitter
from amvim_mm.errors import ConfigError

RECIPE = dict(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.25)


def _bgr(seed=0, shape=(24, 40, 3)):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_built_by_type_name_from_the_mmseg_pipeline():
    import mmseg.registry
    with DefaultScope.overwrite_default_scope('mmseg'):
        t = mmseg.registry.TRANSFORMS.build(dict(type='TorchvisionColorJitter', **RECIPE))
    assert isinstance(t, TorchvisionColorJitter)
    assert t.ranges == dict(brightness=(0.5, 1.5), contrast=(0.5, 1.5), saturation=(0.5, 1.5),
                            hue=(-0.25, 0.25))
    assert 'hue=(-0.25, 0.25)' in repr(t)


@pytest.mark.parametrize('seed', range(6))
def test_equals_torchvision_on_the_rgb_image(seed):
    """Same torch seed -> the same draws, order and result as torchvision's ColorJitter applied
    to the PIL RGB image (the official code's step), returned in BGR."""
    img = _bgr(seed)
    torch.manual_seed(seed)
    ref = np.asarray(ColorJitter(**RECIPE)(Image.fromarray(img[..., ::-1].copy())))
    torch.manual_seed(seed)
    out = TorchvisionColorJitter(**RECIPE)(dict(img=img.copy(), other=1))
    assert out['other'] == 1
    assert out['img'].dtype == np.uint8 and out['img'].shape == img.shape
    assert out['img'].flags['C_CONTIGUOUS']
    np.testing.assert_array_equal(out['img'], ref[..., ::-1])


def test_channel_order_is_bgr():
    """A saturation-only jitter of a pure-blue BGR image moves only towards grey: blue stays the
    largest channel, which is index 0 in BGR."""
    img = np.zeros((8, 8, 3), np.uint8)
    img[..., 0] = 200
    torch.manual_seed(0)
    out = TorchvisionColorJitter(saturation=(0.3, 0.3))(dict(img=img))['img']
    assert (out[..., 0] > out[..., 2]).all() and (out[..., 0] < 200).all()


def test_negative_hue_shifts_work():
    img = _bgr(1)
    t = TorchvisionColorJitter(hue=(-0.25, -0.2))
    for seed in range(3):
        torch.manual_seed(seed)
        out = t(dict(img=img.copy()))['img']
        assert not np.array_equal(out, img)


@pytest.mark.parametrize('kw,what', [(dict(hue=0.7), 'hue'), (dict(brightness=-1), 'brightness'),
                                     (dict(contrast='a'), 'contrast')])
def test_bad_ranges_are_config_errors(kw, what):
    with pytest.raises(ConfigError, match=what):
        TorchvisionColorJitter(**kw)


@pytest.mark.parametrize('img', [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3), np.float32),
                                 np.zeros((4, 4, 4), np.uint8)])
def test_needs_a_bgr_uint8_image(img):
    with pytest.raises(ValueError, match='H x W x 3 uint8'):
        TorchvisionColorJitter(**RECIPE)(dict(img=img))
