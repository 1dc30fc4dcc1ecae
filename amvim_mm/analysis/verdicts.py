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
* standard error, the image term counted once (crossed random effects, method of moments):
  ``se**2 = var_s(x) / k + max(0, C)``. The seed term already holds each seed's own image
  noise; what the seeds *share* through the common images is ``C``, the mean covariance over
  the images' replicates between two different seeds, ``C = mean_{s != s'}
  cov_r(boot[s], boot[s'])``. For a difference A - B:
  ``se**2 = var_s(x_A)/k_A + var_s(x_B)/k_B + max(0, C_AA + C_BB - 2 C_AB)`` with ``C_AB`` the
  mean covariance between a seed of A and a seed of B. For a metric that is a mean over images
  this is the balanced REML standard error of ``y ~ arch + (1|seed:arch) + (1|image) +
  (1|arch:image)``; it needs only the bootstrap replicates, so it also holds for mIoU and AP;
* degrees of freedom: those of the seed terms only, ``k - 1`` (Welch-Satterthwaite for a
  difference, ``k_A + k_B - 2`` when neither seed term varies). A Satterthwaite df that counts
  the image term as well was measured invalid (too many false verdicts with 3 seeds);
* **at least** :data:`MIN_SEEDS` **training seeds on each side**: with one trained model there
  is no seed-to-seed variance to measure, and a single checkpoint says nothing about its
  architecture. :func:`estimate` then gives the checkpoint's interval over images (its
  ``basis`` says so); :func:`compare` gives no architecture verdict (``verdict`` =
  :data:`NO_VERDICT`) and never drops the measured side's seed variance.

**Verdicts** (:func:`decide`), at level ``alpha`` (0.05), over the family of comparisons the
report shows (all cells and all AUCs together):

* ``p``: two-sided p value of "no difference" (t with the df above); Holm's step-down adjustment
  over the family gives ``p_holm`` (:func:`holm`, equal to ``statsmodels``' ``multipletests``);
* ``p_equivalence``: TOST (two one-sided t tests) of ``|difference| >= margin``, Holm-adjusted
  over the same family;
* verdict: ``'A loses less'`` / ``'A loses more'`` when ``p_holm < alpha``, else
  ``'equivalent'`` (within +-margin) when the adjusted TOST p is below alpha, else
  ``'inconclusive'``;
* the interval shown (``ci_low``, ``ci_high``, ``ci_level``) is at the level the verdict uses:
  a comparison Holm rejects at step ``j`` (of ``m``, by ascending p) gets the Bonferroni
  interval of that step, ``1 - alpha / (m - j + 1)``; every comparison Holm does not reject gets
  the level of the step where Holm stopped. So an interval excludes 0 exactly when its verdict
  is "loses less / more", never otherwise;
* ``detectable``: the smallest true difference found with :data:`POWER` (80 %) by a two-sided
  t test at the level a lone real difference meets first in Holm's procedure, ``alpha / m``
  (noncentral t with the comparison's df and se).

The level of these intervals and verdicts is measured by simulation in the test suite
(``tests/analysis/test_verdicts.py``, ``tests/analysis/test_verdicts_simulation.py``), not assumed.
Documentation: ``docs/statistics.md``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

#: default equivalence margins per metric, in the metric's unit (docs/statistics.md says why):
#: 1 point of mIoU / top-1 (percent), 0.01 of COCO box AP (a fraction)
DEFAULT_MARGINS = {'mIoU': 1.0, 'accuracy/top1': 1.0, 'coco/bbox_mAP': 0.01}
#: power at which :func:`compare` reports the smallest detectable difference
POWER = 0.8
#: the fewest training seeds per architecture for an architecture verdict
MIN_SEEDS = 2
#: the verdict of a comparison with fewer than :data:`MIN_SEEDS` trained models on a side
NO_VERDICT = 'no architecture verdict'
VERDICTS = ('A loses less', 'A loses more', 'equivalent', 'inconclusive', NO_VERDICT)


def default_margin(metric_name: str) -> float:
    """The default equivalence margin of a metric (:data:`DEFAULT_MARGINS`)."""
    if metric_name in DEFAULT_MARGINS:
        return DEFAULT_MARGINS[metric_name]
    return 0.01 if metric_name.startswith('coco') else 1.0


def _as_boot(x: np.ndarray, boot) -> np.ndarray:
    return np.asarray(boot, dtype=np.float64).reshape(len(x), -1)


def _shared_image_variance(boot_a: np.ndarray, boot_b: Optional[np.ndarray] = None) -> float:
    """``max(0, C_AA)`` (one side) or ``max(0, C_AA + C_BB - 2 C_AB)`` (module docstring):
    the image-sampling variance the seeds share, from the covariances of their replicates
    (replicates that are not finite for some seed are left out)."""
    rows = boot_a if boot_b is None else np.vstack([boot_a, boot_b])
    rows = rows[:, np.all(np.isfinite(rows), axis=0)]
    if rows.shape[1] < 2:
        return 0.0
    cov = np.cov(rows, ddof=1)
    ka = len(boot_a)

    def mean_off_diagonal(block: np.ndarray) -> float:
        k = len(block)
        return float((block.sum() - np.trace(block)) / (k * (k - 1)))
    c = mean_off_diagonal(cov[:ka, :ka])
    if boot_b is not None:
        c += mean_off_diagonal(cov[ka:, ka:]) - 2 * float(np.mean(cov[:ka, ka:]))
    return max(0.0, c)


def _image_only_variance(rep: np.ndarray) -> float:
    rep = rep[np.isfinite(rep)]
    return float(np.var(rep, ddof=1)) if len(rep) > 1 else 0.0


def estimate(x: Sequence[float], boot: np.ndarray, level: float = 0.95) -> Dict[str, object]:
    """One architecture's mean over its seeds with its interval (see the module docstring).

    Args:
        x: (k,) the per-seed point values.
        boot: (k, R) their bootstrap replicates over images (the same draws for every seed).
    Returns:
        ``value``, ``ci_low``, ``ci_high``, ``se``, ``df`` (None: normal quantile, one seed:
        the checkpoint's interval over images), ``basis``.
    """
    x = np.asarray(x, dtype=np.float64)
    boot = _as_boot(x, boot)
    k, m = len(x), float(np.mean(x))
    if k >= MIN_SEEDS:
        se = float(np.sqrt(np.var(x, ddof=1) / k + _shared_image_variance(boot)))
        df = k - 1
        q = float(sps.t.ppf(0.5 + level / 2, df))
    else:
        se, df = float(np.sqrt(_image_only_variance(boot[0]))), None
        q = float(sps.norm.ppf(0.5 + level / 2))
    return dict(value=m, ci_low=m - q * se, ci_high=m + q * se, se=se, df=df,
                basis=_basis(k))


def _basis(k: int) -> str:
    return (f'{k} training seeds and the images' if k >= MIN_SEEDS else
            'the images only (one trained model: a checkpoint-level interval; seed-to-seed '
            'variation not measured)')


def detectable(se: float, df: Optional[float], alpha: float = 0.05, family_size: int = 1,
               power: float = POWER) -> float:
    """The smallest true difference a two-sided t test at level ``alpha / family_size`` finds
    with ``power``, for an estimated standard error ``se`` with ``df`` degrees of freedom
    (noncentral t; None: normal, ``se`` known).

    With few degrees of freedom an estimated ``se`` is more often below the true one than above
    (its median is ``sqrt(chi2_median(df) / df)`` of it: 0.92 at 4 df), so ``se`` is first
    divided by that factor (median-unbiased): the reported difference is then found with
    ``power`` at the median of its own estimate, not at a lucky low ``se``."""
    if df is None:
        if not se > 0:
            return 0.0
        a = alpha / max(int(family_size), 1)
        return float((sps.norm.ppf(1 - a / 2) + sps.norm.ppf(power)) * se)
    return float(detectable_many([se], [df], alpha, family_size, power)[0])


def detectable_many(se: Sequence[float], df: Sequence[float], alpha: float = 0.05,
                    family_size: int = 1, power: float = POWER) -> np.ndarray:
    """:func:`detectable` for many comparisons at once (finite ``df``): the noncentrality is
    found by bisection on all of them together (a family's worth of root searches in one
    vectorised loop)."""
    se = np.asarray(se, dtype=np.float64)
    df = np.asarray(df, dtype=np.float64)
    a = alpha / max(int(family_size), 1)
    crit = sps.t.ppf(1 - a / 2, df)

    def reached(nc):   # the lower tail vanishes far out (nan there: 0)
        lower = np.nan_to_num(sps.nct.cdf(-crit, df, nc))
        return sps.nct.sf(crit, df, nc) + lower >= power
    lo, hi = np.zeros_like(crit), crit + 3.0
    while not np.all(reached(hi)):
        hi = np.where(reached(hi), hi, 2 * hi)
    for _ in range(45):                                    # 2**-45 of the bracket
        mid = (lo + hi) / 2
        ok = reached(mid)
        lo, hi = np.where(ok, lo, mid), np.where(ok, mid, hi)
    median_se = se / np.sqrt(sps.chi2.ppf(0.5, df) / df)
    return np.where(se > 0, hi * median_se, 0.0)


def compare(xa: Sequence[float], boot_a: np.ndarray, xb: Sequence[float], boot_b: np.ndarray,
            margin: float, level: float = 0.95) -> Dict[str, object]:
    """Architecture A's mean minus B's (e.g. of their drops: > 0 means A loses less), paired over
    images (module docstring).

    Returns ``difference``, ``ci_low``, ``ci_high`` (at ``level``, unadjusted; :func:`decide`
    replaces them by the family's), ``ci_level``, ``se``, ``df``, ``p`` (two-sided, "no
    difference"), ``p_equivalence`` (TOST of ``|difference| >= margin``), ``margin``,
    ``detectable`` (None until :func:`decide` gives the family's), ``seeds`` (k_A, k_B) and
    ``basis``. With fewer than :data:`MIN_SEEDS` seeds on a side: the difference with
    ``verdict`` :data:`NO_VERDICT` and None for everything a verdict would rest on.
    """
    if not margin > 0:
        raise ValueError(f'the equivalence margin must be > 0, got {margin!r}')
    xa, xb = np.asarray(xa, dtype=np.float64), np.asarray(xb, dtype=np.float64)
    ba, bb = _as_boot(xa, boot_a), _as_boot(xb, boot_b)
    ka, kb = len(xa), len(xb)
    d = float(np.mean(xa) - np.mean(xb))
    if min(ka, kb) < MIN_SEEDS:
        return dict(difference=d, ci_low=None, ci_high=None, ci_level=None, se=None, df=None,
                    p=None, p_equivalence=None, margin=float(margin), detectable=None,
                    seeds=(ka, kb), verdict=NO_VERDICT,
                    basis=f'one trained model on a side ({ka} vs {kb} training seeds): '
                          'no architecture verdict')
    va, vb = float(np.var(xa, ddof=1)) / ka, float(np.var(xb, ddof=1)) / kb
    se = float(np.sqrt(va + vb + _shared_image_variance(ba, bb)))
    if va + vb > 0:   # Welch-Satterthwaite over the seed terms only
        df = (va + vb) ** 2 / (va ** 2 / (ka - 1) + vb ** 2 / (kb - 1))
    else:
        df = float(ka + kb - 2)
    dist = sps.t(df)
    if se > 0:
        p = float(2 * dist.sf(abs(d) / se))
        p_eq = float(max(dist.sf((d + margin) / se), dist.sf((margin - d) / se)))
    else:   # no variation at all: the difference is what it is
        p = 1.0 if d == 0 else 0.0
        p_eq = 0.0 if abs(d) < margin else 1.0
    q = float(dist.ppf(0.5 + level / 2))
    return dict(difference=d, ci_low=d - q * se, ci_high=d + q * se, ci_level=level, se=se,
                df=df, p=p, p_equivalence=p_eq, margin=float(margin), detectable=None,
                seeds=(ka, kb),
                basis=f'{min(ka, kb)}+ training seeds per architecture and the images')


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p values, in the input's order: the sorted p times
    ``m - j`` (0-based step ``j``), made non-decreasing, at most 1. The same numbers as
    ``statsmodels.stats.multitest.multipletests(p, method='holm')[1]`` (checked by the tests),
    without its full ``gc.collect()`` per call, which costs a tenth of a second in a process
    that holds torch and dominated a simulation of thousands of families."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    order = np.argsort(p, kind='stable')
    adj = np.minimum(np.maximum.accumulate(p[order] * np.arange(m, 0, -1)), 1.0)
    out = np.empty(m)
    out[order] = adj
    return out


def decide(comparisons: List[Dict[str, object]], alpha: float = 0.05,
           key: str = 'difference') -> None:
    """Holm-adjust ``p`` and ``p_equivalence`` over the family ``comparisons`` (in place; those
    without a verdict, :data:`NO_VERDICT`, are not in it), give each its ``verdict``
    (:data:`VERDICTS`), its interval at the verdict's level (``ci_low``, ``ci_high``,
    ``ci_level``) and its ``detectable`` difference at the family's level (module docstring).
    ``key`` names the difference's field (its sign decides between the two directions)."""
    family = [c for c in comparisons if c.get('p') is not None]
    for c in comparisons:
        if c.get('p') is None:
            c.update(verdict=NO_VERDICT, p_holm=None, p_equivalence_holm=None,
                     family_size=len(family), adjustment='holm')
    if not family:
        return
    m = len(family)
    p_holm = holm([c['p'] for c in family])
    eq_holm = holm([c['p_equivalence'] for c in family])
    order = sorted(range(m), key=lambda i: (family[i]['p'], i))
    step_alpha = [alpha] * m      # the level of each comparison's interval
    stopped = None
    for j, i in enumerate(order):
        a_j = alpha / (m - j)
        if stopped is None and p_holm[i] >= alpha:
            stopped = a_j
        step_alpha[i] = a_j if stopped is None else stopped
    found = detectable_many([c['se'] for c in family], [c['df'] for c in family], alpha, m)
    for c, d in zip(family, found, strict=True):
        c['detectable'] = float(d)
    for c, p, pe, a in zip(family, p_holm, eq_holm, step_alpha, strict=True):
        c['p_holm'], c['p_equivalence_holm'] = float(p), float(pe)
        if p < alpha:
            c['verdict'] = 'A loses less' if c[key] > 0 else 'A loses more'
        elif pe < alpha:
            c['verdict'] = 'equivalent'
        else:
            c['verdict'] = 'inconclusive'
        q = float(sps.t.ppf(1 - a / 2, c['df']))
        c['ci_low'], c['ci_high'] = c[key] - q * c['se'], c[key] + q * c['se']
        c['ci_level'] = 1 - a
        c['family_size'] = m
        c['adjustment'] = 'holm'


def _merge_ties(kept: np.ndarray, values: np.ndarray):
    """Sorted distinct kept fractions and the mean value at each (ties merged, so the result
    does not depend on the order of the input)."""
    uniq, inv = np.unique(kept, return_inverse=True)
    out = np.zeros((len(uniq), ) + values.shape[1:])
    np.add.at(out, inv, values)
    counts = np.bincount(inv, minlength=len(uniq)).reshape((-1, ) + (1, ) * (values.ndim - 1))
    return uniq, out / counts


def robustness_auc(kept: Sequence[float], values: np.ndarray,
                   lowest: Optional[float] = None) -> np.ndarray:
    """Area under a curve over the kept-token fraction, divided by the fraction's range: the
    mean of the piecewise linear curve between ``lowest`` (default: the fewest tokens kept)
    and the most tokens kept. Points at the same kept fraction are merged by their mean.

    Args:
        kept: (P,) kept-token fractions (1 - realised ratio; 1 for no reduction).
        values: (P, ...) the curve's values at those points (e.g. a drop per bootstrap
            replicate in the trailing axis).
        lowest: the common lower end when two curves are compared (a kept fraction inside the
            curve's range; the curve is interpolated there).
    """
    kept = np.asarray(kept, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    k, v = _merge_ties(kept, values)
    if len(k) < 2:
        raise ValueError('a robustness AUC needs at least two different kept-token fractions')
    lo = k[0] if lowest is None else float(lowest)
    if not k[0] <= lo < k[-1]:
        raise ValueError(f'the AUC range starts at {lo:g}, outside the curve\'s kept fractions '
                         f'[{k[0]:g}, {k[-1]:g}]')
    j = int(np.searchsorted(k, lo, side='right'))          # first point above lo
    t = (lo - k[j - 1]) / (k[j] - k[j - 1])
    v_lo = v[j - 1] + t * (v[j] - v[j - 1])
    k, v = np.concatenate([[lo], k[j:]]), np.concatenate([v_lo[None], v[j:]])
    widths = np.diff(k).reshape((-1, ) + (1, ) * (v.ndim - 1))
    return np.sum(widths * (v[1:] + v[:-1]) / 2, axis=0) / (k[-1] - k[0])


def required_seeds(sd_seed: float, sd_image: float, margin: float, alpha: float = 0.05,
                   power: float = POWER, family_size: int = 1,
                   max_seeds: int = 50) -> Optional[int]:
    """The fewest training seeds per architecture at which a true difference of ``margin`` is
    detected with ``power`` by the verdict's test at the level a lone real difference meets in
    a Holm family of ``family_size`` (``alpha / family_size``), for an assumed seed-to-seed SD
    ``sd_seed`` of the compared quantity and an image-sampling SD ``sd_image`` of the
    difference of the two seed means (for a fixed image set); None beyond ``max_seeds``."""
    for k in range(MIN_SEEDS, max_seeds + 1):
        se = float(np.sqrt(2 * sd_seed ** 2 / k + sd_image ** 2))
        if detectable(se, 2 * k - 2, alpha, family_size, power) <= margin:
            return k
    return None
