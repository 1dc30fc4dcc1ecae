"""mmseg's segmentation post-processing with :func:`~.label_map.label_map`: the
``LabelMapEncoderDecoder`` type and :func:`use_label_map` for a model already built.

mmseg's ``BaseSegmentor.postprocess_result`` removes each image's padding, undoes a flip,
resizes the whole C x h x w logits to ``ori_shape``, takes ``argmax`` (or, for one class, the
sigmoid and the decode head's ``threshold``), and stores both the labels (``pred_sem_seg``) and
the resized logits (``seg_logits``) in the data sample. :func:`label_map_postprocess` does the
same padding crop, flip and one-class rule, but computes ``pred_sem_seg`` chunk by chunk (the
same labels, bit for bit, without the C x H x W tensor) and stores no resized logits: with
``keep_logits=True`` the cropped, flipped logits **before** the resize (C x h x w, raw logits
also for one class) go to ``seg_logits``. mmseg's metric (``IoUMetric``) and visualiser read
``pred_sem_seg`` only; mmseg's test-time augmentation (``SegTTAModel.merge_preds``) sums
``seg_logits`` at ``ori_shape``, so TTA configs should keep mmseg's ``EncoderDecoder``.

Two ways in:

* ``model = dict(type='LabelMapEncoderDecoder', label_map_chunk=16, keep_logits=False, ...)``
  in a config (an ``EncoderDecoder`` subclass; same weights, same keys);
* :func:`use_label_map` on a built mmseg segmentor (the sweep builds users' configs unchanged):
  it sets the instance's ``postprocess_result``; :func:`restore_postprocess` removes it.

``import amvim_mm`` does not import mmseg (optional there): the registry entry
``LabelMapEncoderDecoder`` is a builder that creates the subclass on first use
(:func:`segmentor_class`, also this module's attribute ``LabelMapEncoderDecoder``).
"""
from __future__ import annotations

import functools
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.structures import PixelData

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS
from .label_map import DEFAULT_CHUNK, label_map

CLASS_NAME = 'LabelMapEncoderDecoder'
FLIP_DIRECTIONS = ('horizontal', 'vertical')


def label_map_postprocess(segmentor: nn.Module, seg_logits: torch.Tensor,
                          data_samples: Optional[list] = None, *, chunk: int = DEFAULT_CHUNK,
                          keep_logits: bool = False) -> list:
    """mmseg's ``BaseSegmentor.postprocess_result`` for ``segmentor`` (its ``align_corners``
    and ``decode_head.threshold``) with labels from :func:`label_map` and no resized
    ``seg_logits`` (module docstring). Returns the data samples (new ones when None: then,
    as in mmseg, the logits are taken as they are, without crop or resize)."""
    batch_size = seg_logits.shape[0]
    only_prediction = data_samples is None
    if only_prediction:
        from mmseg.structures import SegDataSample
        data_samples = [SegDataSample() for _ in range(batch_size)]
    for i in range(batch_size):
        logits, size = seg_logits[i:i + 1], None
        if not only_prediction:
            meta = data_samples[i].metainfo
            logits, size = crop_and_flip(logits, meta), meta['ori_shape']
        fields = {'pred_sem_seg': PixelData(data=_labels(segmentor, logits, size, chunk))}
        if keep_logits:
            fields['seg_logits'] = PixelData(data=logits.squeeze(0))
        data_samples[i].set_data(fields)
    return data_samples


def crop_and_flip(logits: torch.Tensor, meta: dict) -> torch.Tensor:
    """mmseg's padding crop (``img_padding_size``, else ``padding_size``: left, right, top,
    bottom) and flip undo of one image's (1, C, H, W) logits."""
    H, W = logits.shape[-2:]
    padding = meta['img_padding_size'] if 'img_padding_size' in meta else \
        meta.get('padding_size', [0] * 4)
    left, right, top, bottom = padding
    logits = logits[:, :, top:H - bottom, left:W - right]
    if meta.get('flip', None):
        direction = meta.get('flip_direction', None)
        if direction not in FLIP_DIRECTIONS:
            raise ConfigError(f'postprocess: flip_direction must be one of {FLIP_DIRECTIONS}, '
                              f'got {direction!r}')
        logits = logits.flip(dims=(3, ) if direction == 'horizontal' else (2, ))
    return logits


def _labels(segmentor: nn.Module, logits: torch.Tensor, size: Optional[Sequence[int]],
            chunk: int) -> torch.Tensor:
    """(1, H, W) labels of (1, C, h, w) logits; ``size`` None: no resize."""
    if logits.shape[1] > 1:
        if size is None:
            return logits[0].argmax(dim=0, keepdim=True)
        return label_map(logits[0], size, segmentor.align_corners, chunk=chunk)
    # one class: mmseg's sigmoid and threshold at full size (a single channel)
    if size is not None:
        logits = F.interpolate(logits, size, None, 'bilinear', segmentor.align_corners)
    prob = logits.squeeze(0).sigmoid()
    return (prob > segmentor.decode_head.threshold).to(prob)


def _check_options(name: str, chunk: int, keep_logits: bool) -> None:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f'{name}: the label-map chunk must be a positive int, got {chunk!r}')
    if not isinstance(keep_logits, bool):
        raise ConfigError(f'{name}: keep_logits must be True or False, got {keep_logits!r}')


@functools.lru_cache(maxsize=None)
def segmentor_class() -> type:
    """The ``EncoderDecoder`` subclass (created once, importing mmseg)."""
    try:
        from mmseg.models.segmentors import EncoderDecoder
    except ImportError as e:
        raise ConfigError(f'{CLASS_NAME} needs mmsegmentation: {e}') from None

    class LabelMapEncoderDecoder(EncoderDecoder):
        """mmseg's ``EncoderDecoder`` whose ``postprocess_result`` computes ``pred_sem_seg``
        chunk by chunk and stores no resized ``seg_logits`` (``amvim_mm.models.segmentors.
        label_map_segmentor``); mmseg's TTA needs ``seg_logits`` at ``ori_shape``: keep
        mmseg's class in TTA configs.

        Args:
            label_map_chunk: classes resized per step (peak chunk x H x W values per image).
            keep_logits: store the cropped logits before the resize as ``seg_logits``.
            **kwargs: ``EncoderDecoder``'s arguments.
        """

        def __init__(self, *, label_map_chunk: int = DEFAULT_CHUNK, keep_logits: bool = False,
                     **kwargs) -> None:
            _check_options(CLASS_NAME, label_map_chunk, keep_logits)
            super().__init__(**kwargs)
            self.label_map_chunk = label_map_chunk
            self.keep_logits = keep_logits

        def postprocess_result(self, seg_logits: torch.Tensor,
                               data_samples: Optional[list] = None) -> list:
            return label_map_postprocess(self, seg_logits, data_samples,
                                         chunk=self.label_map_chunk,
                                         keep_logits=self.keep_logits)

    LabelMapEncoderDecoder.__qualname__ = CLASS_NAME
    LabelMapEncoderDecoder.__module__ = __name__    # pickle finds it via __getattr__ below
    return LabelMapEncoderDecoder


def __getattr__(name: str):
    if name == CLASS_NAME:
        return segmentor_class()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


@MODELS.register_module(name=CLASS_NAME)
def build_label_map_segmentor(**kwargs) -> nn.Module:
    """The registry's ``LabelMapEncoderDecoder``: builds :func:`segmentor_class`'s type."""
    return segmentor_class()(**kwargs)


def _segmentor(model: nn.Module, name: str) -> nn.Module:
    """The mmseg segmentor inside ``model`` (a model wrapper's ``module``), checked."""
    from mmengine.model import is_model_wrapper
    seg = model.module if is_model_wrapper(model) else model
    try:
        from mmseg.models.segmentors.base import BaseSegmentor
    except ImportError as e:
        raise ConfigError(f'{name} needs mmsegmentation: {e}') from None
    if not isinstance(seg, BaseSegmentor):
        raise ConfigError(f'{name}: expected an mmseg segmentor, got {type(seg).__name__}')
    own = type(seg).postprocess_result
    if own is not BaseSegmentor.postprocess_result and \
            own is not segmentor_class().postprocess_result:
        raise ConfigError(f'{name}: {type(seg).__name__} has its own postprocess_result; label '
                          "maps reproduce mmseg's BaseSegmentor rule only")
    return seg


def use_label_map(model: nn.Module, *, chunk: int = DEFAULT_CHUNK,
                  keep_logits: bool = False) -> nn.Module:
    """Switch a built mmseg segmentor (or a wrapper of one) to :func:`label_map_postprocess`:
    sets the instance's ``postprocess_result`` (the class and the weights are unchanged).
    Returns ``model``. Undo: :func:`restore_postprocess`."""
    _check_options('use_label_map', chunk, keep_logits)
    seg = _segmentor(model, 'use_label_map')
    seg.postprocess_result = functools.partial(label_map_postprocess, seg, chunk=chunk,
                                               keep_logits=keep_logits)
    return model


def uses_label_map(model: nn.Module) -> bool:
    """Whether ``model`` post-processes with label maps (:func:`use_label_map` or the
    subclass)."""
    seg = _segmentor(model, 'uses_label_map')
    own = seg.__dict__.get('postprocess_result')
    return (isinstance(own, functools.partial) and own.func is label_map_postprocess) or \
        isinstance(seg, segmentor_class())


def restore_postprocess(model: nn.Module) -> nn.Module:
    """Undo :func:`use_label_map`: the class's ``postprocess_result`` again (mmseg's for an
    ``EncoderDecoder``). Returns ``model``; a model that was not switched is left as it is."""
    seg = _segmentor(model, 'restore_postprocess')
    own = seg.__dict__.get('postprocess_result')
    if isinstance(own, functools.partial) and own.func is label_map_postprocess:
        del seg.__dict__['postprocess_result']
    return model


__all__: List[str] = ['CLASS_NAME', 'label_map_postprocess', 'crop_and_flip',
                      'segmentor_class', 'build_label_map_segmentor', 'use_label_map',
                      'uses_label_map', 'restore_postprocess']
