"""Segmentation post-processing: per-pixel labels at the image's size without the resized
logits (:func:`label_map`), the ``LabelMapEncoderDecoder`` type and :func:`use_label_map` for
a built mmseg segmentor. Importing this package registers the type (mmseg is imported when one
is built, not here)."""
from .label_map import DEFAULT_CHUNK, chunk_bounds, label_map
from .label_map_segmentor import (label_map_postprocess, restore_postprocess, segmentor_class,
                                  use_label_map, uses_label_map)

__all__ = ['DEFAULT_CHUNK', 'chunk_bounds', 'label_map', 'label_map_postprocess',
           'segmentor_class', 'use_label_map', 'uses_label_map', 'restore_postprocess']
