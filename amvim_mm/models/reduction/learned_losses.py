"""The training objectives of learned token reducers: DynamicViT's distillation loss and
LTMP's FLOPs-budget loss (with the ViT FLOPs ratio of the official code, and the linear one of a
Mamba backbone, whose blocks cost in proportion to their tokens).

A pure function of the student's and the teacher's outputs, so that any model wrapper (an
mmengine model's ``loss``) can call it; each term is returned for logging.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from .settings import check_number


def dynamicvit_loss(pred: torch.Tensor, labels: torch.Tensor, token_pred: torch.Tensor,
                    teacher_pred: torch.Tensor, teacher_token: torch.Tensor,
                    decisions: Sequence[torch.Tensor], keep_ratios: Sequence[float],
                    final_mask: torch.Tensor, clf_weight: float = 1.0, ratio_weight: float = 2.0,
                    distill_weight: float = 0.5, mse_token: bool = True,
                    num_locations: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """DynamicViT's ``DistillDiffPruningLoss_dynamic`` (defaults: its DeiT run).

    ``total = clf_weight * CE(pred, labels) + ratio_weight / num_locations * sum_s mean_b
    (mean_n D_s - rho_s)^2 + distill_weight * KL(teacher || student logits) + distill_weight *
    token distillation``, the last over the tokens kept at the final decision (MSE, or
    batch-mean KL with ``mse_token=False``; 0 when none is kept).

    Args:
        pred: (B, K) student logits; labels: (B,) class indices (hard labels: plain CE; the
            official runs use soft targets under mixup, give ``pred`` the same way).
        token_pred, teacher_token: (B, N, C) final normed patch tokens.
        teacher_pred: (B, K) logits of the unreduced teacher.
        decisions: per location the cumulative keep decision (B, N) (or (B, N, 1)).
        keep_ratios: the target kept fraction per location (rho, rho^2, rho^3).
        final_mask: (B, N[, 1]) the last decision (detached by the caller).
        num_locations: the ratio term's divisor (default ``len(decisions)``), an int >= 1.
        clf_weight, ratio_weight, distill_weight: the terms' weights, each in [0, inf).

    Returns:
        dict ``loss`` (total), ``cls_loss``, ``ratio_loss`` (unweighted sum over locations),
        ``cls_kl_loss`` and ``token_loss``.
    """
    for key, w in (('clf_weight', clf_weight), ('ratio_weight', ratio_weight),
                   ('distill_weight', distill_weight)):
        check_number('dynamicvit_loss', key, w, low=0)
    if num_locations is not None:
        check_number('dynamicvit_loss', 'num_locations', num_locations, low=1, integer=True)
    ratio = keep_ratio_loss(decisions, keep_ratios)
    cls = F.cross_entropy(pred, labels)
    kl = logit_distill_loss(pred, teacher_pred)
    token = token_distill_loss(token_pred, teacher_token, final_mask, mse_token)
    n = num_locations if num_locations is not None else len(decisions)
    total = (clf_weight * cls + ratio_weight * ratio / n + distill_weight * kl
             + distill_weight * token)
    return dict(loss=total, cls_loss=cls, ratio_loss=ratio, cls_kl_loss=kl, token_loss=token)


def keep_ratio_loss(decisions: Sequence[torch.Tensor], keep_ratios: Sequence[float]
                    ) -> torch.Tensor:
    """DynamicViT's ratio term (unweighted): ``sum_s mean_b (mean_n D_s - rho_s)^2`` over the
    cumulative decisions ``D_s`` (B, N[, 1]) and their targets ``rho_s``."""
    ratio = decisions[0].new_zeros(())
    for d, rho in zip(decisions, keep_ratios):
        d = d.reshape(d.shape[0], -1)
        ratio = ratio + ((d.mean(1) - rho) ** 2).mean()
    return ratio


def logit_distill_loss(pred: torch.Tensor, teacher_pred: torch.Tensor) -> torch.Tensor:
    """``KL(teacher || student)`` of (B, K) logits, batch mean (DynamicViT's ``cls_kl_loss``)."""
    return F.kl_div(F.log_softmax(pred, -1), F.log_softmax(teacher_pred, -1),
                    reduction='batchmean', log_target=True)


def token_distill_loss(token_pred: torch.Tensor, teacher_token: torch.Tensor,
                       final_mask: torch.Tensor, mse_token: bool = True) -> torch.Tensor:
    """DynamicViT's token distillation: MSE (or batch-mean KL over channels) between the
    student's and the teacher's (B, N, C) tokens at the tokens kept by the (B, N[, 1]) final
    decision; 0 when none is kept."""
    B, N, C = token_pred.shape
    keep = final_mask.reshape(B * N)
    if keep.sum() < 0.1:
        return token_pred.new_zeros(())
    sel = keep > 0.5
    s, t = token_pred.reshape(B * N, C)[sel], teacher_token.reshape(B * N, C)[sel]
    if mse_token:
        return F.mse_loss(s, t)
    return F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction='batchmean',
                    log_target=True)


def vit_flops_ratio(masks: Sequence[torch.Tensor], n: int, d: int) -> torch.Tensor:
    """LTMP's FLOPs ratio of a ViT (its ``tools/train.py``): the mean over the L blocks of
    ``[2 m_{l-1} n d^2 + (m_{l-1} n)^2 d + 4 m_l n d^2] / (6 n d^2 + n^2 d)`` with ``m_l`` the
    mean of block l's mask over the batch and the tokens (class token included), ``m_0 = 1``
    (attention at the previous keep fraction, the MLP at the new one)."""
    means = [None] + [m.float().mean() if m.dtype == torch.bool else m.mean() for m in masks]
    full = 6 * n * d ** 2 + n ** 2 * d
    total = 0.0
    for i in range(len(masks)):
        prev = 1.0 if i == 0 else means[i]
        cost = 2 * prev * n * d ** 2 + (prev * n) ** 2 * d + 4 * means[i + 1] * n * d ** 2
        total = total + cost / full
    return total / len(masks)


def linear_flops_ratio(keep: Sequence[torch.Tensor], block_costs: Sequence[float],
                       fixed: float = 0.0) -> torch.Tensor:
    """FLOPs ratio of a backbone whose blocks cost in proportion to their tokens (Mamba):
    ``(fixed + sum_l c_l * k_l) / (fixed + sum_l c_l)`` with ``k_l`` the mean kept fraction
    that block l runs on (a tensor, differentiable) and ``c_l`` its cost at full length."""
    if len(keep) != len(block_costs):
        raise ValueError(f'{len(keep)} kept fractions for {len(block_costs)} blocks')
    total = fixed + sum(c * k.mean() for c, k in zip(block_costs, keep))
    return total / (fixed + sum(block_costs))


def ltmp_loss(ce: torch.Tensor, flops_ratio: torch.Tensor, target: float = 0.75,
              reg_scale: float = 10.0, cls_scale: float = 1.0) -> torch.Tensor:
    """LTMP's objective: ``cls_scale * ce + reg_scale * (flops_ratio - target) ** 2``
    (``target``, the FLOPs fraction kept, in (0, 1]; the weights in [0, inf))."""
    check_number('ltmp_loss', 'target', target, low=0, high=1, low_open=True)
    check_number('ltmp_loss', 'reg_scale', reg_scale, low=0)
    check_number('ltmp_loss', 'cls_scale', cls_scale, low=0)
    return cls_scale * ce + reg_scale * (flops_ratio - target) ** 2
