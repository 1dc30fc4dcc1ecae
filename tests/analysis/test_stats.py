"""Per-image statistics and the bootstrap: the recomputed metrics equal the libraries' own
computation on all images, and a weight of 2 equals the image duplicated."""
import contextlib
import io

import numpy as np
import pytest
import torch

from amvim_mm.analysis import stats as S


def _coco(num_images=7, num_cats=3, seed=0):
    """A small COCO ground truth and noisy detections (some missed, some false)."""
    from mmdet.datasets.api_wrappers import COCO
    rng = np.random.default_rng(seed)
    images, anns, dets = [], [], []
    for i in range(1, num_images + 1):
        images.append(dict(id=i, width=100, height=100, file_name=f'{i}.png'))
        for _ in range(rng.integers(0, 5)):
            x, y, w, h = rng.uniform(0, 60, 2).tolist() + rng.uniform(8, 40, 2).tolist()
            c = int(rng.integers(1, num_cats + 1))
            anns.append(dict(id=len(anns) + 1, image_id=i, category_id=c, bbox=[x, y, w, h],
                             area=w * h, iscrowd=0))
            if rng.random() < 0.8:   # detected, with jitter
                j = rng.normal(0, 4, 4)
                dets.append(dict(image_id=i, category_id=c, score=float(rng.random()),
                                 bbox=[x + j[0], y + j[1], max(2, w + j[2]), max(2, h + j[3])]))
        for _ in range(rng.integers(0, 3)):     # false positives
            x, y = rng.uniform(0, 80, 2).tolist()
            dets.append(dict(image_id=i, category_id=int(rng.integers(1, num_cats + 1)),
                             score=float(rng.random()), bbox=[x, y, 15.0, 15.0]))
    data = dict(images=images, annotations=anns,
                categories=[dict(id=c, name=str(c)) for c in range(1, num_cats + 1)])
    gt = COCO()
    gt.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt, data, dets


def _pycocotools_ap(gt, dets, max_dets=(100, 300, 1000)):
    from mmdet.datasets.api_wrappers import COCOeval
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(dets), 'bbox')
        ev.params.maxDets = list(max_dets)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats[0]


def test_coco_ap_equals_pycocotools_and_weights_equal_duplicates():
    from mmdet.datasets.api_wrappers import COCO
    gt, data, dets = _coco()
    ids = [im['id'] for im in data['images']]
    rec = S.coco_match_records(gt, dets, ids, [1, 2, 3], np.linspace(.5, .95, 10), 1000)
    mine = S.metric_values(rec, np.ones((1, len(ids))))[0]
    assert mine == pytest.approx(_pycocotools_ap(gt, dets), abs=1e-9)
    # weights (0, 2, 1, 3, ...) == a data set with images dropped / repeated under new ids
    w = np.array([0, 2, 1, 3, 1, 0, 2], dtype=float)
    images, anns, ddets = [], [], []
    for i, times in zip(ids, w.astype(int), strict=True):
        for t in range(times):
            new = i * 10 + t
            images.append(dict(id=new, width=100, height=100, file_name=f'{new}.png'))
            anns += [dict(a, id=len(anns) + n + 1, image_id=new) for n, a in
                     enumerate(x for x in data['annotations'] if x['image_id'] == i)]
            ddets += [dict(d, image_id=new) for d in dets if d['image_id'] == i]
    dup = COCO()
    dup.dataset = dict(data, images=images, annotations=anns)
    with contextlib.redirect_stdout(io.StringIO()):
        dup.createIndex()
    assert S.metric_values(rec, w[None])[0] == pytest.approx(_pycocotools_ap(dup, ddets),
                                                             abs=1e-9)


def test_coco_ap_rows_equal_the_one_row_reference_bit_for_bit():
    """The bootstrap's all-replicates AP (:func:`coco_ap_rows`) equals :func:`coco_ap` row by
    row exactly: bootstrap counts (images drawn 0-3 times, categories absent from some
    replicates), crowd / area-ignored detections, ties of scores, a category without
    detections; non-integer weights take the reference itself."""
    from mmdet.datasets.api_wrappers import COCO
    gt, data, dets = _coco(num_images=30, num_cats=4, seed=3)
    for d in dets[::7]:
        d['score'] = 0.5                                       # ties, broken by image order
    for a in data['annotations'][::9]:
        a['iscrowd'] = 1                                       # detections on it are ignored
    gt = COCO()
    gt.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    ids = [im['id'] for im in data['images']]
    rec = S.coco_match_records(gt, dets, ids, [1, 2, 3, 4, 5], np.linspace(.5, .95, 10), 100)
    assert ((rec['det_tp'] + rec['det_fp']) == 0).any()       # some are ignored
    assert rec['npig'][:, 4].sum() == 0                        # category 5: no objects at all
    w = S.bootstrap_weights(len(ids), 300, seed=1)
    w[:5, :] = 0
    w[:5, :3] = 1                                              # replicates of 3 images only
    ref = np.array([S.coco_ap(rec, row) for row in w])
    got = S.coco_ap_rows(rec, w)
    assert np.isnan(ref).sum() == np.isnan(got).sum()
    assert np.array_equal(got, ref, equal_nan=True)
    assert len(np.unique(ref[~np.isnan(ref)])) > 50            # the replicates differ
    half = w * 0.5
    assert np.array_equal(S.coco_ap_rows(rec, half),
                          np.array([S.coco_ap(rec, row) for row in half]), equal_nan=True)


def test_seg_and_cls_values_equal_the_libraries():
    from mmpretrain.evaluation.metrics import Accuracy
    from mmseg.evaluation.metrics import IoUMetric
    rng = np.random.default_rng(0)
    C = 4
    results = []
    for _ in range(9):
        pred = torch.from_numpy(rng.integers(0, C, (16, 16)))
        label = torch.from_numpy(rng.integers(0, C - 1, (16, 16)))   # class 3 never labelled
        results.append(IoUMetric.intersect_and_union(pred, label, C, 255))
    m = IoUMetric()
    m.dataset_meta = dict(classes=[str(c) for c in range(C)])
    with contextlib.redirect_stdout(io.StringIO()):
        lib = m.compute_metrics(results)['mIoU']
    st = S.per_image_stats('seg', results)
    S.check_against(st, lib, 'seg')
    w = np.array([[2, 0, 1, 1, 1, 0, 3, 1, 0]], dtype=float)
    dup = [r for r, t in zip(results, w[0].astype(int), strict=True) for _ in range(t)]
    with contextlib.redirect_stdout(io.StringIO()):
        lib_dup = m.compute_metrics(dup)['mIoU']
    assert S.metric_values(st, w)[0] == pytest.approx(lib_dup, abs=0.006)

    cls = [dict(pred_score=torch.from_numpy(rng.random(5)), gt_label=torch.tensor([g]))
           for g in rng.integers(0, 5, 20)]
    lib = Accuracy().compute_metrics(cls)['top1']   # the evaluator adds the 'accuracy/' prefix
    S.check_against(S.per_image_stats('cls', cls), float(lib), 'cls')


def test_bootstrap_interval_and_pairing():
    w = S.bootstrap_weights(50, 400, seed=1)
    assert w.shape == (400, 50) and np.all(w.sum(1) == 50)
    assert np.array_equal(w, S.bootstrap_weights(50, 400, seed=1))
    correct = np.random.default_rng(0).random(50) < 0.7
    st = dict(kind=np.array('cls'), correct=correct.astype(float))
    lo, hi = S.interval(S.metric_values(st, w))
    assert lo < 100 * correct.mean() < hi and hi - lo < 40
    # a paired difference of a statistic with itself has a zero-width interval
    v = S.metric_values(st, w)
    assert S.interval(v - v) == (0.0, 0.0)


def test_stats_round_trip(tmp_path):
    st = [dict(kind=np.array('seg'), intersect=np.ones((3, 2)), union=np.full((3, 2), 2.0))]
    p = tmp_path / 's.npz'
    p.write_bytes(S.dumps(st, ['a.png', 'b.png', 'c.png']))
    back, keys = S.loads(str(p))
    assert keys == ['a.png', 'b.png', 'c.png'] and str(back[0]['kind']) == 'seg'
    assert np.array_equal(back[0]['union'], st[0]['union'])


def test_unsupported_metric_is_named():
    class IoUishMetric:
        def compute_metrics(self, results):
            return {}
    with pytest.raises(ValueError, match='no per-image statistics for IoUishMetric'):
        S.MetricRecorder(IoUishMetric())
