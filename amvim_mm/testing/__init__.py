"""Helpers for tests and demos: tiny, deterministic datasets in the real on-disk layouts.

Nothing here is imported by ``import amvim_mm``; import :mod:`amvim_mm.testing` explicitly.
Only numpy and OpenCV are needed to write the data (no mmseg/mmdet/mmpretrain import).
"""
from .datasets import (ADE20K_NUM_CLASSES, COCO_CATEGORIES, IMAGENET_FIRST_WNIDS, make_ade20k,
                       make_coco, make_imagenet)

__all__ = [
    'make_ade20k', 'make_coco', 'make_imagenet', 'COCO_CATEGORIES', 'ADE20K_NUM_CLASSES',
    'IMAGENET_FIRST_WNIDS'
]
