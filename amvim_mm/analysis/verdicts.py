"""Verdicts on architectures: intervals across training seeds and images, many comparisons,
equivalence, and the smallest difference a design can detect.

**The unit of replication.** "Architecture A loses less than B when tokens go" is a claim about
A's and B's training recipes, so the unit of replication is the training seed; the validation
images are a second, crossed source of error (every checkpoint and cell is evaluated on the same
images, so differences are paired over images). For one architecture with ``k`` training seeds
we have, per seed ``s``, a point value ``x[s]`` (a metric, a drop, a relative drop or a
robustness AUC of checkpoint ``s`` on all images) and ``R`` bootstrap replicates ``boot[s, r]``
over images (replicate ``r`` draws the same images for every checkpoint and cell).

* estimate: the mean over seeds, ``m = mean_s x[s]``;
* standard error: ``se**2 = var_s(x) / k + var_r(mean_s boot[:, r])``: the seed-to-seed sample
  variance (a t interval over seeds, ``df = k - 1``) plus the image-sampling variance of the
  seed mean, which every seed shares and which therefore does not show in ``var_s(x)``. The
  seed term already holds each seed's own image noise, so that part is counted twice: the sum is
  at least as wide as either interval alone ("the more conservative decides", made smooth);
* interval: ``m +- t(df) * se``; for a difference of two architectures the seed terms add and
  ``df`` is Welch-Satterthwaite's (``k_a + k_b - 2`` when neither seed term varies);
* with one seed there is no seed-to-seed variance to measure: the interval is over images only
  (normal quantile) and the result says so (``basis``).

**Verdicts** (:func:`decide`), at level ``alpha`` (0.05), over a family of comparisons:

* ``p``: two-sided p value of "no difference" (t with the df above); Holm's step-down adjustment
  over the family (``statsmodels.stats.multitest.multipletests``) gives ``p_holm``;
* ``p_equivalence``: TOST (two one-sided t tests) of ``|difference| >= margin``, Holm-adjusted
  over the same family;
* verdict: ``'A loses less'`` / ``'A loses more'`` when ``p_holm < alpha``, else
  ``'equivalent'`` (within +-margin) when the adjusted TOST p is below alpha, else
  ``'inconclusive'``;
* ``detectable``: the smallest true difference the design detects with 80 % power at the
  unadjusted level, ``(t(1 - alpha/2) + t(0.8)) * se``.

The level of these intervals and verdicts is measured by simulation in the test suite
(``tests/test_verdicts.py``), not assumed. Documentation: ``docs/statistics.md``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

#: default equivalence margins per metric, in the metric's unit (docs/statistics.md says why):
#: 1 point of mIoU / top-1 (percent), 0.01 of COCO box AP (a fraction)
DEFAULT_MARGINS = {'mIoU': 1.0, 'accuracy/top1': 1.0, 'coco/bbox_mAP': 0.01}
#: power at which :func:`compare` reports the smallest detectable difference
POWER = 0.8
VERDICTS = ('A loses less', 'A loses more', 'equivalent', 'inconclusive')


def default_margin(metric_name: str) -> float:
    """The default equivalence margin of a metric (:data:`DEFAULT_MARGINS`)."""
    if metric_name in DEFAULT_MARGINS:
        return DEFAULT_MARGINS[metric_name]
    return 0.01 if metric_name.startswith('coco') else 1.0


def _parts(x: Sequence[float], boot: np.ndarray):
    """(mean over seeds, seed variance of that mean or None, bootstrap replicates of it)."""
    x = np.asarray(x, dtype=np.float64)
    boot = np.asarray(boot, dtype=np.float64).reshape(len(x), -1)
    seed_var = float(np.var(x, ddof=1)) / len(x) if len(x) > 1 else None
    return float(np.mean(x)), seed_var, np.mean(boot, axis=0)


def _image_var(rep: np.ndarray) -> float:
    rep = rep[~np.isnan(rep)]
    return float(np.var(rep, ddof=1)) if len(rep) > 1 else 0.0


def estimate(x: Sequence[float], boot: np.ndarray, level: float = 0.95) -> Dict[str, object]:
    """One architecture's mean over its seeds with its interval (see the module docstring).

    Args:
        x: (k,) the per-seed point values.
        boot: (k, R) their bootstrap replicates over images (the same draws for every seed).
    Returns:
        ``value``, ``ci_low``, ``ci_high``, ``se``, ``df`` (None: normal quantile), ``basis``.
    """
    m, seed_var, rep = _parts(x, boot)
    se = float(np.sqrt((seed_var or 0.0) + _image_var(rep)))
    df = len(x) - 1 if seed_var is not None else None
    q = sps.t.ppf(0.5 + level / 2, df) if df else sps.norm.ppf(0.5 + level / 2)
    return dict(value=m, ci_low=m - q * se, ci_high=m + q * se, se=se, df=df,
                basis=_basis(len(x)))


def _basis(k: int) -> str:
    return (f'{k} training seeds and the images' if k > 1 else
            'the images only (one training seed: seed-to-seed variation not measured)')


def compare(xa: Sequence[float], boot_a: np.ndarray, xb: Sequence[float], boot_b: np.ndarray,
            margin: float, level: float = 0.95) -> Dict[str, object]:
    """Architecture A's mean minus B's (e.g. of their drops: > 0 means A loses less), paired over
    images: the image term is the variance of the replicates' difference.

    Returns ``difference``, ``ci_low``, ``ci_high`` (at ``level``), ``se``, ``df``, ``p``
    (two-sided, "no difference"), ``p_equivalence`` (TOST of ``|difference| >= margin``),
    ``margin``, ``detectable`` (the smallest true difference found with :data:`POWER` at the
    unadjusted level) and ``basis``; :func:`decide` adds the adjusted verdicts.
    """
    if not margin > 0:
        raise ValueError(f'the equivalence margin must be > 0, got {margin!r}')
    ma, va, ra = _parts(xa, boot_a)
    mb, vb, rb = _parts(xb, boot_b)
    d = ma - mb
    seed_var = None if va is None or vb is None else va + vb
    se = float(np.sqrt((seed_var or 0.0) + _image_var(ra - rb)))
    if seed_var is None:
        df = None
    elif seed_var > 0:   # Welch-Satterthwaite
        df = seed_var ** 2 / ((va ** 2) / (len(xa) - 1) + (vb ** 2) / (len(xb) - 1))
    else:
        df = float(len(xa) + len(xb) - 2)
    dist = sps.t(df) if df else sps.norm()
    alpha = 1 - level
    q = float(dist.ppf(1 - alpha / 2))
    if se > 0:
        p = float(2 * dist.sf(abs(d) / se))
        p_eq = float(max(dist.sf((d + margin) / se), dist.sf((margin - d) / se)))
    else:   # no variation at all: the difference is what it is
        p = 1.0 if d == 0 else 0.0
        p_eq = 0.0 if abs(d) < margin else 1.0
    return dict(difference=d, ci_low=d - q * se, ci_high=d + q * se, se=se, df=df, p=p,
                p_equivalence=p_eq, margin=float(margin),
                detectable=(q + float(dist.ppf(POWER))) * se,
                basis=_basis(min(len(xa), len(xb))))


def decide(comparisons: List[Dict[str, object]], alpha: float = 0.05,
           key: str = 'difference') -> None:
    """Holm-adjust ``p`` and ``p_equivalence`` over the family ``comparisons`` (in place) and
    give each its ``verdict`` (:data:`VERDICTS`; see the module docstring); ``key`` names the
    difference's field (its sign decides between the two directions)."""
    if not comparisons:
        return
    p_holm = multipletests([c['p'] for c in comparisons], alpha=alpha, method='holm')[1]
    eq_holm = multipletests([c['p_equivalence'] for c in comparisons], alpha=alpha,
                            method='holm')[1]
    for c, p, pe in zip(comparisons, p_holm, eq_holm, strict=True):
        c['p_holm'], c['p_equivalence_holm'] = float(p), float(pe)
        if p < alpha:
            c['verdict'] = 'A loses less' if c[key] > 0 else 'A loses more'
        elif pe < alpha:
            c['verdict'] = 'equivalent'
        else:
            c['verdict'] = 'inconclusive'
        c['family_size'] = len(comparisons)
        c['adjustment'] = 'holm'


def robustness_auc(kept: Sequence[float], values: np.ndarray) -> np.ndarray:
    """Area under a curve over the kept-token fraction, divided by the fraction's range: the
    mean of the curve between the least and the most tokens kept (trapezoids).

    Args:
        kept: (P,) kept-token fractions (1 - realised ratio; 1 for no reduction).
        values: (P, ...) the curve's values at those points (e.g. a drop per bootstrap
            replicate in the trailing axis).
    """
    kept = np.asarray(kept, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if len(kept) < 2 or np.ptp(kept) == 0:
        raise ValueError('a robustness AUC needs at least two different kept-token fractions')
    order = np.argsort(kept, kind='stable')
    k, v = kept[order], values[order]
    widths = np.diff(k).reshape((-1, ) + (1, ) * (v.ndim - 1))
    return np.sum(widths * (v[1:] + v[:-1]) / 2, axis=0) / (k[-1] - k[0])


def required_seeds(sd_seed: float, sd_image: float, margin: float, alpha: float = 0.05,
                   power: float = POWER, max_seeds: int = 50) -> Optional[int]:
    """The fewest training seeds per architecture at which a true difference of ``margin`` is
    detected with ``power`` (two-sided ``alpha``), for a seed-to-seed SD ``sd_seed`` of the
    compared quantity and an image-sampling SD ``sd_image`` of the difference of the two seed
    means (for a fixed image set); None beyond ``max_seeds``."""
    for k in range(2, max_seeds + 1):
        se = np.sqrt(2 * sd_seed ** 2 / k + sd_image ** 2)
        df = 2 * k - 2
        if (sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)) * se <= margin:
            return k
    return None
