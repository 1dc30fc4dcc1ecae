"""Learned reducers on the backbones: the masked training forward equals physically pruned
inference when both take the same decisions (float64), the DynamicViT schedule, gradients,
state-dict round trips and the refusals."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction import DynamicViTReducer, learned
from amvim_mm.models.reduction.learned_losses import dynamicvit_loss
from amvim_mm.registry import MODELS

DYN = dict(type='DynamicViT', keep_rate=0.7, locations=(0, 2))


def _model(typ, out_type='featmap', with_cls=True, red=DYN, **kw):
    torch.manual_seed(0)
    return MODELS.build(dict(type=typ, arch='test', img_size=32, patch_size=4, stride=4,
                             out_type=out_type, with_cls_token=with_cls, out_indices=(1, 3),
                             fused_mixer=False, token_reduction=red, **kw))


def _topk_keep(log_probs, previous, tau=1.0):
    """A deterministic stand-in for the Gumbel sample: keep the tokens inference keeps (the
    highest keep log-probabilities among those still kept, as many as the schedule says)."""
    k = _topk_keep.counts.pop(0)
    score = torch.where(previous[..., 0] > 0, log_probs[..., 0], torch.full_like(
        log_probs[..., 0], -float('inf')))
    # inference drops the lowest (stable argsort ascending); keep the complement
    n_drop = int(previous[0].sum()) - k
    order = score.argsort(dim=1, stable=True)
    n_gone = int((previous[0, :, 0] == 0).sum())
    keep = torch.ones_like(score)
    keep.scatter_(1, order[:, :n_gone + n_drop], 0.)
    return keep.unsqueeze(-1) * previous


def _kept_counts(m):
    """The patch tokens kept after each of the schedule's steps."""
    M, depth = m.reduction_domain()
    kept, counts = M, []
    for k in m.token_reducer.removals(M, depth):
        if k:
            kept -= k
            counts.append(kept)
    return counts


@pytest.mark.parametrize('typ', ['Vim', 'AMVim', 'LocalVim'])
@pytest.mark.parametrize('with_cls,out_type', [(True, 'featmap'), (False, 'featmap'),
                                               (True, 'cls_token')])
def test_masked_training_forward_equals_pruned_inference(monkeypatch, typ, with_cls, out_type):
    m = _model(typ, out_type, with_cls).double()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    counts = _kept_counts(m)
    _topk_keep.counts = list(counts)
    monkeypatch.setattr(learned, 'gumbel_keep', _topk_keep)
    m.train()
    with torch.no_grad():
        got = m(x)
    keep = m.keep_mask
    m.eval()
    with torch.no_grad():
        want = m(x)
    assert m.token_counts[-1] == counts[-1] + int(with_cls)
    assert int(keep.sum(1)[0]) == counts[-1] + int(with_cls)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        # the blocks keep the residual stream in fp32 by design (both forwards): fp32 rounding
        # of the sums, everything else float64
        assert (g - w).abs().max() <= 1e-6 * w.abs().max()


def test_dynamicvit_schedule_is_the_official_count():
    red = DynamicViTReducer(keep_rate=0.7, locations=(5, 11, 17))
    rem = red.removals(196, 24)
    # int(196 * 0.7 ** s): 137, 96, 67 tokens kept, before blocks 6, 12 and 18 (DyVM)
    assert [i for i, k in enumerate(rem) if k] == [6, 12, 18]
    assert 196 - sum(rem[:7]) == 137 and 196 - sum(rem[:13]) == 96 and 196 - sum(rem) == 67
    assert red.keep_ratios() == pytest.approx([0.7, 0.49, 0.343])


def test_training_decisions_gradients_and_ratio_loss():
    m = _model('Vim', 'cls_token')
    m.train()
    out = m(torch.randn(4, 3, 32, 32))[-1]
    red = m.token_reducer
    d0, d1 = red.decisions
    assert d0.shape == (4, 64) and set(d0.unique().tolist()) <= {0.0, 1.0}
    assert bool((d1 <= d0).all())                  # a dropped token never comes back
    keep = m.keep_mask
    assert keep.shape == (4, 65) and bool((keep[:, 32] == 1).all())    # class token kept
    terms = red.loss_terms()
    want = dynamicvit_loss(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long),
                           torch.zeros(4, 1, 2), torch.zeros(4, 2), torch.zeros(4, 1, 2),
                           [d0, d1], [0.7, 0.49], torch.ones(4, 1), ratio_weight=2.0)
    assert terms['loss_keep_ratio'].item() == pytest.approx(2.0 * want['ratio_loss'].item() / 2)
    (out.sum() + terms['loss_keep_ratio']).backward()
    for p in (red.predictors[0].in_conv[1].weight, red.predictors[1].out_conv[4].weight,
              m.layers[3].mixer.in_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_learned_reducer_state_dict_round_trip_and_switching():
    m = _model('Vim')
    sd = m.state_dict()
    keys = [k for k in sd if k.startswith('token_reducer.predictors.')]
    assert keys and 'token_reducer.predictors.1.out_conv.4.weight' in keys
    m2 = _model('Vim')
    m2.load_state_dict(sd, strict=True)
    # training-free reducers replace it; None switches off; the learned one can come back
    red = m.token_reducer
    m.set_token_reduction(dict(type='ToMe', ratio=0.1))
    assert 'token_reducer' not in m._modules and not any(
        k.startswith('token_reducer.') for k in m.state_dict())
    m.set_token_reduction(red)
    assert m.token_reducer is red and 'token_reducer.predictors.0.in_conv.1.weight' in \
        m.state_dict()


def test_learned_reducer_refusals():
    m = MODELS.build(dict(type='VMamba', arch='test', reduction_stage=2,
                          token_reduction=dict(type='LTMP')))
    with pytest.raises(ConfigError, match='merges tokens'):
        m.train()(torch.randn(2, 3, 64, 64))
    with pytest.raises(ConfigError, match='tau'):
        DynamicViTReducer(tau=0)
    with pytest.raises(ConfigError, match='no block after'):
        _model('Vim', red=dict(type='DynamicViT', keep_rate=0.7, locations=(3, )))
    m = _model('Vim')
    other = MODELS.build(dict(type='Vim', arch=dict(embed_dims=48, num_layers=4), img_size=32,
                              patch_size=4, stride=4))
    with pytest.raises(ConfigError, match='built for width 32'):
        other.set_token_reduction(m.token_reducer)


# --------------------------------------------------------------------------------- LTMP
LTMP = dict(type='LTMP', merge_init=0.3, prune_init=0.8, tau=0.1)


@pytest.mark.parametrize('typ', ['Vim', 'AMVim', 'LocalVim'])
@pytest.mark.parametrize('with_cls', [True, False])
def test_ltmp_masked_training_equals_per_image_inference(typ, with_cls):
    """Hard thresholds take the same merges and prunes in the masked training forward (the
    whole batch) and in inference (image by image, tokens removed physically): the kept
    counts and the outputs agree (float64; the fp32 residual stream rounds)."""
    out_type = 'cls_token' if with_cls else 'featmap'
    m = _model(typ, out_type, with_cls, red=LTMP).double()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    m.train()
    with torch.no_grad():
        got = m(x)
    kept = m.keep_mask.sum(1)
    m.eval()
    red = m.token_reducer
    red.reset_observed()
    with torch.no_grad():
        want = m(x)
    counts = red._observed
    assert [c[-1] for c in counts] == [int(k) for k in kept]
    assert len({c[-1] for c in counts}) > 1          # the counts differ per image
    assert all(c[1] < c[0] for c in counts)          # merged / pruned before block 1
    if out_type == 'cls_token':
        for g, w in zip(got, want, strict=True):
            assert (g - w).abs().max() <= 1e-6 * w.abs().max()
    # the learned row's FLOPs use the mean counts
    from amvim_mm.analysis.flops import backbone_flops
    f = backbone_flops(m, 32, 'model')
    assert f['tokens'] == pytest.approx(red.mean_tokens())


def test_ltmp_threshold_gradients_and_flops_term():
    m = _model('Vim', 'cls_token', red=LTMP)
    m.train()
    out = m(torch.randn(4, 3, 32, 32))[-1]
    terms = m.token_reducer.loss_terms()
    assert 0 < terms['flops_ratio'] < 1
    (out.pow(2).mean() + terms['loss_flops']).backward()
    for mk in (m.token_reducer.merge_thresholds[0], m.token_reducer.prune_thresholds[1]):
        assert mk.threshold.grad is not None and mk.threshold.grad.abs().sum() > 0
    # 2 thresholds per block after the first: 3 + 3 on the 4-block test arch
    assert len(list(m.token_reducer.parameters())) == 6


def test_ltmp_refusals():
    from amvim_mm.models.reduction import LTMPReducer
    with pytest.raises(ConfigError, match='target'):
        LTMPReducer(target=1.5)
    with pytest.raises(ConfigError, match='both off'):
        LTMPReducer(merge=False, prune=False)
    with pytest.raises(ConfigError, match='out of range'):
        _model('Vim', red=dict(type='LTMP', blocks=(1, 9)))
    red = LTMPReducer()
    with pytest.raises(ConfigError, match='no image'):
        red.mean_tokens()
    m = _model('Vim', 'raw', red=LTMP).eval()
    with pytest.raises(ConfigError, match='differs per image'):
        m(torch.randn(2, 3, 32, 32))
    assert m(torch.randn(1, 3, 32, 32))[-1].shape[0] == 1      # one image: fine


# ---------------------------------------------------------------------------- PlainMamba
def _plain(out_type, red):
    torch.manual_seed(0)
    return MODELS.build(dict(type='PlainMamba', arch='test', img_size=64, out_type=out_type,
                             out_indices=(1, 3) if out_type == 'featmap' else -1,
                             token_reduction=red)).double()


@pytest.mark.parametrize('out_type', ['featmap', 'avg_featmap'])
def test_plainmamba_masked_training_equals_pruned_inference(monkeypatch, out_type):
    """PlainMamba's masked forward (dropped cells zero in the 7x7 conv, every snake direction
    scanning the kept tokens first with delta / B / C of the kept tokens in raster order and
    the visited cells' direction codes) equals its pruned inference without alignment."""
    m = _plain(out_type, dict(type='DynamicViT', keep_rate=0.7, locations=(0, 2)))
    x = torch.randn(3, 3, 64, 64, dtype=torch.float64)
    counts = _kept_counts(m)
    _topk_keep.counts = list(counts)
    monkeypatch.setattr(learned, 'gumbel_keep', _topk_keep)
    m.train()
    for mod in m.modules():                   # BN of L1's dw block: running statistics
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.eval()
    with torch.no_grad():
        got = m(x)
    m.eval()
    with torch.no_grad():
        want = m(x)
    assert m.token_counts[-1] == counts[-1]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert (g - w).abs().max() <= 1e-10 * max(1.0, float(w.abs().max()))


def test_plainmamba_ltmp_prune_only_and_merge_refused():
    m = _plain('avg_featmap', dict(type='LTMP', merge=False, prune_init=0.8, tau=0.1))
    m.train()
    for mod in m.modules():                   # BN of L1's dw block: running statistics
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.eval()
    x = torch.randn(3, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        got = m(x)[-1]
    kept = m.keep_mask.sum(1)
    m.eval()
    m.token_reducer.reset_observed()
    with torch.no_grad():
        want = m(x)[-1]
    assert [c[-1] for c in m.token_reducer._observed] == [int(k) for k in kept]
    assert (got - want).abs().max() <= 1e-10
    m = _plain('avg_featmap', dict(type='LTMP'))
    with pytest.raises(ConfigError, match='merges tokens'):
        m.train()(torch.randn(2, 3, 64, 64, dtype=torch.float64))


# -------------------------------------------------------------------------------- VMamba
@pytest.mark.parametrize('out_type', ['featmap', 'avg_featmap'])
def test_vmamba_masked_training_equals_pruned_inference(monkeypatch, out_type):
    """SS2D's masked forward in the reduction stage (dropped cells zero in the 3x3 conv,
    each direction scanning the kept tokens first, the MLP leaving dropped tokens alone)
    equals the stage's pruned inference; the restored grid goes on to the next stages."""
    torch.manual_seed(0)
    m = MODELS.build(dict(type='VMamba', arch='test', reduction_stage=2, out_type=out_type,
                          out_indices=(2, 3) if out_type == 'featmap' else (3, ),
                          token_reduction=dict(type='DynamicViT', keep_rate=0.6,
                                               locations=(0, )))).double()
    x = torch.randn(2, 3, 128, 96, dtype=torch.float64)
    M = (128 // 16) * (96 // 16)
    _topk_keep.counts = [int(M * 0.6)]
    monkeypatch.setattr(learned, 'gumbel_keep', _topk_keep)
    m.train()
    with torch.no_grad():
        got = m(x)
    assert int(m.keep_mask.sum(1)[0]) == int(M * 0.6)
    m.eval()
    with torch.no_grad():
        want = m(x)
    assert int(M * 0.6) in m.token_counts
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert (g - w).abs().max() <= 1e-10 * max(1.0, float(w.abs().max()))
