"""``TorchvisionColorJitter``: torchvision's ``ColorJitter`` as an mmcv pipeline step.

The official ViL segmentation recipe (NX-AI/vision-lstm) jitters each training crop with
torchvision's ``ColorJitter`` on the PIL image (brightness, contrast, saturation factors drawn
from ``[1 - x, 1 + x]``, a hue shift from ``[-h, h]``, the four applied in a random order). This
step does exactly that to an mmcv pipeline's ``results['img']`` (H x W x 3 uint8, BGR as mmcv
loads it): BGR -> PIL RGB -> ``torchvision.transforms.ColorJitter`` -> BGR. The random numbers
come from torch's generator (torchvision draws them), which mmengine seeds per data worker.

**Why not mmpretrain's ``ColorJitter``** (same semantics, mmcv's ``adjust_*``): with the pinned
NumPy 2, mmcv 2.1.0's ``adjust_hue`` computes ``np.uint8(hue_factor * 255)``, which raises
``OverflowError`` for every negative hue factor (NumPy 1 wrapped it around), i.e. for half of
the draws of a symmetric hue range.

Registered in mmengine's root ``TRANSFORMS``, so an mmseg / mmdet / mmpretrain pipeline finds it
by type name once ``amvim_mm.datasets`` is imported (``custom_imports``).
"""
from __future__ import annotations

from typing import Dict, Sequence, Union

import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS
from PIL import Image

from amvim_mm.errors import ConfigError

__all__ = ['TorchvisionColorJitter']

Range = Union[float, Sequence[float]]


@TRANSFORMS.register_module()
class TorchvisionColorJitter(BaseTransform):
    """torchvision's ``ColorJitter(brightness, contrast, saturation, hue)`` on ``results['img']``.

    Args:
        brightness, contrast, saturation: a number ``x >= 0`` (factor from
            ``[max(0, 1 - x), 1 + x]``) or a ``(min, max)`` pair; 0 leaves it out.
        hue: a number ``0 <= h <= 0.5`` (shift from ``[-h, h]``) or a pair in [-0.5, 0.5].

    Required / modified key: ``img`` (H x W x 3 uint8, BGR).
    """

    def __init__(self, brightness: Range = 0., contrast: Range = 0., saturation: Range = 0.,
                 hue: Range = 0.) -> None:
        from torchvision.transforms import ColorJitter
        try:
            self.jitter = ColorJitter(brightness=brightness, contrast=contrast,
                                      saturation=saturation, hue=hue)
        except (TypeError, ValueError) as e:
            raise ConfigError(f'TorchvisionColorJitter: {e}') from None

    @property
    def ranges(self) -> Dict[str, object]:
        """The factor ranges torchvision draws from (None: left out)."""
        j = self.jitter
        return dict(brightness=j.brightness, contrast=j.contrast, saturation=j.saturation,
                    hue=j.hue)

    def transform(self, results: dict) -> dict:
        img = results['img']
        if not (isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim == 3
                and img.shape[-1] == 3):
            got = (f'{img.dtype} array of shape {img.shape}' if isinstance(img, np.ndarray)
                   else type(img).__name__)
            raise ValueError(f'TorchvisionColorJitter needs an H x W x 3 uint8 BGR image, got '
                             f'{got}')
        rgb = Image.fromarray(np.ascontiguousarray(img[..., ::-1]))
        out = np.asarray(self.jitter(rgb))
        results['img'] = np.ascontiguousarray(out[..., ::-1])
        return results

    def __repr__(self) -> str:
        r = self.ranges
        return (f'{type(self).__name__}(brightness={r["brightness"]}, '
                f'contrast={r["contrast"]}, saturation={r["saturation"]}, hue={r["hue"]})')
