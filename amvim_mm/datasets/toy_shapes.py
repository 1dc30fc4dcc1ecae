"""Toy shapes: a small, deterministic segmentation set in the ADE20K folder layout.

Every 64x64 image holds 2-4 flat shapes (disk, square, triangle, ring) of random size, position
and color on a random smooth, noisy background. The color says nothing about the class: a pixel
or a single patch cannot tell a disk from a square, the shape around it can. So a model has to
use spatial context to score well, and a token reducer that breaks the scan's neighbourhoods
costs accuracy, which is what the demo measures.

Layout (as ADEChallengeData2016)::

    root/images/{training,validation}/toy_{split}_00000001.jpg
    root/annotations/{training,validation}/toy_{split}_00000001.png   0 = ignored (unused),
                                                                       1 = background, 2.. shapes

``ToyShapesDataset`` is mmseg's ``BaseSegDataset`` with these classes and
``reduce_zero_label=True`` (labels 1.. become 0..).
"""
from __future__ import annotations

import hashlib
import json
import os
import os.path as osp
from typing import Tuple

import cv2
import numpy as np
from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

CLASSES = ('background', 'disk', 'square', 'triangle', 'ring')
PALETTE = [[120, 120, 120], [230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48]]
VERSION = 1


@DATASETS.register_module()
class ToyShapesDataset(BaseSegDataset):
    """The demo's toy shapes in the ADE20K layout (see :func:`make_toy_shapes`)."""

    METAINFO = dict(classes=CLASSES, palette=PALETTE)

    def __init__(self, img_suffix: str = '.jpg', seg_map_suffix: str = '.png',
                 reduce_zero_label: bool = True, **kwargs) -> None:
        super().__init__(img_suffix=img_suffix, seg_map_suffix=seg_map_suffix,
                         reduce_zero_label=reduce_zero_label, **kwargs)


def _draw(rng: np.random.Generator, size: Tuple[int, int]):
    H, W = size
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * np.pi)
    t = ((np.cos(angle) * xx + np.sin(angle) * yy) / max(H, W) + 1) / 2
    img = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]
    img += rng.normal(0, 12, img.shape)
    label = np.ones((H, W), np.uint8)               # 1 = background
    for _ in range(rng.integers(2, 5)):
        kind = int(rng.integers(1, len(CLASSES)))   # 1..4 -> label kind + 1
        s = int(rng.integers(10, 20))               # half size
        cy, cx = int(rng.integers(s // 2, H - s // 2)), int(rng.integers(s // 2, W - s // 2))
        mask = np.zeros((H, W), np.uint8)
        if kind == 1:
            cv2.circle(mask, (cx, cy), s, 1, -1)
        elif kind == 2:
            cv2.rectangle(mask, (cx - s, cy - s), (cx + s, cy + s), 1, -1)
        elif kind == 3:
            pts = np.array([[cx, cy - s], [cx - s, cy + s], [cx + s, cy + s]], np.int32)
            cv2.fillPoly(mask, [pts], 1)
        else:
            cv2.circle(mask, (cx, cy), s, 1, -1)
            cv2.circle(mask, (cx, cy), max(s // 2, 2), 0, -1)
        m = mask.astype(bool)
        img[m] = rng.uniform(0, 255, 3) + rng.normal(0, 4, (int(m.sum()), 3))
        label[m] = kind + 1
    return np.clip(img, 0, 255).astype(np.uint8), label


def make_toy_shapes(root: str, num_train: int = 400, num_val: int = 60,
                    size: Tuple[int, int] = (64, 64), seed: int = 0) -> str:
    """Write the set under ``root`` (cached: skipped when ``root/manifest.json`` matches)."""
    manifest = dict(version=VERSION, num_train=num_train, num_val=num_val, size=list(size),
                    seed=seed)
    mpath = osp.join(root, 'manifest.json')
    if osp.isfile(mpath):
        with open(mpath) as f:
            if json.load(f) == manifest:
                return root
    rng = np.random.default_rng(seed)
    for split, n in (('training', num_train), ('validation', num_val)):
        img_dir = osp.join(root, 'images', split)
        ann_dir = osp.join(root, 'annotations', split)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        for i in range(1, n + 1):
            img, label = _draw(rng, size)
            name = f'toy_{split[:5]}_{i:08d}'
            cv2.imwrite(osp.join(img_dir, name + '.jpg'), img[..., ::-1],
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(osp.join(ann_dir, name + '.png'), label)
    with open(mpath, 'w') as f:
        json.dump(manifest, f)
    return root


def dataset_digest(root: str) -> str:
    """sha256 over the files of the set (to check a cached copy)."""
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            with open(osp.join(dirpath, name), 'rb') as f:
                h.update(name.encode())
                h.update(f.read())
    return h.hexdigest()
