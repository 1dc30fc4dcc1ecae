"""The level of the architecture verdicts, measured by simulation through the project's own
statistics code (:mod:`amvim_mm.analysis.verdicts`), not assumed.

Each simulated experiment is a sweep cell as ``prune_eval`` sees it: two architectures, ``k``
training seeds each, the same ``n`` validation images for every checkpoint, and per image and
checkpoint a drop ``true drop + seed effect + architecture x image effect + seed x image
noise``; each checkpoint's point value is its mean over the images and its bootstrap
replicates resample the images with one draw shared by every checkpoint (paired), as
``amvim_mm.analysis.stats.bootstrap_weights`` does. Seeded: the rates are reproducible.
"""
import numpy as np
import pytest

from amvim_mm.analysis import verdicts as V
from amvim_mm.analysis.stats import bootstrap_weights

N_IMAGES, REPLICATES, EXPERIMENTS = 100, 200, 500
SD_ARCH_IMAGE, SD_NOISE = 6.0, 12.0      # points of a per-image drop


def _experiments(k, sd_seed, effect, seed, n=EXPERIMENTS):
    """Per experiment: (x_a, boot_a, x_b, boot_b, true difference of the mean drops)."""
    rng = np.random.default_rng(seed)
    w = bootstrap_weights(N_IMAGES, REPLICATES, seed=seed) / N_IMAGES      # (R, n)
    for _ in range(n):
        drops = []
        for true in (-10.0 + effect, -10.0):
            seed_fx = rng.normal(0, sd_seed, size=(k, 1))
            arch_img = rng.normal(0, SD_ARCH_IMAGE, size=(1, N_IMAGES))
            noise = rng.normal(0, SD_NOISE, size=(k, N_IMAGES))
            drops.append(true + seed_fx + arch_img + noise)                # (k, n)
        (da, db) = drops
        yield da.mean(1), (w @ da.T).T, db.mean(1), (w @ db.T).T, effect


def _rates(k, sd_seed, effect, seed):
    resolved = covered = 0
    for xa, ba, xb, bb, true in _experiments(k, sd_seed, effect, seed):
        c = V.compare(xa, ba, xb, bb, margin=1.0)
        resolved += c['p'] < 0.05
        est = V.estimate(xa, ba)
        covered += est['ci_low'] <= -10.0 + effect <= est['ci_high']
    return resolved / EXPERIMENTS, covered / EXPERIMENTS


@pytest.mark.parametrize('k', [3, 5])
@pytest.mark.parametrize('sd_seed', [0.0, 2.0, 4.0, 8.0])
def test_false_positive_rate_and_coverage_hold_their_level(k, sd_seed):
    """Under equal robustness "resolved" (p < 0.05) happens at most 6 % of the time, and the
    per-architecture interval covers the true mean drop at least 94 % of the time."""
    fpr, coverage = _rates(k, sd_seed, 0.0, seed=1000 * k + int(sd_seed))
    assert fpr <= 0.06, f'{k} seeds, seed SD {sd_seed}: false positives {fpr:.3f}'
    assert coverage >= 0.94, f'{k} seeds, seed SD {sd_seed}: coverage {coverage:.3f}'


@pytest.mark.parametrize('k,least', [(3, 0.5), (5, 0.9)])
def test_power_rises_with_the_effect(k, least):
    """The rate of "resolved" grows with the true difference (0 / 2 / 4 / 8 points, seed SD 2)
    and more seeds find a large one more often (the price of the conservative interval: with 3
    seeds its df are about 4)."""
    rates = [_rates(k, 2.0, effect, seed=77 + k)[0] for effect in (0.0, 2.0, 4.0, 8.0)]
    assert rates == sorted(rates) and rates[-1] > rates[0], rates
    assert rates[-1] >= least, rates


def test_two_copies_of_the_same_checkpoints_are_never_better_or_worse():
    """The acceptance case: the same per-seed results under two names."""
    out = []
    for xa, ba, _, _, _ in _experiments(3, 4.0, 0.0, seed=5, n=50):
        out.append(V.compare(xa, ba, xa.copy(), ba.copy(), margin=1.0))
    V.decide(out)
    assert {c['verdict'] for c in out} <= {'equivalent', 'inconclusive'}
    assert all(c['difference'] == 0 and c['p'] == 1.0 for c in out)


def test_decide_adjusts_with_holm_and_says_equivalent_only_within_the_margin():
    def cmp(d, se, margin=1.0):
        # one seed each, no image variation but the given se: a normal test on d / se
        rep = np.random.default_rng(0).normal(0, 1, 4000)
        rep = (rep - rep.mean()) / rep.std(ddof=1) * se
        return V.compare([d], (d + rep)[None], [0.0], np.zeros((1, 4000)), margin)
    fam = [cmp(3.0, 1.0), cmp(2.2, 1.0), cmp(0.0, 0.1), cmp(0.5, 1.0), cmp(-3.0, 1.0)]
    raw = [c['p'] for c in fam]
    V.decide(fam)
    from statsmodels.stats.multitest import multipletests
    assert np.allclose([c['p_holm'] for c in fam], multipletests(raw, method='holm')[1])
    # 2.2 / 1.0 is resolved alone (p = 0.028) but not after Holm over five comparisons
    assert raw[1] < 0.05 and fam[1]['p_holm'] >= 0.05
    assert [c['verdict'] for c in fam] == ['A loses less', 'inconclusive', 'equivalent',
                                          'inconclusive', 'A loses more']
    assert all(c['family_size'] == 5 and c['adjustment'] == 'holm' for c in fam)
    # the detectable difference: (z(0.975) + z(0.8)) * se with one seed each
    assert fam[0]['detectable'] == pytest.approx(2.8016, abs=1e-3)


def test_estimate_and_compare_follow_the_formula():
    x = np.array([1.0, 2.0, 4.0])
    boot = np.array([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    est = V.estimate(x, boot)
    se = np.sqrt(np.var(x, ddof=1) / 3 + np.var(boot.mean(0), ddof=1))
    assert est['value'] == pytest.approx(7 / 3) and est['se'] == pytest.approx(se)
    from scipy import stats as sps
    assert est['ci_high'] - est['value'] == pytest.approx(sps.t.ppf(0.975, 2) * se)
    assert est['df'] == 2 and 'training seeds' in est['basis']
    one = V.estimate([1.0], boot[:1])
    assert one['df'] is None and 'one training seed' in one['basis']
    c = V.compare(x, boot, x - 1, boot - 1, margin=0.5)     # shifted copy: no image term
    assert c['difference'] == pytest.approx(1.0)
    assert c['se'] == pytest.approx(np.sqrt(2 * np.var(x, ddof=1) / 3))
    assert c['df'] == pytest.approx(4.0)                     # Welch with equal variances
    with pytest.raises(ValueError, match='margin'):
        V.compare(x, boot, x, boot, margin=0.0)


def test_robustness_auc_is_the_mean_of_the_curve():
    kept = [1.0, 0.73, 0.54]
    assert V.robustness_auc(kept, np.array([0.0, -2.0, -4.0])) == pytest.approx(
        ((0.0 - 2.0) / 2 * 0.27 + (-2.0 - 4.0) / 2 * 0.19) / 0.46)
    vals = np.array([[0.0, 0.0], [-1.0, -3.0], [-2.0, -6.0]])             # two replicates
    assert np.allclose(V.robustness_auc(kept, vals),
                       [V.robustness_auc(kept, vals[:, 0]), V.robustness_auc(kept, vals[:, 1])])
    with pytest.raises(ValueError, match='two different'):
        V.robustness_auc([1.0, 1.0], np.zeros(2))


def test_required_seeds_for_a_margin():
    # no image error: (t(0.975, 2k-2) + t(0.8, 2k-2)) * sd * sqrt(2 / k) <= margin
    k = V.required_seeds(sd_seed=2.0, sd_image=0.0, margin=2.0)
    from scipy import stats as sps
    def ok(k):
        return (sps.t.ppf(0.975, 2 * k - 2) + sps.t.ppf(0.8, 2 * k - 2)) * 2.0 * np.sqrt(2 / k) \
            <= 2.0
    assert ok(k) and not ok(k - 1)
    assert V.required_seeds(sd_seed=8.0, sd_image=0.0, margin=0.1, max_seeds=10) is None
