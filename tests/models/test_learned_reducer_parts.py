"""The pieces of the learned reducers against independent re-statements of the official
modules (``tests/reference/official_dynamicvit.py``, ``official_ltmp.py``), random weights and
inputs."""
import pytest
import torch

from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction.keep_predictor import KeepPredictor, gumbel_keep
from amvim_mm.models.reduction.learned_losses import (dynamicvit_loss, linear_flops_ratio,
                                                      ltmp_loss, vit_flops_ratio)
from amvim_mm.models.reduction.threshold_masker import ThresholdMasker
from ..reference import official_dynamicvit as ref
from ..reference import official_ltmp as ltmp_ref


@pytest.mark.parametrize('C', [16, 64])
@pytest.mark.parametrize('policy_kind', ['ones', 'binary', 'soft'])
def test_keep_predictor_equals_official(C, policy_kind):
    torch.manual_seed(0)
    m = KeepPredictor(C).double()
    with torch.no_grad():                       # LayerNorm away from 1 / 0
        m.in_conv[0].weight.normal_(1, 0.3)
        m.in_conv[0].bias.normal_(0, 0.3)
    sd = m.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == ref.official_predictor_keys(C)
    x = torch.randn(3, 10, C, dtype=torch.float64)
    policy = {'ones': torch.ones(3, 10, 1), 'binary': (torch.rand(3, 10, 1) > 0.4).float(),
              'soft': torch.rand(3, 10, 1)}[policy_kind].double()
    policy[:, 0] = 1                            # at least one kept token per sample
    with torch.no_grad():
        got = m(x, policy)
    want = ref.predictor_lg(sd, '', x, policy)
    assert (got - want).abs().max() <= 1e-6
    # the global half sees only kept tokens: changing a dropped token's features moves
    # nothing but its own row
    if policy_kind == 'binary':
        dropped = (policy[0, :, 0] == 0).nonzero().flatten()
        if len(dropped):
            j = int(dropped[0])
            x2 = x.clone()
            x2[0, j] += 5
            with torch.no_grad():
                got2 = m(x2, policy)
            others = [i for i in range(10) if i != j]
            assert torch.allclose(got2[0, others], got[0, others])


def test_keep_predictor_rejects_odd_width():
    with pytest.raises(ConfigError, match='even int'):
        KeepPredictor(15)


def test_gumbel_keep_is_hard_monotone_and_straight_through():
    torch.manual_seed(0)
    logits = torch.randn(2, 12, 2, requires_grad=True)
    prev = torch.ones(2, 12, 1)
    prev[:, :4] = 0
    d = gumbel_keep(torch.log_softmax(logits, -1), prev)
    assert set(d.unique().tolist()) <= {0.0, 1.0} and bool((d[:, :4] == 0).all())
    d.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize('mse_token', [True, False])
@pytest.mark.parametrize('weights', [ref.LOSS_DEIT, ref.LOSS_DEFAULTS], ids=['deit', 'class'])
def test_dynamicvit_loss_equals_official(mse_token, weights):
    g = torch.Generator().manual_seed(0)
    B, N, C, K = 4, 9, 8, 5
    pred = torch.randn(B, K, generator=g, dtype=torch.float64, requires_grad=True)
    tok = torch.randn(B, N, C, generator=g, dtype=torch.float64, requires_grad=True)
    t_pred = torch.randn(B, K, generator=g, dtype=torch.float64)
    t_tok = torch.randn(B, N, C, generator=g, dtype=torch.float64)
    labels = torch.randint(0, K, (B, ), generator=g)
    d1 = (torch.rand(B, N, generator=g) > 0.2).double()
    d2 = d1 * (torch.rand(B, N, generator=g) > 0.3).double()
    d3 = d2 * (torch.rand(B, N, generator=g) > 0.3).double()
    decisions, rhos = [d1, d2, d3], weights['keep_ratio']
    w = dict(clf_weight=weights['clf_weight'], ratio_weight=weights['ratio_weight'],
             distill_weight=weights['distill_weight'])
    got = dynamicvit_loss(pred, labels, tok, t_pred, t_tok, decisions, rhos,
                          d3[..., None], mse_token=mse_token, **w)
    want = ref.distill_diff_pruning_loss(pred, tok, d3[..., None], decisions, labels, t_pred,
                                         t_tok, rhos, mse_token=mse_token, **w)
    for k in ('loss', 'cls_loss', 'ratio_loss', 'cls_kl_loss', 'token_loss'):
        assert abs(got[k].item() - want[k].item()) <= 1e-6, k
    g1 = torch.autograd.grad(got['loss'], (pred, tok))
    g2 = torch.autograd.grad(want['loss'], (pred, tok))
    for a, b in zip(g1, g2, strict=True):
        assert (a - b).abs().max() <= 1e-6
    # nothing kept at the end: no token term
    none = dynamicvit_loss(pred, labels, tok, t_pred, t_tok, decisions, rhos,
                           torch.zeros(B, N, 1, dtype=torch.float64), **w)
    assert float(none['token_loss']) == 0.0


# ------------------------------------------------------------------------------ LTMP

@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('tau', [0.5, 0.1])
def test_threshold_masker_equals_official(dtype, tau):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(4, 33, generator=g, dtype=dtype)
    v[0, :3] = 0.25                                   # exactly at the threshold: 0
    masker = ThresholdMasker(0.25, tau).to(dtype)
    v1, v2 = v.clone().requires_grad_(True), v.clone().requires_grad_(True)
    th = torch.tensor([0.25], dtype=dtype, requires_grad=True)
    got = masker(v1)
    want = ltmp_ref.threshold_mask(v2, th, tau)
    assert torch.equal(got, want) and set(got.unique().tolist()) <= {0.0, 1.0}
    assert bool((got[0, :3] == 0).all())
    w = torch.randn(4, 33, generator=g, dtype=dtype)
    ga = torch.autograd.grad((got * w).sum(), (v1, masker.threshold))
    gb = torch.autograd.grad((want * w).sum(), (v2, th))
    for a, b in zip(ga, gb, strict=True):
        assert (a - b).abs().max() <= 1e-6 * max(1.0, float(b.abs().max()))


def test_flops_ratios_and_loss_equal_official():
    g = torch.Generator().manual_seed(0)
    masks = [(torch.rand(3, 197, generator=g) > p).double().requires_grad_(True)
             for p in (0.1, 0.3, 0.5, 0.6)]
    got = vit_flops_ratio(masks, 197, 192)
    want = ltmp_ref.flops_ratio(masks, 197, 192)
    assert abs(got.item() - want.item()) <= 1e-6
    ga = torch.autograd.grad(got, masks)
    gb = torch.autograd.grad(want, masks)
    assert all((a - b).abs().max() <= 1e-9 for a, b in zip(ga, gb, strict=True))
    ce = torch.tensor(2.3, dtype=torch.float64)
    assert ltmp_loss(ce, got).item() == pytest.approx(ltmp_ref.ltmp_loss(ce, want).item(),
                                                      abs=1e-9)
    # the Mamba form: linear in the tokens; all kept -> 1, half kept everywhere -> below 1
    ones = [torch.ones(2, 10)] * 3
    assert linear_flops_ratio(ones, [1.0, 2.0, 3.0], fixed=4.0).item() == pytest.approx(1.0)
    half = [torch.full((2, 10), 0.5)] * 3
    assert linear_flops_ratio(half, [1.0, 2.0, 3.0], fixed=4.0).item() == pytest.approx(0.7)


def test_softmax_with_policy_is_removal_the_semantics_our_masked_scan_keeps():
    """DynamicViT's ``softmax_with_policy`` (official re-statement) makes a dropped token
    invisible: at a kept query its row over the kept keys is the softmax of the pruned sequence
    (to the official eps). Our scan equivalent is the masked forward, whose identity with the
    pruned sequence is tested in tests/models/test_masked_training_path.py and
    tests/models/test_learned_reducers.py."""
    g = torch.Generator().manual_seed(0)
    B, H, N = 2, 3, 9
    attn = torch.randn(B, H, N, N, generator=g, dtype=torch.float64)
    policy = (torch.rand(B, N, 1, generator=g) > 0.4).double()
    policy[:, 0] = 1
    out = ref.softmax_with_policy(attn, policy)
    for b in range(B):
        kept = policy[b, :, 0].nonzero().flatten()
        want = torch.softmax(attn[b][:, kept][:, :, kept], -1)
        got = out[b][:, kept][:, :, kept]
        assert (got - want).abs().max() < 1e-5
        dropped = (policy[b, :, 0] == 0).nonzero().flatten()
        if len(dropped):
            assert out[b][:, kept][:, :, dropped].abs().max() < 1e-5
