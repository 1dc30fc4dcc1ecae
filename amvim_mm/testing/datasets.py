"""Write tiny, deterministic datasets in the real ADE20K / COCO / ImageNet layouts.

The files are what mmseg's ``ADE20KDataset``, mmdet's ``CocoDataset`` and mmpretrain's
``ImageNet`` / ``CustomDataset`` read, so configs written for the full datasets run on them after
changing only ``data_root`` (and the batch size). The images hold flat-colored shapes whose color
depends on the class (the same class color in every image and every call), plus a little noise, so
a model can actually learn something from a few iterations. Everything is deterministic given
``seed`` (same numpy/OpenCV versions give byte-identical files).

Layouts (``size`` is ``(height, width)`` everywhere):

* :func:`make_ade20k` (ADEChallengeData2016)::

      root/images/training/ADE_train_00000001.jpg      RGB image (JPEG)
      root/images/validation/ADE_val_00000001.jpg
      root/annotations/training/ADE_train_00000001.png 8-bit single-channel labels:
      root/annotations/validation/ADE_val_00000001.png 0 = "other"/ignored, 1..150 = classes

  mmseg::

      dict(type='ADE20KDataset', data_root=root,
           data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
           pipeline=[dict(type='LoadImageFromFile'),
                     dict(type='LoadAnnotations', reduce_zero_label=True), ...])

  ``reduce_zero_label=True`` maps 0 -> 255 (ignored) and k -> k - 1 (0..149).

* :func:`make_coco` (COCO 2017 instances)::

      root/train2017/000000000001.jpg
      root/val2017/000000100001.jpg
      root/annotations/instances_train2017.json   bbox [x, y, w, h], polygon segmentation,
      root/annotations/instances_val2017.json     area, iscrowd=0, the 80 COCO categories

  mmdet::

      dict(type='CocoDataset', data_root=root, ann_file='annotations/instances_train2017.json',
           data_prefix=dict(img='train2017/'), pipeline=[...])

* :func:`make_imagenet` (mmpretrain's ImageNet layout)::

      root/train/n01440764/n01440764_1.JPEG
      root/val/ILSVRC2012_val_00000001.JPEG
      root/meta/train.txt   "n01440764/n01440764_1.JPEG 0" per line
      root/meta/val.txt     "ILSVRC2012_val_00000001.JPEG 0" per line

  mmpretrain::

      dict(type='ImageNet', data_root=root, split='train')      # reads meta/train.txt
      dict(type='CustomDataset', data_root=root, ann_file='meta/val.txt', data_prefix='val',
           classes=[...num_classes names...])                  # or without ``classes``

  ``ImageNet`` keeps its 1000 ImageNet-1k class names as metainfo; the labels come from the
  ann file (0..num_classes-1; with the default ``num_classes <= 10`` the first wnids are the real
  first ImageNet-1k wnids, so the names even match). For a head with ``num_classes`` outputs use
  ``CustomDataset`` with ``classes`` given (``ann_file`` + ``data_prefix``), or without
  ``ann_file``: ``CustomDataset(data_root=root, data_prefix='train')`` finds the classes from the
  sub-folders (the val folder is flat, so it needs the ann file).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np

from amvim_mm.errors import ConfigError

PathLike = Union[str, os.PathLike]

ADE20K_NUM_CLASSES = 150

# The 80 COCO 2017 detection categories: (id, name, supercategory), ids as in the official
# annotation files (not contiguous). Names and order equal mmdet's ``CocoDataset.METAINFO``.
COCO_CATEGORIES: Tuple[Tuple[int, str, str], ...] = (
    (1, 'person', 'person'), (2, 'bicycle', 'vehicle'), (3, 'car', 'vehicle'),
    (4, 'motorcycle', 'vehicle'), (5, 'airplane', 'vehicle'), (6, 'bus', 'vehicle'),
    (7, 'train', 'vehicle'), (8, 'truck', 'vehicle'), (9, 'boat', 'vehicle'),
    (10, 'traffic light', 'outdoor'), (11, 'fire hydrant', 'outdoor'),
    (13, 'stop sign', 'outdoor'), (14, 'parking meter', 'outdoor'), (15, 'bench', 'outdoor'),
    (16, 'bird', 'animal'), (17, 'cat', 'animal'), (18, 'dog', 'animal'), (19, 'horse', 'animal'),
    (20, 'sheep', 'animal'), (21, 'cow', 'animal'), (22, 'elephant', 'animal'),
    (23, 'bear', 'animal'), (24, 'zebra', 'animal'), (25, 'giraffe', 'animal'),
    (27, 'backpack', 'accessory'), (28, 'umbrella', 'accessory'), (31, 'handbag', 'accessory'),
    (32, 'tie', 'accessory'), (33, 'suitcase', 'accessory'), (34, 'frisbee', 'sports'),
    (35, 'skis', 'sports'), (36, 'snowboard', 'sports'), (37, 'sports ball', 'sports'),
    (38, 'kite', 'sports'), (39, 'baseball bat', 'sports'), (40, 'baseball glove', 'sports'),
    (41, 'skateboard', 'sports'), (42, 'surfboard', 'sports'), (43, 'tennis racket', 'sports'),
    (44, 'bottle', 'kitchen'), (46, 'wine glass', 'kitchen'), (47, 'cup', 'kitchen'),
    (48, 'fork', 'kitchen'), (49, 'knife', 'kitchen'), (50, 'spoon', 'kitchen'),
    (51, 'bowl', 'kitchen'), (52, 'banana', 'food'), (53, 'apple', 'food'),
    (54, 'sandwich', 'food'), (55, 'orange', 'food'), (56, 'broccoli', 'food'),
    (57, 'carrot', 'food'), (58, 'hot dog', 'food'), (59, 'pizza', 'food'), (60, 'donut', 'food'),
    (61, 'cake', 'food'), (62, 'chair', 'furniture'), (63, 'couch', 'furniture'),
    (64, 'potted plant', 'furniture'), (65, 'bed', 'furniture'),
    (67, 'dining table', 'furniture'), (70, 'toilet', 'furniture'), (72, 'tv', 'electronic'),
    (73, 'laptop', 'electronic'), (74, 'mouse', 'electronic'), (75, 'remote', 'electronic'),
    (76, 'keyboard', 'electronic'), (77, 'cell phone', 'electronic'),
    (78, 'microwave', 'appliance'), (79, 'oven', 'appliance'), (80, 'toaster', 'appliance'),
    (81, 'sink', 'appliance'), (82, 'refrigerator', 'appliance'), (84, 'book', 'indoor'),
    (85, 'clock', 'indoor'), (86, 'vase', 'indoor'), (87, 'scissors', 'indoor'),
    (88, 'teddy bear', 'indoor'), (89, 'hair drier', 'indoor'), (90, 'toothbrush', 'indoor'))

# The first ImageNet-1k wnids in the standard (sorted) label order: tench, goldfish, great white
# shark, tiger shark, hammerhead, electric ray, stingray, cock, hen, ostrich.
IMAGENET_FIRST_WNIDS = ('n01440764', 'n01443537', 'n01484850', 'n01491361', 'n01494475',
                        'n01496331', 'n01498041', 'n01514668', 'n01514859', 'n01518878')

# Image ids of val2017 start here so that ids are unique across the two splits, as in COCO.
_COCO_VAL_ID_OFFSET = 100000


def _palette(num: int) -> np.ndarray:
    """``num`` fixed, well-separated RGB colors (independent of any seed)."""
    # Golden-ratio hues with alternating saturation/value: neighbours differ clearly.
    hues = (np.arange(num) * 0.618033988749895) % 1.0
    sat = np.where(np.arange(num) % 2 == 0, 0.9, 0.6)
    val = np.where((np.arange(num) // 2) % 2 == 0, 0.95, 0.7)
    hsv = np.stack([hues * 180, sat * 255, val * 255], axis=-1).astype(np.uint8)[None]
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0].astype(np.int16)


def _check_size(size: Sequence[int]) -> Tuple[int, int]:
    h, w = (int(s) for s in size)
    if h < 16 or w < 16:
        raise ConfigError(f'size must be at least (16, 16), got {tuple(size)}')
    return h, w


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Dim gray noise: the "unlabelled" part of an image."""
    return rng.integers(40, 90, size=(h, w, 3)).astype(np.int16)


def _paint(img: np.ndarray, mask: np.ndarray, color: np.ndarray,
           rng: np.random.Generator) -> None:
    noise = rng.integers(-8, 9, size=(int(mask.sum()), 3))
    img[mask] = color[None, :] + noise


def _write_rgb(path: Path, img: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    bgr = np.clip(img, 0, 255).astype(np.uint8)[..., ::-1]
    if not cv2.imwrite(str(path), np.ascontiguousarray(bgr), [cv2.IMWRITE_JPEG_QUALITY, 95]):
        raise OSError(f'could not write {path}')


def _random_shape_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A filled rectangle or disk covering a fair part of the image."""
    mask = np.zeros((h, w), dtype=bool)
    if rng.random() < 0.5:
        bh = int(rng.integers(h // 4, h // 2 + 1))
        bw = int(rng.integers(w // 4, w // 2 + 1))
        y0 = int(rng.integers(0, h - bh + 1))
        x0 = int(rng.integers(0, w - bw + 1))
        mask[y0:y0 + bh, x0:x0 + bw] = True
    else:
        r = int(rng.integers(min(h, w) // 8, min(h, w) // 4 + 1))
        cy = int(rng.integers(r, h - r))
        cx = int(rng.integers(r, w - r))
        yy, xx = np.mgrid[:h, :w]
        mask[(yy - cy)**2 + (xx - cx)**2 <= r * r] = True
    return mask


# --------------------------------------------------------------------------------------------
# ADE20K
# --------------------------------------------------------------------------------------------


def make_ade20k(root: PathLike,
                num_train: int = 4,
                num_val: int = 2,
                size: Sequence[int] = (64, 64),
                num_classes: int = ADE20K_NUM_CLASSES,
                seed: int = 0) -> str:
    """Write a tiny ADEChallengeData2016-style segmentation dataset under ``root``.

    Each image has a dim noisy background (label 0, ignored by mmseg with
    ``reduce_zero_label=True``) and 2-4 rectangles/disks of classes drawn from ``1..num_classes``
    (label value = class index + 1, as in ADE20K), each painted in its fixed class color.

    Args:
        root: dataset root (created if missing).
        num_train / num_val: number of training / validation images.
        size: ``(height, width)`` of every image.
        num_classes: classes take label values ``1..num_classes`` (at most 255; ADE20K: 150).
        seed: random seed; the same arguments give the same files.

    Returns:
        ``root`` as a string.
    """
    h, w = _check_size(size)
    if not 1 <= num_classes <= 254:
        raise ConfigError(f'num_classes must be in 1..254, got {num_classes}')
    root = Path(root)
    palette = _palette(num_classes + 1)
    rng = np.random.default_rng(seed)
    for split, prefix, count in (('training', 'ADE_train', num_train),
                                 ('validation', 'ADE_val', num_val)):
        img_dir = root / 'images' / split
        ann_dir = root / 'annotations' / split
        img_dir.mkdir(parents=True, exist_ok=True)
        ann_dir.mkdir(parents=True, exist_ok=True)
        for i in range(1, count + 1):
            img = _background(rng, h, w)
            label = np.zeros((h, w), dtype=np.uint8)
            for _ in range(int(rng.integers(2, 5))):
                cls = int(rng.integers(1, num_classes + 1))
                mask = _random_shape_mask(rng, h, w)
                _paint(img, mask, palette[cls], rng)
                label[mask] = cls
            name = f'{prefix}_{i:08d}'
            _write_rgb(img_dir / f'{name}.jpg', img)
            # Single-channel 8-bit PNG (PIL mode 'L'), as the real annotations.
            if not cv2.imwrite(str(ann_dir / f'{name}.png'), label):
                raise OSError(f'could not write {ann_dir / name}.png')
    return str(root)


# --------------------------------------------------------------------------------------------
# COCO
# --------------------------------------------------------------------------------------------


def _polygon_area(xy: np.ndarray) -> float:
    x, y = xy[:, 0], xy[:, 1]
    return float(0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _random_polygon(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Vertices (N, 2) in pixel-edge coordinates of a rectangle or a 16-gon "disk"."""
    if rng.random() < 0.5:
        bh = int(rng.integers(max(4, h // 6), h // 2 + 1))
        bw = int(rng.integers(max(4, w // 6), w // 2 + 1))
        y0 = int(rng.integers(0, h - bh + 1))
        x0 = int(rng.integers(0, w - bw + 1))
        return np.array([[x0, y0], [x0 + bw, y0], [x0 + bw, y0 + bh], [x0, y0 + bh]],
                        dtype=np.float64)
    r = float(rng.integers(max(3, min(h, w) // 10), min(h, w) // 4 + 1))
    cy = float(rng.integers(int(r), int(h - r) + 1))
    cx = float(rng.integers(int(r), int(w - r) + 1))
    t = np.arange(16) * (2 * np.pi / 16)
    xy = np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=-1)
    # Integer vertices: exactly what is drawn is what is annotated.
    xy = np.round(xy)
    xy[:, 0] = np.clip(xy[:, 0], 0, w)
    xy[:, 1] = np.clip(xy[:, 1], 0, h)
    return xy


def _coco_split(img_dir: Path, rng: np.random.Generator, num_images: int, h: int, w: int,
                first_img_id: int, first_ann_id: int, palette: np.ndarray) -> Dict:
    images: List[Dict] = []
    annotations: List[Dict] = []
    ann_id = first_ann_id
    img_dir.mkdir(parents=True, exist_ok=True)
    for k in range(num_images):
        img_id = first_img_id + k
        file_name = f'{img_id:012d}.jpg'
        img = _background(rng, h, w)
        for _ in range(int(rng.integers(1, 4))):
            cat_index = int(rng.integers(0, len(COCO_CATEGORIES)))
            cat_id = COCO_CATEGORIES[cat_index][0]
            xy = _random_polygon(rng, h, w)
            mask = np.zeros((h, w), dtype=np.uint8)
            if len(xy) == 4:  # rectangle: fill the pixels [x0, x1) x [y0, y1)
                x0, y0 = xy[0].astype(int)
                x1, y1 = xy[2].astype(int)
                mask[y0:y1, x0:x1] = 1
            else:
                cv2.fillPoly(mask, [xy.astype(np.int32)], 1)
            _paint(img, mask.astype(bool), palette[cat_index], rng)
            x_min, y_min = xy.min(axis=0)
            x_max, y_max = xy.max(axis=0)
            annotations.append(
                dict(
                    id=ann_id,
                    image_id=img_id,
                    category_id=cat_id,
                    segmentation=[[float(v) for v in xy.reshape(-1)]],
                    area=_polygon_area(xy),
                    bbox=[float(x_min), float(y_min), float(x_max - x_min), float(y_max - y_min)],
                    iscrowd=0))
            ann_id += 1
        _write_rgb(img_dir / file_name, img)
        images.append(
            dict(id=img_id, file_name=file_name, height=h, width=w, license=1,
                 date_captured='2017-01-01 00:00:00'))
    return dict(
        info=dict(description='amvim_mm synthetic COCO-format dataset', version='1.0',
                  year=2017, contributor='amvim_mm.testing', date_created='2017/01/01'),
        licenses=[dict(id=1, name='CC0', url='')],
        images=images,
        annotations=annotations,
        categories=[dict(id=i, name=n, supercategory=s) for i, n, s in COCO_CATEGORIES])


def make_coco(root: PathLike,
              num_images: int = 4,
              size: Sequence[int] = (64, 64),
              seed: int = 0) -> str:
    """Write a tiny COCO-2017-style instance dataset (train2017 and val2017) under ``root``.

    Both splits get ``num_images`` images with 1-3 objects each (rectangles and 16-gon disks,
    painted in a fixed color per category); every object has a ``bbox`` (``[x, y, w, h]``), a
    polygon ``segmentation``, its polygon ``area`` and ``iscrowd=0``. ``categories`` lists the
    80 COCO categories with their official ids, so mmdet's ``CocoDataset`` maps them to labels
    0..79 by name. Image ids are unique across the splits (val starts at 100001).

    Returns:
        ``root`` as a string.
    """
    h, w = _check_size(size)
    root = Path(root)
    palette = _palette(len(COCO_CATEGORIES))
    rng = np.random.default_rng(seed)
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    ann_id = 1
    for split, first_img_id in (('train2017', 1), ('val2017', _COCO_VAL_ID_OFFSET + 1)):
        data = _coco_split(root / split, rng, num_images, h, w, first_img_id, ann_id, palette)
        ann_id += len(data['annotations'])
        with open(root / 'annotations' / f'instances_{split}.json', 'w') as f:
            json.dump(data, f)
    return str(root)


# --------------------------------------------------------------------------------------------
# ImageNet
# --------------------------------------------------------------------------------------------


def _wnids(num_classes: int) -> List[str]:
    """Sorted wnid-like folder names (sorted order = label order, as in ImageNet)."""
    wnids = list(IMAGENET_FIRST_WNIDS[:num_classes])
    # Beyond the known ones: made-up ids that sort after them.
    wnids += [f'n9{i:07d}' for i in range(num_classes - len(wnids))]
    return wnids


def make_imagenet(root: PathLike,
                  num_classes: int = 3,
                  per_class: int = 2,
                  size: Sequence[int] = (64, 64),
                  seed: int = 0) -> str:
    """Write a tiny ImageNet-style classification dataset under ``root`` (mmpretrain layout).

    ``per_class`` images per class in ``train/<wnid>/`` and as many in the flat ``val/`` folder,
    with ``meta/train.txt`` and ``meta/val.txt`` ("relative/path label" per line). Class ``k``
    shows a big disk or square of its fixed color on a noisy background. See the module
    docstring for how to load it.

    Returns:
        ``root`` as a string.
    """
    h, w = _check_size(size)
    if num_classes < 1 or per_class < 1:
        raise ConfigError('num_classes and per_class must be >= 1')
    root = Path(root)
    palette = _palette(num_classes)
    rng = np.random.default_rng(seed)
    wnids = _wnids(num_classes)

    def draw(label: int) -> np.ndarray:
        img = _background(rng, h, w)
        _paint(img, _random_shape_mask(rng, h, w), palette[label], rng)
        return img

    train_lines, val_lines = [], []
    for label, wnid in enumerate(wnids):
        for j in range(1, per_class + 1):
            rel = f'{wnid}/{wnid}_{j}.JPEG'
            _write_rgb(root / 'train' / rel, draw(label))
            train_lines.append(f'{rel} {label}')
    # Validation images are flat and numbered in an interleaved class order, as in ILSVRC2012.
    val_labels = [label for _ in range(per_class) for label in range(num_classes)]
    for idx, label in enumerate(val_labels, start=1):
        name = f'ILSVRC2012_val_{idx:08d}.JPEG'
        _write_rgb(root / 'val' / name, draw(label))
        val_lines.append(f'{name} {label}')
    (root / 'meta').mkdir(parents=True, exist_ok=True)
    (root / 'meta' / 'train.txt').write_text('\n'.join(train_lines) + '\n')
    (root / 'meta' / 'val.txt').write_text('\n'.join(val_lines) + '\n')
    return str(root)
