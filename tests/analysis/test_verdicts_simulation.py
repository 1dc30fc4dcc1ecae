"""The level and power of the architecture verdicts (:mod:`amvim_mm.analysis.verdicts`) for
mIoU, measured by simulation: the metric is recomputed from per-image, per-class intersections
and unions for every bootstrap replicate, as ``prune_eval`` does, not averaged over images.

The simulated world (seeded, so every rate below is reproducible):

* **Data set**: 150 ADE20K-like classes with Zipf-like frequencies: an image shows class ``c``
  (rank 1..150) with probability ``0.85 * c ** -0.8`` (the most common class in 85 % of the
  images, the rarest in 1.5 %), independently, so an image shows about 8 classes (mostly 5-12)
  and rare classes appear in one or two of 100 images, or in none. A shown class covers a
  lognormal area (``c ** -0.3 * exp(1.2 z)``): its ground-truth area, used as its union.
* **A checkpoint's IoU** on an image and class it shows: ``sigmoid(class base + image x class
  difficulty (shared by every checkpoint) + architecture x image x class effect (shared by the
  seeds of one architecture) + seed x image x class noise)``; intersection = IoU x area.
* **False positives**: per evaluation, each image predicts a Poisson number of classes it does
  not show (intersection 0, a small union). A class no image of the set shows but some image
  predicts enters the mean with IoU 0; a class with union 0 in a replicate is left out of the
  mean (nan-mean over classes, as ``IoUMetric``).
* **Reduction**: each checkpoint is evaluated unreduced and reduced; the reduced logit is the
  unreduced one (so its noise is correlated with it) minus a shift (a drop of about 7 mIoU
  points), plus an architecture x image x class and a seed x image x class change, and the
  reduced evaluation has more false positives.
* **Drop** = mIoU(reduced) - mIoU(unreduced) of one checkpoint, for the point value (all
  images) and for 200 bootstrap replicates over images. Every checkpoint and both evaluations
  use the same bootstrap weights (``stats.bootstrap_weights``): paired, as ``prune_eval``.
* **Seed SD of a drop**: a per-checkpoint effect ``N(0, sd_seed)`` points added to its drop's
  point value and to all its replicates (the seed-to-seed spread the images cannot show).
* **Two architectures** A and B, identical in distribution: the true difference of their
  mean drops is 0; a true difference ``delta`` is added to every drop of A (point value and
  replicates), so the truth is exact.

The noise scales are calibrated so that at 100 images, 3 seeds and seed SD 0 a true difference
of 2 points is found about as often as in the reference simulation (new rule about half of the
time, the old rule, which counted the image term twice, about a third). The replicate mIoU is
computed with sparse matrices (``W @ intersections`` per class, in float32, for every
checkpoint at once); :func:`test_the_fast_path_is_the_library_metric` checks it against
``stats.metric_values``. Experiments are shared between the tests (cached), and the seed effect
and the true difference are added to the same simulated drops, so one simulation serves every
seed SD and effect size. Runtime: about 50 s on one CPU thread.
"""
import functools

import numpy as np
import pytest
from scipy import sparse
from scipy import stats as sps

from amvim_mm.analysis import stats as S
from amvim_mm.analysis import verdicts as V

N_CLASSES, REPLICATES, EXPERIMENTS = 150, 200, 400
_RANK = np.arange(1, N_CLASSES + 1, dtype=np.float64)
#: probability that an image shows a class, its typical area and its base IoU logit
FREQUENCY = np.minimum(0.85 * _RANK ** -0.8, 1.0)
AREA_SCALE = _RANK ** -0.3
BASE_LOGIT = 1.6 - 0.45 * np.log(_RANK) + np.random.default_rng(150).normal(0, 0.4, N_CLASSES)
SD_LOG_AREA = 1.2
SD_DIFFICULTY = 1.0     # image x class, shared by every checkpoint
SD_ARCH = 0.3           # architecture x image x class (unreduced logit)
SD_ARCH_DROP = 0.25     # architecture x image x class (the reduction's change of the logit)
SD_SEED = 0.3           # seed x image x class (unreduced logit)
SD_SEED_DROP = 0.4      # seed x image x class (the reduction's change of the logit)
SHIFT = 0.4             # the reduction's mean change of the logit
FALSE_POSITIVES = (0.2, 0.3)     # classes an image does not show but predicts (unreduced, reduced)
FP_CLASS = FREQUENCY ** 0.5 / np.sum(FREQUENCY ** 0.5)      # which ones (common ones more often)
LOG_FP_AREA = np.log(0.05)

#: the simulated experiments: (images, seeds per side, experiments, random seed)
LEVEL = {100: (100, 5, EXPERIMENTS, 100), 2000: (2000, 5, EXPERIMENTS, 2000)}
FRESH = (100, 3, EXPERIMENTS, 101)          # fresh worlds for the power at "detectable"
FAMILY = 16
#: families of FAMILY independent cells: more than EXPERIMENTS, because the power at the
#: family's detectable difference lies near 75 % in this world (see the test), where 400
#: families would leave a chance spread of 2 points
FAMILIES = 1000
HOLM = (100, 3, FAMILY * FAMILIES, 116)
HOLM_SD = 2.0
#: independent draws of the seed effects per world in the level settings (:func:`_level`)
SEED_DRAWS = 4
#: the true mean drop: point values only, many experiments (one seed per architecture)
TRUTH_EXPERIMENTS = {100: 4000, 2000: 400}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@functools.lru_cache(maxsize=None)
def _weights(n):
    """The bootstrap weights (R, n) of ``n`` images, and (n, R + 1) float32: their transpose
    with a column of ones (the point value: every image once) appended."""
    w = S.bootstrap_weights(n, REPLICATES, seed=n)
    return w, np.ascontiguousarray(np.hstack([w.T, np.ones((n, 1))]).astype(np.float32))


def _chunk(rng, n, k, b, wt, dense=False):
    """``b`` simulated experiments (module docstring) of ``n`` images and ``k`` seeds per
    architecture: the mIoU (points) for every column of ``wt`` (n, R + 1), shaped (b, 2
    architectures, k seeds, 2 evaluations (unreduced, reduced), R + 1).

    The intersections of all checkpoints and evaluations form one sparse matrix whose rows
    are (evaluation, experiment, class) and whose columns are images, so one product with
    ``wt`` gives every class's summed intersection in every replicate; the ground-truth unions
    are shared by every evaluation of an experiment, the false positives' are per evaluation.
    With ``dense`` also the per-image ``intersect`` and ``union`` arrays, (b, 2, k, 2, n, C)
    each, for the check against ``stats.metric_values``."""
    C, E, f32 = N_CLASSES, 2 * k * 2, np.float32        # E: (architecture, seed, evaluation)
    present = rng.random((b, C, n), dtype=f32) < FREQUENCY[None, :, None]
    _, cc, ii = np.nonzero(present)                     # ordered by (experiment, class, image)
    m = len(ii)
    z = rng.standard_normal((6 + 4 * k, m), dtype=f32)
    area = np.exp(SD_LOG_AREA * z[0]) * AREA_SCALE[cc].astype(f32)
    logit = np.empty((2, k, 2, m), dtype=f32)
    logit[:, :, 0] = (BASE_LOGIT[cc].astype(f32) + SD_DIFFICULTY * z[1]
                      + SD_ARCH * z[2:4, None] + SD_SEED * z[6:6 + 2 * k].reshape(2, k, m))
    logit[:, :, 1] = (logit[:, :, 0] - SHIFT + SD_ARCH_DROP * z[4:6, None]
                      + SD_SEED_DROP * z[6 + 2 * k:].reshape(2, k, m))
    inter = (_sigmoid(logit) * area).astype(wt.dtype)              # (2, k, 2, m)
    counts = present.sum(2).ravel()                                 # per (experiment, class)
    indptr = np.concatenate([[0], np.cumsum(np.tile(counts, E))])
    rows = E * b * C
    m_inter = sparse.csr_matrix((inter.ravel(), np.tile(ii, E), indptr), shape=(rows, n))
    m_truth = sparse.csr_matrix((area.astype(wt.dtype), ii, indptr[:b * C + 1]),
                                shape=(b * C, n))
    # false positives: per evaluation and image a Poisson number of classes it does not show
    rate = np.broadcast_to(np.tile(FALSE_POSITIVES, 2 * k)[:, None, None], (E, b, n))
    nfp = rng.poisson(rate)
    fe, fb, fi = (np.repeat(a, nfp[nfp > 0]) for a in np.nonzero(nfp))
    fc = rng.choice(C, size=len(fe), p=FP_CLASS)
    keep = ~present[fb, fc, fi]
    fe, fb, fc, fi = fe[keep], fb[keep], fc[keep], fi[keep]
    fp_area = np.exp(rng.normal(LOG_FP_AREA, 1.0, len(fe))) * AREA_SCALE[fc]
    m_fp = sparse.csr_matrix((fp_area.astype(wt.dtype), ((fe * b + fb) * C + fc, fi)),
                             shape=(rows, n))
    inter_r = (m_inter @ wt).reshape(E, b, C, -1)
    union_r = (m_fp @ wt).reshape(E, b, C, -1)
    union_r += (m_truth @ wt).reshape(1, b, C, -1)
    classes = np.count_nonzero(union_r, axis=2)          # the classes in the mean
    union_r += np.finfo(union_r.dtype).tiny              # union 0 (intersection 0): adds 0
    inter_r /= union_r
    with np.errstate(invalid='ignore', divide='ignore'):
        miou = 100.0 * inter_r.sum(2) / classes         # (E, b, R + 1)
    miou = miou.reshape(2, k, 2, b, -1).transpose(3, 0, 1, 2, 4)
    if not dense:
        return miou

    def per_image(mat):                                  # (b, E, n, C)
        return mat.toarray().reshape(E, b, C, n).transpose(1, 0, 3, 2)
    union = per_image(m_fp) + m_truth.toarray().reshape(b, C, n).transpose(0, 2, 1)[:, None]
    return (miou, per_image(m_inter).reshape(b, 2, k, 2, n, C),
            union.reshape(b, 2, k, 2, n, C))


def _simulate(n, k, count, seed, wt):
    """``count`` experiments (:func:`_chunk`), about 800 images per sparse product."""
    rng = np.random.default_rng(seed)
    b = max(1, 800 // n)
    return np.concatenate([_chunk(rng, n, k, min(b, count - i), wt)
                           for i in range(0, count, b)])


@functools.lru_cache(maxsize=None)
def _drops(n, k, count, seed):
    """``count`` experiments of ``n`` images, ``k`` seeds per architecture: each checkpoint's
    drop (reduced minus unreduced mIoU, points), point values (count, 2, k) and replicates
    (count, 2, k, R)."""
    miou = _simulate(n, k, count, seed, _weights(n)[1])
    drop = (miou[:, :, :, 1] - miou[:, :, :, 0]).astype(np.float64)
    return drop[..., -1], drop[..., :-1]


@functools.lru_cache(maxsize=None)
def _true_mean_drop(n):
    """The expected drop of a checkpoint on ``n`` images (over images, architecture and seed
    effects): the mean point drop of many other experiments, and its Monte Carlo standard
    error (experiments are independent; their two checkpoints are counted as one unit)."""
    count = TRUTH_EXPERIMENTS[n]
    miou = _simulate(n, 1, count, n + 1, np.ones((n, 1), dtype=np.float32))
    per_experiment = (miou[:, :, 0, 1, 0] - miou[:, :, 0, 0, 0]).mean(1)
    return float(per_experiment.mean()), float(per_experiment.std(ddof=1) / np.sqrt(count))


def _sides(source, k, sd_seed, delta=0.0, draw=0):
    """The first ``k`` seeds of each architecture of ``source``, with a per-checkpoint seed
    effect N(0, sd_seed) (``draw``: which independent draw of them) and ``delta`` added to
    every drop of A: x (E, 2, k), boot (E, 2, k, R)."""
    x, boot = _drops(*source)
    x, boot = x[:, :, :k], boot[:, :, :k]
    fx = np.random.default_rng([source[3], k, int(round(100 * sd_seed)), draw]).normal(
        0.0, sd_seed, x.shape)
    fx[:, 0] += delta
    return x + fx, boot + fx[..., None]


@functools.lru_cache(maxsize=None)
def _compared(source, k, sd_seed, delta=0.0, draw=0):
    """``compare`` (A minus B) of every experiment of ``_sides(...)``; shared by the tests, so
    a caller that decides on them copies them first."""
    x, boot = _sides(source, k, sd_seed, delta, draw)
    return tuple(V.compare(x[e, 0], boot[e, 0], x[e, 1], boot[e, 1], margin=1.0)
                 for e in range(len(x)))


def _rate(flags):
    return float(np.mean(flags))


@functools.lru_cache(maxsize=None)
def _level(n, k, sd_seed):
    """Under no difference: rate of p < 0.05, coverage of the unadjusted 95 % interval of the
    difference (0 inside) and of ``estimate``'s 95 % interval of an architecture's mean drop
    (the true expected drop inside; A's and B's intervals, identical in distribution under no
    difference, so twice as many intervals as experiments). With a seed SD the seed effects are
    drawn ``SEED_DRAWS`` times on the same simulated worlds (cheap, and where the seed term
    dominates it is what varies most): a rate near the nominal 95 % is then not decided by the
    chance spread of 400 experiments."""
    draws = range(SEED_DRAWS if sd_seed > 0 else 1)
    compared = [c for d in draws for c in _compared(LEVEL[n], k, sd_seed, draw=d)]
    truth = _true_mean_drop(n)[0]
    estimates = []
    for d in draws:
        x, boot = _sides(LEVEL[n], k, sd_seed, draw=d)
        estimates += [V.estimate(x[e, side], boot[e, side]) for e in range(len(x))
                      for side in (0, 1)]
    return (_rate([c['p'] < 0.05 for c in compared]),
            _rate([c['ci_low'] <= 0.0 <= c['ci_high'] for c in compared]),
            _rate([e['ci_low'] <= truth <= e['ci_high'] for e in estimates]))


def _old_rule_p(xa, boot_a, xb, boot_b):
    """The previous rule's p value: the image variance of the paired replicates' difference
    added to both seed terms (each seed's own image noise counted twice), Welch df."""
    k_a, k_b = len(xa), len(xb)
    va, vb = np.var(xa, ddof=1) / k_a, np.var(xb, ddof=1) / k_b
    se = np.sqrt(va + vb + np.var(boot_a.mean(0) - boot_b.mean(0), ddof=1))
    df = (va + vb) ** 2 / (va ** 2 / (k_a - 1) + vb ** 2 / (k_b - 1))
    return float(2 * sps.t.sf(abs(np.mean(xa) - np.mean(xb)) / se, df))


@functools.lru_cache(maxsize=None)
def _power_new_and_old(delta):
    """Rate of p < 0.05 at a true difference ``delta`` (100 images, 3 seeds, seed SD 0) for the
    rule of :mod:`verdicts` and for the old rule, on the same experiments."""
    compared = _compared(LEVEL[100], 3, 0.0, delta)
    x, boot = _sides(LEVEL[100], 3, 0.0, delta)
    old = [_old_rule_p(x[e, 0], boot[e, 0], x[e, 1], boot[e, 1]) < 0.05 for e in range(len(x))]
    return _rate([c['p'] < 0.05 for c in compared]), _rate(old)


def _decided(comparisons):
    """Copies of ``comparisons`` after ``decide`` as one family."""
    family = [dict(c) for c in comparisons]
    V.decide(family)
    return family


@functools.lru_cache(maxsize=None)
def _median_detectable(sd_seed):
    """Median ``detectable`` reported for a lone comparison (family of 1) under no difference,
    100 images, 3 seeds."""
    return float(np.median([_decided([c])[0]['detectable']
                            for c in _compared(LEVEL[100], 3, sd_seed)]))


@functools.lru_cache(maxsize=None)
def _holm_families(delta=0.0):
    """``FAMILIES`` families of ``FAMILY`` independent cells (100 images, 3 seeds, seed SD
    ``HOLM_SD``), decided; the first cell of each has the true difference ``delta``."""
    compared = _compared(HOLM, 3, HOLM_SD)
    x, boot = _sides(HOLM, 3, HOLM_SD)
    families = []
    for f in range(FAMILIES):
        cells = list(compared[f * FAMILY:(f + 1) * FAMILY])
        if delta:
            e = f * FAMILY
            cells[0] = V.compare(x[e, 0] + delta, boot[e, 0] + delta, x[e, 1], boot[e, 1],
                                 margin=1.0)
        families.append(_decided(cells))
    return families


def test_the_fast_path_is_the_library_metric():
    """The sparse float32 replicate mIoU of every checkpoint and evaluation equals
    ``stats.metric_values`` on the same per-image intersections and unions (one experiment
    at 100 and one at 2000 images), and the world has what the module docstring says: about
    8 classes per image, classes that only false positives bring into the mean (IoU 0), and
    replicates that leave a rare class out of the mean."""
    for n in (100, 2000):
        w, wt = _weights(n)
        miou, inter, union = _chunk(np.random.default_rng(n + 7), n, 2, 1, wt, dense=True)
        for idx in np.ndindex(*miou.shape[:4]):
            st = dict(kind=np.array('seg'), intersect=inter[idx].astype(np.float64),
                      union=union[idx].astype(np.float64))
            assert np.allclose(miou[idx][:-1], S.metric_values(st, w)), (n, idx)
            assert np.allclose(miou[idx][-1], S.metric_values(st, np.ones((1, n)))[0])
        shown = inter[0, 0, 0, 0] > 0
        assert 6 <= shown.sum(1).mean() <= 10, shown.sum(1).mean()
        if n == 100:
            total = union[0].sum(3)                                    # (2, 2, 2, C)
            assert np.any((total > 0) & ~shown.any(0))          # false positives only: IoU 0
            assert np.any((w @ union[0, 0, 0, 0] == 0) & (total[0, 0, 0] > 0))  # left out
        assert 30 < miou[0, 0, 0, 0, -1] < 60 and -12 < np.diff(miou[0, 0, 0, :, -1]) < -3


LEVEL_SETTINGS = [(100, 3, sd) for sd in (0.0, 1.0, 2.0, 4.0, 8.0)] + \
    [(100, 5, sd) for sd in (0.0, 2.0, 8.0)] + \
    [(n, k, sd) for n in (2000, ) for k in (3, 5) for sd in (0.0, 2.0, 8.0)]


@pytest.mark.parametrize('n,k,sd_seed', LEVEL_SETTINGS)
def test_no_difference_is_rarely_resolved_and_the_intervals_cover(n, k, sd_seed):
    """Under equal robustness (A and B identical in distribution): p < 0.05 (one comparison,
    unadjusted) at most 6 % of the time; the unadjusted 95 % interval of the difference covers
    0, and ``estimate``'s 95 % interval of an architecture's mean drop (A's and B's) covers the
    true expected drop, at least 94 % of the time. The true expected drop at ``n`` images is
    computed by a separate simulation of point values (``TRUTH_EXPERIMENTS``; its Monte Carlo standard error is below
    0.02 points, negligible against the intervals' half-widths)."""
    assert _true_mean_drop(n)[1] < 0.02
    fpr, cover, cover_a = _level(n, k, sd_seed)
    where = f'{n} images, {k} seeds, seed SD {sd_seed}'
    assert fpr <= 0.06, f'{where}: p < 0.05 in {fpr:.2%} of the experiments'
    assert cover >= 0.94, f'{where}: the difference\'s interval covers 0 in {cover:.2%}'
    assert cover_a >= 0.94, \
        f'{where}: an architecture\'s interval covers its true mean drop in {cover_a:.2%}'


@pytest.mark.parametrize('n', [100, 2000])
def test_one_seed_against_three_never_gives_a_verdict(n):
    """One trained model against three (either way round) never gets an architecture verdict,
    and ``decide`` keeps it out of the family: the other comparison is a family of one."""
    x, boot = _sides(LEVEL[n], 3, 2.0)
    full = _compared(LEVEL[n], 3, 2.0)
    for e in range(len(x)):
        one = V.compare(x[e, 0, :1], boot[e, 0, :1], x[e, 1], boot[e, 1], margin=1.0)
        other = V.compare(x[e, 0], boot[e, 0], x[e, 1, :1], boot[e, 1, :1], margin=1.0)
        for c in (one, other):
            assert c['verdict'] == V.NO_VERDICT and c['p'] is None and c['se'] is None, c
        family = [one, dict(full[e]), other]
        V.decide(family)
        assert family[0]['verdict'] == family[2]['verdict'] == V.NO_VERDICT
        assert family[0]['p_holm'] is None and family[2]['p_holm'] is None
        assert family[1]['family_size'] == 1 and family[1]['p_holm'] == pytest.approx(
            family[1]['p'])


def test_holm_keeps_the_familywise_error_of_sixteen_null_cells():
    """``FAMILIES`` families of 16 independent null comparisons (100 images, 3 seeds, seed
    SD 2): an experiment with any "A loses less / more" after ``decide`` at most 6 % of the
    time."""
    families = _holm_families()
    fwer = _rate([any(c['verdict'] in ('A loses less', 'A loses more') for c in f)
                  for f in families])
    assert fwer <= 0.06, f'any false verdict in {fwer:.2%} of the families of {FAMILY}'


def test_counting_the_image_term_once_finds_two_points_more_often():
    """A true difference of 2 points, 100 images, 3 seeds, seed SD 0: p < 0.05 at least 45 % of
    the time, and more often than with the old rule (image term counted twice) on the same
    experiments (the reference simulation: about 52 % against 31 %)."""
    new, old = _power_new_and_old(2.0)
    assert new >= 0.45 and new > old, f'power at 2 points: {new:.2%} (old rule {old:.2%})'


@pytest.mark.parametrize('sd_seed', [2.0, 0.0])
def test_the_detectable_difference_is_found_about_four_times_in_five(sd_seed):
    """At a true difference equal to the median ``detectable`` reported under no difference
    (family of one; 100 images, 3 seeds), fresh experiments find it (p < 0.05) 75-85 % of the
    time: the reported detectable difference means what it says (80 % power)."""
    detectable = _median_detectable(sd_seed)
    power = _rate([c['p'] < 0.05 for c in _compared(FRESH, 3, sd_seed, detectable)])
    assert 0.75 <= power <= 0.85, \
        f'seed SD {sd_seed}: median detectable {detectable:.2f} points found in {power:.2%}'


def test_the_detectable_difference_in_a_holm_family_of_sixteen():
    """In families of 16 (15 null cells and one with a true difference equal to the median
    ``detectable`` that ``decide`` reports for the null families; 100 images, 3 seeds, seed
    SD 2) the true one is declared "A loses less" 70-85 % of the time. The families are the
    null families of the Holm test with the difference added to their first cell; the median
    is over all 16 x ``FAMILIES`` cells, so one cell per family barely moves it.

    Measured 75.0 %: a few points short of the 80 % the noncentral t promises (a lone
    comparison reaches 79.5-83 %, the test above). At ``0.05 / 16`` the critical t of 3 seeds
    per side (about 4 Welch df, themselves estimated) is far in the tail, where the df's error
    and the image bootstrap's short image term (mIoU's per-class ratios) weigh most; the lower
    bound is 70 % so that this known shortfall, documented in docs/statistics.md, does not
    decide the test by the chance spread of the simulation (1.4 points)."""
    detectable = float(np.median([c['detectable'] for f in _holm_families() for c in f]))
    power = _rate([f[0]['verdict'] == 'A loses less' for f in _holm_families(detectable)])
    assert 0.70 <= power <= 0.85, \
        f'family of {FAMILY}: median detectable {detectable:.2f} points declared in {power:.2%}'
