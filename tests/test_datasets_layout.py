"""The synthetic datasets of amvim_mm.testing load with the real mmseg/mmdet/mmpretrain classes."""
import filecmp
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from mmengine.registry import DefaultScope

from amvim_mm.testing import COCO_CATEGORIES, make_ade20k, make_coco, make_imagenet


def _files(root):
    return sorted(p.relative_to(root) for p in Path(root).rglob('*') if p.is_file())


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize('maker', [make_ade20k, make_coco, make_imagenet])
def test_builders_are_deterministic(tmp_path, maker):
    a = maker(tmp_path / 'a', seed=3)
    b = maker(tmp_path / 'b', seed=3)
    c = maker(tmp_path / 'c', seed=4)
    files = _files(a)
    assert files and files == _files(b) == _files(c)
    for f in files:
        assert filecmp.cmp(Path(a) / f, Path(b) / f, shallow=False), f
    assert any(not filecmp.cmp(Path(a) / f, Path(c) / f, shallow=False) for f in files)


# ---------------------------------------------------------------------------------------------
# ADE20K -> mmseg ADE20KDataset
# ---------------------------------------------------------------------------------------------


# mmseg warns whenever LoadAnnotations gets ``reduce_zero_label`` explicitly (the dataset's
# value is used when it is left as None); both spellings are tested.
_REDUCE_ZERO_WARNING = 'ignore:`reduce_zero_label` will be deprecated:UserWarning'


def _ade_cfg(root, split, reduce_zero_label=True):
    return dict(
        type='ADE20KDataset',
        data_root=root,
        data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', reduce_zero_label=reduce_zero_label),
            dict(type='PackSegInputs')
        ])


@pytest.mark.filterwarnings(_REDUCE_ZERO_WARNING)
@pytest.mark.parametrize('reduce_zero_label', [True, None])
def test_ade20k_layout_loads_in_mmseg(tmp_ade20k, reduce_zero_label):
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)

    assert sorted(os.listdir(tmp_ade20k)) == ['annotations', 'images']
    with DefaultScope.overwrite_default_scope('mmseg'):
        train = DATASETS.build(_ade_cfg(tmp_ade20k, 'training', reduce_zero_label))
        val = DATASETS.build(_ade_cfg(tmp_ade20k, 'validation', reduce_zero_label))
        assert len(train) == 4 and len(val) == 2
        assert len(train.metainfo['classes']) == 150
        seen = set()
        for ds in (train, val):
            for i in range(len(ds)):
                item = ds[i]
                assert tuple(item['inputs'].shape) == (3, 64, 64)
                gt = item['data_samples'].gt_sem_seg.data.numpy()
                assert gt.shape == (1, 64, 64)
                raw = np.array(Image.open(item['data_samples'].seg_map_path))
                assert raw.ndim == 2 and raw.dtype == np.uint8 and raw.max() <= 150
                # reduce_zero_label: 0 -> 255 (ignored), k -> k - 1.
                expected = np.where(raw == 0, 255, raw.astype(np.int64) - 1)
                np.testing.assert_array_equal(gt[0], expected)
                values = set(np.unique(gt).tolist())
                assert 255 in values and values - {255}
                assert all(0 <= v < 150 for v in values - {255})
                seen |= values - {255}
        assert len(seen) > 3


def test_ade20k_images_show_the_classes(tmp_path):
    """Pixels of one class have (about) the same color everywhere: something to learn."""
    import cv2
    root = make_ade20k(tmp_path, num_train=6, num_val=0, num_classes=3, seed=1)
    colors = {}
    for img_path in sorted(Path(root, 'images', 'training').glob('*.jpg')):
        img = cv2.imread(str(img_path))[..., ::-1].astype(np.float64)
        label = cv2.imread(str(Path(root, 'annotations', 'training', img_path.stem + '.png')),
                           cv2.IMREAD_UNCHANGED)
        assert label is not None and label.ndim == 2
        for cls in np.unique(label):
            inner = cv2.erode((label == cls).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
            if inner.sum() > 20:
                colors.setdefault(int(cls), []).append(img[inner].mean(axis=0))
    assert set(colors) - {0}
    for cls, means in colors.items():
        if cls:
            assert np.ptp(np.stack(means), axis=0).max() < 25, (cls, means)
            assert np.abs(np.mean(means, axis=0) - np.mean(colors[0], axis=0)).max() > 30


# ---------------------------------------------------------------------------------------------
# COCO -> mmdet CocoDataset
# ---------------------------------------------------------------------------------------------


def test_coco_categories_match_mmdet():
    from mmdet.datasets import CocoDataset
    assert tuple(n for _, n, _ in COCO_CATEGORIES) == tuple(CocoDataset.METAINFO['classes'])
    ids = [i for i, _, _ in COCO_CATEGORIES]
    assert len(ids) == 80 and ids == sorted(ids) and ids[-1] == 90


# pycocotools (2.0.x) + numpy 2: "__array__ implementation doesn't accept a copy keyword"
@pytest.mark.filterwarnings('ignore:__array__ implementation:DeprecationWarning')
@pytest.mark.parametrize('split', ['train2017', 'val2017'])
def test_coco_layout_loads_in_mmdet(tmp_coco, split):
    from mmdet.registry import DATASETS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)

    ann_file = Path(tmp_coco, 'annotations', f'instances_{split}.json')
    raw = json.loads(ann_file.read_text())
    assert {'images', 'annotations', 'categories'} <= set(raw)
    cfg = dict(
        type='CocoDataset',
        data_root=tmp_coco,
        ann_file=f'annotations/instances_{split}.json',
        data_prefix=dict(img=f'{split}/'),
        test_mode=split == 'val2017',
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='PackDetInputs')
        ])
    with DefaultScope.overwrite_default_scope('mmdet'):
        ds = DATASETS.build(cfg)
        assert len(ds) == 4
        assert ds.cat_ids == [i for i, _, _ in COCO_CATEGORIES]
        names = ds.metainfo['classes']
        id_of = {n: i for i, n, _ in COCO_CATEGORIES}
        n_objects = 0
        for i in range(len(ds)):
            item = ds[i]
            sample = item['data_samples']
            assert tuple(item['inputs'].shape) == (3, 64, 64)
            anns = [a for a in raw['annotations'] if a['image_id'] == sample.img_id]
            inst = sample.gt_instances
            labels = inst.labels.tolist()
            assert 1 <= len(labels) == len(anns) <= 3
            assert all(0 <= lab < 80 for lab in labels)
            # labels map back to the annotated category ids (by name, as mmdet does)
            assert [id_of[names[lab]] for lab in labels] == [a['category_id'] for a in anns]
            bboxes = inst.bboxes.tensor.numpy()
            expected = np.array([a['bbox'] for a in anns])
            expected[:, 2:] += expected[:, :2]  # xywh -> xyxy
            np.testing.assert_allclose(bboxes, expected)
            masks = inst.masks.to_ndarray()
            assert masks.shape == (len(anns), 64, 64)
            for mask, ann in zip(masks, anns, strict=True):
                assert ann['iscrowd'] == 0
                assert abs(int(mask.sum()) - ann['area']) <= 0.15 * ann['area'] + 8
            n_objects += len(labels)
        assert n_objects >= 4


# ---------------------------------------------------------------------------------------------
# ImageNet -> mmpretrain ImageNet / CustomDataset
# ---------------------------------------------------------------------------------------------

_CLS_PIPELINE = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]


def _labels(ds):
    out = []
    for i in range(len(ds)):
        item = ds[i]
        assert tuple(item['inputs'].shape) == (3, 64, 64)
        out.append(int(item['data_samples'].gt_label))
    return out


@pytest.mark.parametrize('split', ['train', 'val'])
def test_imagenet_layout_loads_in_mmpretrain(tmp_imagenet, split):
    from mmpretrain.registry import DATASETS
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)

    with DefaultScope.overwrite_default_scope('mmpretrain'):
        # ImageNet finds meta/<split>.txt itself; its metainfo keeps the 1000 ImageNet names.
        inet = DATASETS.build(dict(type='ImageNet', data_root=tmp_imagenet, split=split,
                                   pipeline=_CLS_PIPELINE))
        assert len(inet) == 6
        assert len(inet.metainfo['classes']) == 1000
        assert sorted(_labels(inet)) == [0, 0, 1, 1, 2, 2]
        # the first wnids are the real first ImageNet-1k classes
        assert inet.metainfo['classes'][0].startswith('tench')

        # CustomDataset with ann_file + data_prefix and explicit classes
        custom = DATASETS.build(
            dict(type='CustomDataset', data_root=tmp_imagenet, ann_file=f'meta/{split}.txt',
                 data_prefix=split, classes=['a', 'b', 'c'], pipeline=_CLS_PIPELINE))
        assert len(custom) == 6 and custom.metainfo['classes'] == ('a', 'b', 'c')
        assert _labels(custom) == _labels(inet)


def test_imagenet_train_folder_loads_without_ann_file(tmp_imagenet):
    from mmpretrain.registry import DATASETS
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)

    lines = Path(tmp_imagenet, 'meta', 'train.txt').read_text().split('\n')
    from_file = {ln.rsplit(' ', 1)[0]: int(ln.rsplit(' ', 1)[1]) for ln in lines if ln}
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        ds = DATASETS.build(dict(type='CustomDataset', data_root=tmp_imagenet,
                                 data_prefix='train', pipeline=_CLS_PIPELINE))
        assert len(ds) == 6
        assert list(ds.metainfo['classes']) == sorted(os.listdir(Path(tmp_imagenet, 'train')))
        for info in ds.load_data_list():
            rel = os.path.relpath(info['img_path'], Path(tmp_imagenet, 'train'))
            assert from_file[rel.replace(os.sep, '/')] == info['gt_label']
