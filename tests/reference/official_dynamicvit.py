"""An independent, slow re-statement of the official DynamicViT pruning pieces (test ground truth).

Re-states three pieces of github raoyongming/DynamicViT at commit 1322e62:

* ``PredictorLG`` (``models/dyvit.py``): the token keep/drop score predictor, as
  :func:`predictor_lg` on a plain state dict with the official key names (see
  :func:`official_predictor_keys`).
* ``Attention.softmax_with_policy`` (``models/dyvit.py``): the masked softmax used while
  training, as :func:`softmax_with_policy`.
* ``DistillDiffPruningLoss_dynamic.forward`` (``losses.py``): the training loss, as
  :func:`distill_diff_pruning_loss` (the teacher outputs are passed in instead of the teacher
  model and its input images).

It is written from the semantics below with plain tensor operations and shares no code with
``amvim_mm`` (nor with the official repository).

Semantics re-stated (B batch, N tokens, C channels, H heads):

* PredictorLG(x (B, N, C), policy (B, N, 1)): ``h = GELU(W0 LN(x) + b0)`` (LN eps 1e-5, exact
  GELU); local = h[..., :C//2]; global = sum_n(h[..., C//2:] * policy) / sum_n(policy) (one
  vector per sample, broadcast to every token); ``z = cat([local, global])``; then
  ``LogSoftmax(W3 GELU(W2 GELU(W1 z + b1) + b2) + b3)`` with widths C -> C//2 -> C//4 -> 2.
  Output (B, N, 2) log-probabilities; channel 0 is "keep".
* softmax_with_policy(attn (B, H, N, N), policy (B, N, 1)): ``G_ij = policy_j`` for i != j and
  ``G_ii = 1``; ``A_ij = exp(a_ij - max_k a_ik) * G_ij`` computed in fp32;
  ``out_ij = (A_ij + eps/N) / (sum_k A_ik + eps)``, eps 1e-6, cast back to the input dtype.
* Gumbel hard decision while training (random, not compared numerically by the tests): at the
  pruning location s with score log-probs ``p_s = PredictorLG(x[:, 1:], D_{s-1})``,
  ``D_s = gumbel_softmax(p_s, hard=True)[..., 0:1] * D_{s-1}`` (tau 1, straight-through), with
  ``D_0 = 1``; the attention policy of that block and of every later block (until the next
  location) is ``cat([1 (cls), D_s])``; blocks before the first location still go through
  softmax_with_policy with an all-ones policy (so the eps terms apply there too).
  ``out_pred_score`` collects ``D_s`` as (B, N) and the loss's ``mask`` is the last ``D_s``
  (detached).
* Loss (official defaults of the class: clf_weight 0, ratio_weight 2.0, distill_weight 0.5,
  keep_ratio [0.75, 0.5, 0.25], pruning_loc [3, 6, 9], mse_token False; the DeiT run of
  ``main.py`` uses clf_weight 1.0, ratio_weight 2.0, distill_weight 0.5, keep_ratio
  [0.9, 0.81, 0.729], mse_token True, pruning_loc left at [3, 6, 9])::

      ratio   = sum_s mean_b (mean_n D_s[b, n] - keep_ratio[s]) ** 2
      cls     = base_criterion(pred, labels)
      cls_kl  = sum_{b,k} q_bk (log q_bk - log p_bk) / B,  p = softmax(pred), q = softmax(t_pred)
      token   = mean over kept (b, n) (mask > 0.5) and over c of (token_pred - t_token) ** 2
                (0 if mask.sum() < 0.1; KL batchmean over kept tokens when mse_token is False)
      total   = clf_weight * cls + ratio_weight * ratio / len(pruning_loc)
                + distill_weight * cls_kl + distill_weight * token

  The official base criterion is ``SoftTargetCrossEntropy`` under mixup (``main.py`` default);
  here it is plain cross entropy with hard labels (``F.cross_entropy``, mean over the batch).
"""
import math

import torch
import torch.nn.functional as F

LN_EPS = 1e-5  # nn.LayerNorm(embed_dim) inside PredictorLG (default eps)

# official keyword defaults of DistillDiffPruningLoss_dynamic.__init__
LOSS_DEFAULTS = dict(ratio_weight=2.0, distill_weight=0.5, pruning_loc=(3, 6, 9),
                     keep_ratio=(0.75, 0.5, 0.25), clf_weight=0.0, mse_token=False)
# the values main.py passes for the DeiT models (base_rate 0.9)
LOSS_DEIT = dict(ratio_weight=2.0, distill_weight=0.5, pruning_loc=(3, 6, 9),
                 keep_ratio=(0.9, 0.9 ** 2, 0.9 ** 3), clf_weight=1.0, mse_token=True)


def official_predictor_keys(C):
    """Official ``PredictorLG(embed_dim=C)`` state dict key -> shape map."""
    return {
        'in_conv.0.weight': (C,), 'in_conv.0.bias': (C,),
        'in_conv.1.weight': (C, C), 'in_conv.1.bias': (C,),
        'out_conv.0.weight': (C // 2, C), 'out_conv.0.bias': (C // 2,),
        'out_conv.2.weight': (C // 4, C // 2), 'out_conv.2.bias': (C // 4,),
        'out_conv.4.weight': (2, C // 4), 'out_conv.4.bias': (2,),
    }


def _gelu(x):
    """Exact (erf) GELU."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _dense(x, w, b):
    """x (..., I) @ w (O, I)^T + b (O,)."""
    return torch.einsum('...i,oi->...o', x, w) + b


def _layer_norm(x, w, b, eps=LN_EPS):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def predictor_lg(sd, prefix, x, policy):
    """Official PredictorLG forward.

    Args:
        sd: state dict holding ``prefix + k`` for every k of :func:`official_predictor_keys`.
        prefix: key prefix, e.g. ``''`` or ``'score_predictor.0.'``.
        x: (B, N, C) tokens (without the cls token).
        policy: (B, N, 1) current keep decision (1 keep, 0 dropped).

    Returns:
        (B, N, 2) log-probabilities (channel 0 = keep, channel 1 = drop).
    """
    def p(k):
        return sd[prefix + k]

    B, N, C = x.shape
    h = _layer_norm(x, p('in_conv.0.weight'), p('in_conv.0.bias'))
    h = _gelu(_dense(h, p('in_conv.1.weight'), p('in_conv.1.bias')))
    half = C // 2
    local = h[:, :, :half]
    glob = h[:, :, half:]
    w = policy.reshape(B, N, 1).to(h.dtype)
    num = torch.zeros(B, C - half, dtype=h.dtype, device=h.device)
    den = torch.zeros(B, 1, dtype=h.dtype, device=h.device)
    for n in range(N):  # policy-weighted token mean, written as an explicit loop
        num = num + glob[:, n] * w[:, n]
        den = den + w[:, n]
    glob_mean = (num / den)[:, None, :].expand(B, N, C - half)
    z = torch.cat([local, glob_mean], dim=-1)
    z = _gelu(_dense(z, p('out_conv.0.weight'), p('out_conv.0.bias')))
    z = _gelu(_dense(z, p('out_conv.2.weight'), p('out_conv.2.bias')))
    z = _dense(z, p('out_conv.4.weight'), p('out_conv.4.bias'))
    return z - torch.logsumexp(z, dim=-1, keepdim=True)


def softmax_with_policy(attn, policy, eps=1e-6):
    """Official Attention.softmax_with_policy.

    Args:
        attn: (B, H, N, N) attention logits (already scaled).
        policy: (B, N, 1) keep policy (cls token included, 1 keep / 0 dropped).
        eps: the official 1e-6.

    Returns:
        (B, H, N, N) attention weights in ``attn.dtype``.
    """
    B, H, N, _ = attn.shape
    g = policy.reshape(B, 1, 1, N).to(torch.float32).expand(B, 1, N, N).clone()
    idx = torch.arange(N, device=attn.device)
    g[:, :, idx, idx] = 1.0  # a token always attends to itself
    shifted = attn - attn.max(dim=-1, keepdim=True).values
    a = torch.exp(shifted.to(torch.float32)) * g
    out = (a + eps / N) / (a.sum(dim=-1, keepdim=True) + eps)
    return out.to(attn.dtype)


def _kl_log_target(log_p, log_q):
    """``F.kl_div(log_p, log_q, 'batchmean', log_target=True)``: sum q (log q - log p) / B."""
    return (log_q.exp() * (log_q - log_p)).sum() / log_p.shape[0]


def distill_diff_pruning_loss(pred, token_pred, mask, out_pred_score, labels, teacher_pred,
                              teacher_token, keep_ratio, clf_weight, ratio_weight,
                              distill_weight, mse_token=True, num_pruning_loc=None,
                              dynamic=False):
    """Official DistillDiffPruningLoss_dynamic.forward with plain CE as the base criterion.

    Args:
        pred: (B, K) student logits.
        token_pred: (B, N, C) student final tokens after the last norm (no cls token).
        mask: (B, N, 1) (or any B*N shaped) final keep decision of the student.
        out_pred_score: list of (B, N) cumulative keep decisions, one per pruning location.
        labels: (B,) hard class labels.
        teacher_pred: (B, K) teacher logits.
        teacher_token: (B, N, C) teacher final tokens (no cls token).
        keep_ratio: target keep ratio per pruning location.
        clf_weight, ratio_weight, distill_weight: loss weights.
        mse_token: token distillation by MSE (True) or by KL batchmean (False).
        num_pruning_loc: the divisor of the ratio loss (official ``len(pruning_loc)``, default
            [3, 6, 9]); ``None`` means ``len(out_pred_score)``.
        dynamic: the official ``dynamic`` flag (ratio over the whole batch instead of per
            sample); False in every official run.

    Returns:
        dict with ``loss`` (total), ``cls_loss``, ``ratio_loss`` (un-weighted sum over the
        locations), ``cls_kl_loss`` and ``token_loss``.
    """
    ratio_loss = pred.new_zeros(())
    for s, score in enumerate(out_pred_score):
        if dynamic:
            kept = score.mean()
        else:
            kept = score.mean(dim=1)
        ratio_loss = ratio_loss + ((kept - keep_ratio[s]) ** 2).mean()

    cls_loss = F.cross_entropy(pred, labels)
    cls_kl = _kl_log_target(torch.log_softmax(pred, dim=-1),
                            torch.log_softmax(teacher_pred, dim=-1))

    B, N, C = token_pred.shape
    flat_mask = mask.reshape(B * N)
    if flat_mask.sum() < 0.1:  # official: a (1,) zero tensor, here a 0-d one
        token_loss = token_pred.new_zeros(())
    else:
        keep = flat_mask > 0.5
        s_tok = token_pred.reshape(B * N, C)[keep]
        t_tok = teacher_token.reshape(B * N, C)[keep]
        if mse_token:
            token_loss = ((s_tok - t_tok) ** 2).sum() / s_tok.numel()
        else:
            token_loss = _kl_log_target(torch.log_softmax(s_tok, dim=-1),
                                        torch.log_softmax(t_tok, dim=-1))

    n_loc = len(out_pred_score) if num_pruning_loc is None else num_pruning_loc
    total = (clf_weight * cls_loss + ratio_weight * ratio_loss / n_loc
             + distill_weight * cls_kl + distill_weight * token_loss)
    return dict(loss=total, cls_loss=cls_loss, ratio_loss=ratio_loss, cls_kl_loss=cls_kl,
                token_loss=token_loss)
