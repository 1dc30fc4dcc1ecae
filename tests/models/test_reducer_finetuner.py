"""ReducerFineTuner in process: student + frozen teacher, plain checkpoints into both, the loss
terms, gradients, and a few optimisation steps that lower the loss."""
import pytest
import torch

import amvim_mm  # noqa: F401
import mmpretrain.models  # noqa: F401  (registers ImageClassifier)
from mmpretrain.structures import DataSample

from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction.learned_losses import logit_distill_loss
from amvim_mm.registry import MODELS

CLASSIFIER = dict(
    type='mmpretrain.ImageClassifier',
    data_preprocessor=dict(type='mmpretrain.ClsDataPreprocessor', num_classes=3),
    backbone=dict(type='Vim', arch='test', img_size=32, patch_size=4, stride=4,
                  out_type='cls_token', fused_mixer=False),
    neck=None,
    head=dict(type='mmpretrain.LinearClsHead', num_classes=3, in_channels=32,
              loss=dict(type='mmpretrain.CrossEntropyLoss')))


def _wrapper(keep_rate=0.7, **kw):
    torch.manual_seed(0)
    model = dict(CLASSIFIER, backbone=dict(
        CLASSIFIER['backbone'],
        token_reduction=dict(type='DynamicViT', keep_rate=keep_rate, locations=(0, 2))))
    return MODELS.build(dict(type='ReducerFineTuner', model=model, **kw))


def _batch(n=4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, 32, 32, generator=g)
    samples = [DataSample().set_gt_label(i % 3) for i in range(n)]
    return x, samples


def test_plain_checkpoint_loads_into_student_and_teacher():
    torch.manual_seed(5)
    plain = MODELS.build(CLASSIFIER)
    w = _wrapper()
    missing, unexpected = w.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected
    assert all('token_reducer' in k for k in missing) and missing     # fresh predictors only
    for k, v in plain.state_dict().items():
        assert torch.equal(w.student.state_dict()[k], v)
        assert torch.equal(w.teacher.state_dict()[k], v)
    # its own checkpoint round trips strictly
    w2 = _wrapper()
    w2.load_state_dict(w.state_dict(), strict=True)
    # and so does the student exported alone (plain keys with the reducer's)
    w3 = _wrapper()
    w3.load_state_dict(w.student.state_dict(), strict=True)
    for k, v in w.student.state_dict().items():
        assert torch.equal(w3.student.state_dict()[k], v)


def test_loss_terms_gradients_and_teacher_frozen():
    w = _wrapper()
    w.train()
    assert not w.teacher.training and not any(p.requires_grad for p in w.teacher.parameters())
    x, samples = _batch()
    losses = w(x, samples, mode='loss')
    assert set(losses) >= {'loss', 'loss_keep_ratio', 'loss_distill_logits',
                           'loss_distill_tokens'}
    # the logit term is KL(teacher || student) of the two models' logits, x 0.5
    with torch.no_grad():
        t = w.teacher.head(w.teacher.extract_feat(x))
    assert losses['loss_distill_logits'].item() >= 0
    total = sum(v for k, v in losses.items() if k.startswith('loss'))
    total.backward()
    pred = w.backbone.token_reducer.predictors[0].in_conv[1].weight
    assert pred.grad is not None and pred.grad.abs().sum() > 0
    assert all(p.grad is None for p in w.teacher.parameters())
    w.eval()
    with torch.no_grad():
        s = w.student.head(w.student.extract_feat(x))      # inference path: tokens pruned
    assert w.backbone.token_counts[-1] == int(64 * 0.49) + 1
    assert logit_distill_loss(s, t).item() >= 0
    out = w(x, samples, mode='predict')
    assert len(out) == 4 and out[0].pred_score.shape == (3, )


def test_a_few_steps_lower_the_keep_ratio_loss():
    """Only the predictors train (train_only_reducer); the target keep 0.3 / 0.09 is far from
    the fresh predictors' ~0.5: the ratio loss falls."""
    w = _wrapper(keep_rate=0.3, train_only_reducer=True, logit_weight=0.0, token_weight=0.0)
    assert w.teacher is None
    trainable = [n for n, p in w.named_parameters() if p.requires_grad]
    assert trainable and all('token_reducer' in n for n in trainable)
    opt = torch.optim.Adam([p for p in w.parameters() if p.requires_grad], lr=1e-2)
    x, samples = _batch(8)
    w.train()
    hist = []
    torch.manual_seed(0)
    for _ in range(30):
        losses = w(x, samples, mode='loss')
        hist.append(losses['loss_keep_ratio'].item())
        opt.zero_grad()
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
        opt.step()
    assert sum(hist[-5:]) / 5 < 0.5 * sum(hist[:5]) / 5, hist


def test_refusals():
    with pytest.raises(ConfigError, match='learned reducer'):
        MODELS.build(dict(type='ReducerFineTuner', model=CLASSIFIER))
    with pytest.raises(ConfigError, match='not a learned reducer'):
        MODELS.build(dict(type='ReducerFineTuner', model=dict(CLASSIFIER, backbone=dict(
            CLASSIFIER['backbone'], token_reduction=dict(type='ToMe', ratio=0.1)))))
    with pytest.raises(ConfigError, match='logit_weight'):
        _wrapper(logit_weight=-1)
