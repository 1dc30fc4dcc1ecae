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
from typing import List, Optional, Tuple

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


def _shape_mask(kind: int, s: int, cy: int, cx: int, size: Tuple[int, int]) -> np.ndarray:
    """Boolean mask of a disk (1), square (2), triangle (3) or ring (4) of half size ``s``."""
    mask = np.zeros(size, np.uint8)
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
    return mask.astype(bool)


def _background(rng: np.random.Generator, size: Tuple[int, int]) -> np.ndarray:
    """A random two-colour gradient with Gaussian noise (float, H x W x 3)."""
    H, W = size
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * np.pi)
    t = ((np.cos(angle) * xx + np.sin(angle) * yy) / max(H, W) + 1) / 2
    img = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]
    return img + rng.normal(0, 12, img.shape)


def _draw(rng: np.random.Generator, size: Tuple[int, int], instances: Optional[list] = None):
    """One image and its label map; with ``instances`` (a list), also appends ``(kind,
    mask)`` for every shape in drawing order (kind 1..4; later shapes cover earlier ones)."""
    H, W = size
    img = _background(rng, size)
    label = np.ones((H, W), np.uint8)               # 1 = background
    for _ in range(rng.integers(2, 5)):
        kind = int(rng.integers(1, len(CLASSES)))   # 1..4 -> label kind + 1
        s = int(rng.integers(10, 20))               # half size
        cy, cx = int(rng.integers(s // 2, H - s // 2)), int(rng.integers(s // 2, W - s // 2))
        m = _shape_mask(kind, s, cy, cx, (H, W))
        img[m] = rng.uniform(0, 255, 3) + rng.normal(0, 4, (int(m.sum()), 3))
        label[m] = kind + 1
        if instances is not None:
            instances.append((kind, m))
    return np.clip(img, 0, 255).astype(np.uint8), label


def make_toy_shapes(root: str, num_train: int = 400, num_val: int = 60,
                    size: Tuple[int, int] = (64, 64), seed: int = 0) -> str:
    """Write the set under ``root`` (cached: skipped when ``root/manifest.json`` matches)."""
    manifest = dict(version=VERSION, num_train=num_train, num_val=num_val, size=list(size),
                    seed=seed)
    if _cached(root, manifest):
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
    _write_manifest(root, manifest)
    return root


def _visible_boxes(instances: List[tuple], min_area: int = 20) -> List[dict]:
    """COCO boxes of the visible part of each shape (later shapes cover earlier ones)."""
    anns = []
    covered = np.zeros_like(instances[0][1]) if instances else None
    for kind, m in reversed(instances):
        vis = m & ~covered
        covered |= m
        if vis.sum() < min_area:
            continue
        ys, xs = np.nonzero(vis)
        x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
        anns.append(dict(category_id=kind, bbox=[x0, y0, x1 - x0, y1 - y0],
                         area=int(vis.sum()), iscrowd=0))
    return anns[::-1]


def make_toy_shapes_coco(root: str, num_train: int = 400, num_val: int = 60,
                         size: Tuple[int, int] = (64, 64), seed: int = 0) -> str:
    """The detection version: the same images as :func:`make_toy_shapes` (same seed, same
    order) in the COCO-2017 layout, ``root/{train2017,val2017}/*.jpg`` and
    ``root/annotations/instances_{train,val}2017.json``; one box per shape around its visible
    pixels (shapes with fewer than 20 visible pixels are left out), categories 1..4 = disk,
    square, triangle, ring (``CLASSES[1:]``), ``iscrowd=0``, no masks. Cached like the
    segmentation set.
    """
    manifest = dict(version=VERSION, kind='coco', num_train=num_train, num_val=num_val,
                    size=list(size), seed=seed)
    if _cached(root, manifest):
        return root
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    ann_id = 1
    for split, n, first in (('train2017', num_train, 1), ('val2017', num_val, 100001)):
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, anns = [], []
        for i in range(n):
            inst: list = []
            img, _ = _draw(rng, size, inst)
            img_id = first + i
            name = f'{img_id:012d}.jpg'
            cv2.imwrite(osp.join(root, split, name), img[..., ::-1],
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
            images.append(dict(id=img_id, file_name=name, height=size[0], width=size[1]))
            for a in _visible_boxes(inst):
                anns.append(dict(a, id=ann_id, image_id=img_id))
                ann_id += 1
        data = dict(images=images, annotations=anns,
                    categories=[dict(id=k, name=c) for k, c in enumerate(CLASSES) if k])
        with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
            json.dump(data, f)
    _write_manifest(root, manifest)
    return root


def make_toy_shapes_cls(root: str, num_train: int = 400, num_val: int = 60,
                        size: Tuple[int, int] = (64, 64), seed: int = 0) -> str:
    """The classification version, in the ImageNet folder layout
    (``root/{train,val}/<class>/<name>.JPEG``): one shape per image, its kind the label
    (classes disk, square, triangle, ring in this order: the sorted folder names ``0_disk`` ..
    ``3_ring``), drawn as in the segmentation set (random position and colour on a noisy
    gradient background) but larger (half size 14-25 px), classes balanced in turn. Cached
    like the other versions.
    """
    manifest = dict(version=VERSION, kind='cls', num_train=num_train, num_val=num_val,
                    size=list(size), seed=seed)
    if _cached(root, manifest):
        return root
    rng = np.random.default_rng(seed + 1)
    for split, n in (('train', num_train), ('val', num_val)):
        for i in range(n):
            kind = i % 4 + 1
            img = _draw_one(rng, size, kind)
            folder = osp.join(root, split, f'{kind - 1}_{CLASSES[kind]}')
            os.makedirs(folder, exist_ok=True)
            cv2.imwrite(osp.join(folder, f'toy_{split}_{i + 1:08d}.JPEG'), img[..., ::-1],
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
    _write_manifest(root, manifest)
    return root


def _draw_one(rng: np.random.Generator, size: Tuple[int, int], kind: int) -> np.ndarray:
    """An image with one shape of ``kind`` (1..4) as :func:`_draw` paints them."""
    H, W = size
    img = _background(rng, size)
    s = int(rng.integers(14, 26))                       # larger than the segmentation set's
    cy, cx = int(rng.integers(s // 2, H - s // 2)), int(rng.integers(s // 2, W - s // 2))
    m = _shape_mask(kind, s, cy, cx, (H, W))
    # a colour far from the background's mean under the shape (the class is the outline)
    under = img[m].mean(0)
    color = np.where(under < 128, rng.uniform(170, 255, 3), rng.uniform(0, 85, 3))
    img[m] = color + rng.normal(0, 4, (int(m.sum()), 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _cached(root: str, manifest: dict) -> bool:
    mpath = osp.join(root, 'manifest.json')
    if osp.isfile(mpath):
        with open(mpath) as f:
            return json.load(f) == manifest
    return False


def _write_manifest(root: str, manifest: dict) -> None:
    with open(osp.join(root, 'manifest.json'), 'w') as f:
        json.dump(manifest, f)


def dataset_digest(root: str) -> str:
    """sha256 over the files of the set (to check a cached copy)."""
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            with open(osp.join(dirpath, name), 'rb') as f:
                h.update(name.encode())
                h.update(f.read())
    return h.hexdigest()
