"""Per-image statistics of the libraries' metrics and a paired bootstrap over images.

A metric such as mIoU or COCO AP is not a mean over images, so its confidence interval comes
from recomputing it on resampled image sets. Each evaluation keeps, per image, what the
library's metric sums (mmseg ``IoUMetric``: intersection and union per class; mmpretrain
``Accuracy``: whether the top-1 label is right; mmdet ``CocoMetric``: COCO's per-image match
records), and :func:`metric_values` recomputes the metric for every row of a weight matrix
(``W[b, i]`` = how often image ``i`` is drawn in replicate ``b``, from
:func:`bootstrap_weights`). With the same ``W`` for every evaluation of a data set, differences
are *paired*: the drop from ratio 0 and the difference between two models' drops are computed
per replicate, so the image-to-image variation that both share cancels.

Percentile intervals (95 % by default, 1000 replicates, seed 0). The recomputed metric on
``W = 1`` equals the library's value (checked by :func:`check_against`).
"""
from __future__ import annotations

import contextlib
import io
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from amvim_mm.errors import ConfigError

#: the library metric classes whose per-image statistics are understood
KINDS = {'IoUMetric': 'seg', 'Accuracy': 'cls', 'CocoMetric': 'det'}


# ----------------------------------------------------------------------------- collection
class MetricRecorder:
    """Keeps a copy of a metric's processed ``results`` when ``compute_metrics`` runs (the
    metric clears them right after), so per-image statistics can be taken from them."""

    def __init__(self, metric) -> None:
        name = type(metric).__name__
        if name not in KINDS:
            raise ConfigError(f'no per-image statistics for {name}; supported: '
                              f'{", ".join(KINDS)}')
        self.metric, self.kind, self.results = metric, KINDS[name], None
        original = metric.compute_metrics

        def compute_metrics(results):
            self.results = list(results)
            return original(results)
        metric.compute_metrics = compute_metrics

    def stats(self) -> Dict[str, np.ndarray]:
        """The per-image statistics of the last evaluation (see :func:`per_image_stats`)."""
        if self.results is None:
            raise RuntimeError('the metric has not been computed yet')
        return per_image_stats(self.kind, self.results, self.metric)


def per_image_stats(kind: str, results: Sequence, metric=None) -> Dict[str, np.ndarray]:
    """Arrays of one evaluation: ``seg``: ``intersect``/``union`` (N, C); ``cls``:
    ``correct`` (N,); ``det``: COCO match records (see :func:`_coco_records`)."""
    if kind == 'seg':
        inter = np.stack([np.asarray(r[0].cpu(), dtype=np.float64) for r in results])
        union = np.stack([np.asarray(r[1].cpu(), dtype=np.float64) for r in results])
        return dict(kind=np.array('seg'), intersect=inter, union=union)
    if kind == 'cls':
        correct = []
        for r in results:
            pred = int(r['pred_score'].argmax()) if 'pred_score' in r else int(r['pred_label'])
            correct.append(pred == int(r['gt_label'].reshape(-1)[0]))
        return dict(kind=np.array('cls'), correct=np.asarray(correct, dtype=np.float64))
    if kind == 'det':
        return _coco_records(results, metric)
    raise ConfigError(f'unknown statistics kind {kind!r}')


def _coco_records(results, metric) -> Dict[str, np.ndarray]:
    """COCO's per-image bbox matches, as ``COCOeval.evaluate`` makes them with the metric's
    settings (its categories, images, IoU thresholds, the largest ``maxDets``; area "all").

    Flat arrays over detections (``det_img``, ``det_cat``, ``det_score``, ``det_tp``/
    ``det_fp`` (T, D): matched / unmatched and not ignored, per IoU threshold) and per
    (image, category) counts of non-ignored ground truths ``npig`` (N, K).
    """
    if getattr(metric, '_coco_api', None) is None:
        raise ConfigError('per-image detection statistics need CocoMetric with an ann_file')
    gt = metric._coco_api
    dets = []
    for _, pred in results:
        for box, score, label in zip(pred['bboxes'], pred['scores'], pred['labels']):
            x0, y0, x1, y1 = (float(v) for v in box)
            dets.append(dict(image_id=pred['img_id'], bbox=[x0, y0, x1 - x0, y1 - y0],
                             score=float(score), category_id=metric.cat_ids[int(label)]))
    img_ids = list(metric.img_ids)
    cat_ids = list(metric.cat_ids)
    iou_thrs = np.asarray(metric.iou_thrs, dtype=np.float64)
    max_det = int(list(metric.proposal_nums)[-1])
    return coco_match_records(gt, dets, img_ids, cat_ids, iou_thrs, max_det)


def coco_match_records(gt, dets: List[dict], img_ids: Sequence[int], cat_ids: Sequence[int],
                       iou_thrs: np.ndarray, max_det: int) -> Dict[str, np.ndarray]:
    """Run ``COCOeval.evaluate`` (bbox, area "all") and keep its per-image match records."""
    from mmdet.datasets.api_wrappers import COCOeval
    dt = gt.loadRes(dets) if dets else None
    T = len(iou_thrs)
    img_pos = {i: n for n, i in enumerate(img_ids)}
    cat_pos = {c: n for n, c in enumerate(cat_ids)}
    npig = np.zeros((len(img_ids), len(cat_ids)), dtype=np.float64)
    d_img, d_cat, d_score, d_tp, d_fp = [], [], [], [], []
    if dt is not None:
        ev = COCOeval(gt, dt, 'bbox')
        ev.params.imgIds, ev.params.catIds = list(img_ids), list(cat_ids)
        ev.params.iouThrs, ev.params.maxDets = iou_thrs, [max_det]
        ev.params.areaRng, ev.params.areaRngLbl = [ev.params.areaRng[0]], ['all']
        with contextlib.redirect_stdout(io.StringIO()):
            ev.evaluate()
        for e in ev.evalImgs:
            if e is None:
                continue
            i, k = img_pos[e['image_id']], cat_pos[e['category_id']]
            npig[i, k] = np.count_nonzero(np.asarray(e['gtIgnore']) == 0)
            scores = np.asarray(e['dtScores'][:max_det], dtype=np.float64)
            m = np.asarray(e['dtMatches'])[:, :max_det].reshape(T, -1)
            ig = np.asarray(e['dtIgnore'])[:, :max_det].reshape(T, -1).astype(bool)
            d_img += [i] * len(scores)
            d_cat += [k] * len(scores)
            d_score.append(scores)
            d_tp.append((m != 0) & ~ig)
            d_fp.append((m == 0) & ~ig)
    else:
        for n, i in enumerate(img_ids):
            for k, c in enumerate(cat_ids):
                anns = gt.loadAnns(gt.getAnnIds(imgIds=[i], catIds=[c], iscrowd=None))
                npig[n, k] = sum(1 for a in anns if not a.get('iscrowd', 0)
                                 and not a.get('ignore', 0))
    cat = lambda xs, shape: np.concatenate(xs, axis=-1) if xs else np.zeros(shape)  # noqa: E731
    return dict(kind=np.array('det'), det_img=np.asarray(d_img, dtype=np.int64),
                det_cat=np.asarray(d_cat, dtype=np.int64),
                det_score=cat(d_score, (0, )), det_tp=cat(d_tp, (T, 0)).astype(bool),
                det_fp=cat(d_fp, (T, 0)).astype(bool), npig=npig)


# ----------------------------------------------------------------------------- recomputation
def num_images(stats: Dict[str, np.ndarray]) -> int:
    kind = str(stats['kind'])
    return len(stats['correct'] if kind == 'cls' else
               stats['intersect'] if kind == 'seg' else stats['npig'])


def metric_values(stats: Dict[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
    """The metric in the library's unit for every row of ``weights`` (R, N): mIoU and top-1
    accuracy in percent, COCO bbox AP@[.5:.95] (area all, largest maxDets) as a fraction."""
    kind = str(stats['kind'])
    w = np.asarray(weights, dtype=np.float64)
    if kind == 'cls':
        return 100.0 * (w @ stats['correct']) / w.sum(1)
    if kind == 'seg':
        inter, union = w @ stats['intersect'], w @ stats['union']
        with np.errstate(invalid='ignore', divide='ignore'):
            iou = inter / union                       # nan where a class never occurs
        out = np.full(len(w), np.nan)
        ok = ~np.all(np.isnan(iou), axis=1)
        out[ok] = 100.0 * np.nanmean(iou[ok], axis=1)
        return out
    if kind == 'det':
        return coco_ap_rows(stats, w)
    raise ConfigError(f'unknown statistics kind {kind!r}')


def coco_ap_rows(stats: Dict[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
    """:func:`coco_ap` for every row of ``weights`` (R, N) at once, bit for bit.

    For whole-number weights (the bootstrap's counts; other weights take :func:`coco_ap` row by
    row) every cumulative count is an exact integer, so they can be formed in any order: per
    category the detections are sorted by score once (stable, as COCOeval), and per IoU
    threshold only the true positives are visited, for all replicates at once. A detection of
    an image with weight 0 adds exactly 0 (so it may stay in), and neither a false positive
    nor an ignored detection can raise the precision above the last true positive's before it
    (same true count, no fewer false ones), so the precision envelope at a true positive and
    the first true positive reaching a recall threshold give COCOeval's values. That index is
    a count, ``#{i: recall_i < thr}``, formed from one ``searchsorted`` of the recalls into the
    thresholds (``recall_i < thr_j`` exactly when ``j >= searchsorted(thr, recall_i,
    'right')``). The mean over the categories present in a replicate is taken per replicate
    over the same concatenation as :func:`coco_ap` (same summation)."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.array_equal(w, np.round(w)):
        return np.array([coco_ap(stats, row) for row in w])
    rec_thrs = np.linspace(.0, 1.00, 101)
    J = len(rec_thrs)
    tp_all, fp_all = stats['det_tp'], stats['det_fp']
    T = tp_all.shape[0]
    R, K = len(w), stats['npig'].shape[1]
    npig = w @ stats['npig']                                     # (R, K) whole numbers
    q = np.zeros((R, K, T, J))
    rows = np.arange(R)[:, None] * (J + 1)
    for k in range(K):
        sel = np.nonzero(stats['det_cat'] == k)[0]
        if len(sel) == 0:
            continue
        sel = sel[np.argsort(-stats['det_score'][sel], kind='mergesort')]
        dw = w[:, stats['det_img'][sel]]                         # (R, n)
        seen = np.cumsum(dw, axis=1)                             # detections so far
        for t in range(T):
            tp_t, fp_t = tp_all[t, sel] > 0, fp_all[t, sel] > 0
            pos = np.nonzero(tp_t)[0]
            m = len(pos)
            if m == 0:
                continue                                         # AP 0 at this threshold
            tp = np.cumsum(dw[:, pos], axis=1)                   # (R, m)
            fp = seen[:, pos] - tp
            ignored = ~(tp_t | fp_t)
            if ignored.any():
                fp = fp - np.cumsum(dw * ignored, axis=1)[:, pos]
            with np.errstate(invalid='ignore', divide='ignore'):   # categories absent
                rc = tp / npig[:, k:k + 1]
            pr = tp / (fp + tp + np.spacing(1))
            pr = np.maximum.accumulate(pr[:, ::-1], axis=1)[:, ::-1]
            first = np.searchsorted(rec_thrs, rc, side='right')   # (R, m); nan -> J
            counts = np.bincount((rows + first).ravel(), minlength=R * (J + 1))
            idx = np.cumsum(counts.reshape(R, J + 1), axis=1)[:, :J]   # #{i: rc_i < thr_j}
            got = np.take_along_axis(pr, np.minimum(idx, m - 1), axis=1)
            q[:, k, t] = np.where(idx < m, got, 0.0)
    out = np.full(R, np.nan)
    present = npig > 0
    for r in range(R):
        if present[r].any():
            out[r] = float(np.mean(q[r, present[r]].ravel()))
    return out


def coco_ap(stats: Dict[str, np.ndarray], w: np.ndarray) -> float:
    """COCOeval.accumulate + summarize's AP for image weights ``w`` (an image drawn twice
    counts twice), restated for weights: cumulative weighted TP/FP counts in score order.
    One weight vector at a time (the reference of :func:`coco_ap_rows`, which the bootstrap
    uses)."""
    rec_thrs = np.linspace(.0, 1.00, 101)
    tp_all, fp_all = stats['det_tp'], stats['det_fp']
    T = tp_all.shape[0]
    npig_k = w @ stats['npig']                                   # (K,)
    aps = []
    for k in range(stats['npig'].shape[1]):
        if npig_k[k] == 0:
            continue
        sel = np.nonzero((stats['det_cat'] == k) & (w[stats['det_img']] > 0))[0]
        if len(sel) == 0:
            aps.append(np.zeros(T * len(rec_thrs)))
            continue
        # COCOeval concatenates images in order and sorts by score with a stable mergesort
        sel = sel[np.argsort(-stats['det_score'][sel], kind='mergesort')]
        dw = w[stats['det_img'][sel]]
        tp = np.cumsum(tp_all[:, sel] * dw, axis=1)
        fp = np.cumsum(fp_all[:, sel] * dw, axis=1)
        q = np.zeros((T, len(rec_thrs)))
        for t in range(T):
            rc = tp[t] / npig_k[k]
            pr = tp[t] / (fp[t] + tp[t] + np.spacing(1))
            pr = np.maximum.accumulate(pr[::-1])[::-1]
            idx = np.searchsorted(rc, rec_thrs, side='left')
            valid = idx < len(pr)
            q[t, valid] = pr[idx[valid]]
        aps.append(q.ravel())
    return float(np.mean(np.concatenate(aps))) if aps else float('nan')


# ----------------------------------------------------------------------------- bootstrap
def bootstrap_weights(n: int, replicates: int = 1000, seed: int = 0) -> np.ndarray:
    """(replicates, n) counts: replicate ``b`` draws ``n`` images with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(replicates, n))
    w = np.zeros((replicates, n), dtype=np.float64)
    np.add.at(w, (np.arange(replicates)[:, None], draws), 1.0)
    return w


def interval(values: np.ndarray, level: float = 0.95) -> Tuple[Optional[float], Optional[float]]:
    """Percentile interval of bootstrap ``values`` (NaN replicates ignored)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return None, None
    a = (1 - level) / 2 * 100
    lo, hi = np.percentile(v, [a, 100 - a])
    return round(float(lo), 4), round(float(hi), 4)


def mean_over_seeds(per_seed: Sequence[Dict[str, np.ndarray]], weights: np.ndarray
                    ) -> np.ndarray:
    """A cell's bootstrap values: the metric averaged over its seeds (random pruning) for
    each replicate; the same images are drawn for every seed."""
    return np.mean([metric_values(s, weights) for s in per_seed], axis=0)


#: how far the libraries' rounding can put their value from ours (mmseg and mmpretrain: 2
#: decimals of a percentage; mmdet: 3 decimals of a fraction)
TOLERANCE = {'seg': 0.0051, 'cls': 0.0051, 'det': 0.00051}


def check_against(stats: Dict[str, np.ndarray], library_value: float, what: str) -> float:
    """The recomputed metric on all images; an error if it differs from the library's
    (rounded) value by more than its rounding."""
    tol = TOLERANCE[str(stats['kind'])]
    mine = float(metric_values(stats, np.ones((1, num_images(stats))))[0])
    if not abs(mine - library_value) <= tol:
        raise RuntimeError(f'{what}: the per-image statistics give {mine:.4f}, the library '
                           f'{library_value:.4f}; the confidence intervals would be wrong')
    return mine


# ----------------------------------------------------------------------------- storage
def dumps(per_seed: Sequence[Dict[str, np.ndarray]], image_keys: Sequence[str]) -> bytes:
    """npz bytes of a cell's statistics (one dict per seed) and its image keys."""
    arrays = {'image_keys': np.asarray(list(image_keys), dtype=str),
              'num_seeds': np.asarray(len(per_seed))}
    for s, stats in enumerate(per_seed):
        arrays.update({f'{s}/{k}': v for k, v in stats.items()})
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def loads(path: str) -> Tuple[List[Dict[str, np.ndarray]], List[str]]:
    """Read :func:`dumps`' file (no pickles: ``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as z:
        n = int(z['num_seeds'])
        per_seed = [{k.split('/', 1)[1]: z[k] for k in z.files if k.startswith(f'{s}/')}
                    for s in range(n)]
        return per_seed, [str(k) for k in z['image_keys']]
