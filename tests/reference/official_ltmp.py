"""An independent, slow re-statement of the official LTMP training-time pieces (test ground truth).

Re-states, from github Mxbonn/ltmp at commit 1a9c055 ("Learned Thresholds Token Merging and
Pruning"), the training-mode semantics of

* ``ThresholdMasker`` (``ltmp/timm/threshold_masking.py``): the straight-through threshold mask;
* ``softmax_with_mask`` (same file) and ``LTMPAttention`` (``ltmp/timm/lt_mergeprune.py``): the
  masked, size-proportional attention with its importance and similarity scores;
* the merge-then-prune step of ``LTMPBlock`` (``ltmp/timm/lt_mergeprune.py``) and the whole block;
* the FLOPs-ratio regulariser and loss of ``train_one_epoch`` (``tools/train.py`` L1139-1152).

It is written as plain functions on tensors and a plain state dict with the official key names,
uses dense one-hot assignment matrices instead of ``scatter_reduce`` and a hand-written autograd
function for the straight-through mask, and shares no code with ``amvim_mm`` (nor with the
official repository).

Semantics re-stated (B = batch, N = tokens including cls at index 0, C = dim, h = heads):

* Threshold mask: ``s = sigmoid((v - theta) / tau)``; forward value ``hard = (s > 0.5)`` (strict,
  on the sigmoid output -- not ``v > theta``), cast to float32 and then promoted with ``s``'s
  dtype (the official ``soft + (hard.float() - soft).detach()``); backward is the gradient of
  ``s`` w.r.t. v and theta (straight-through). One scalar theta (shape (1,)) per masker.
  Defaults: ``ThresholdMasker(tau=0.5)``; ``LTMPVisionTransformer(tau=0.1)`` overrides every
  masker's tau, and ``tools/train.py`` passes ``--tau`` (default 0.5) to ``create_model``, so
  training uses tau = 0.5 unless given. Init: merge theta 0.9, prune theta 0.0. After every
  optimiser step (when ``reg_scale > 0``) all thresholds are clamped to [0, 1].
* Masked softmax (training): ``e = exp(a - max_j a) * mask_j``;
  ``(e + eps / N) / (sum_j e + eps)``, eps = 1e-5 (eval: ``e / sum_j e``). The max runs over all
  keys (masked ones too) and stays in the autograd graph.
* Attention: ``a = (q * hd**-0.5) @ k^T + log(size_j)``; masked softmax; ``out = proj(A @ v)``.
  Importance = mean of A over heads and over all query rows (masked queries too), with the cls
  entry set to +inf (gradient cut). Similarity metric = keys averaged over heads, (B, N, hd).
* Merge-then-prune (on x after the attention residual): x <- x * size; split src = even token
  indices (cls is src 0), dst = odd; metric L2-normalised then multiplied by the (detached) mask;
  cosine scores src x dst; cls row = -inf; each src picks its best dst (``max`` over dst, first
  index on ties) and merges where ``merge_mask(best score)`` is 1. Merged src tokens (mask
  detached) are scatter-summed into their dst (x * size and size), dst importance = max of its
  own and of the (mask-weighted) importances of all src assigned to it, cls importance
  contribution 0. Src tokens are kept in place (not zeroed); their new mask is ``1 - merge_mask``
  where the old src mask is non-zero, the old src mask elsewhere; dst masks are unchanged. Output
  token order is ``[src..., dst...]`` (evens first, then odds -- a permutation every block);
  x <- x / size. Then ``mask = where(mask != 0, prune_mask(importance), mask)``.
* Block: ``x + attn(LN1(x))``, merge-then-prune, ``x + mlp(LN2(x))`` on all tokens (masked
  ones too). Returns (x, size, mask, viz); viz (B, N, T) is a visualisation map merged with
  ``amax`` (optional here).
* FLOPs ratio (``tools/train.py``): ``n = masks[0].shape[-1]`` (all tokens, cls included, e.g.
  197), ``d = model.embed_dim``, ``m_0 = 1``, ``m_l = mean(masks[l-1])`` over batch AND tokens
  (one scalar per block, cls included, squared after averaging), L = number of blocks;
  ``r = (1/L) sum_{l=1..L} [2 m_{l-1} n d^2 + (m_{l-1} n)^2 d + 4 m_l n d^2]
  / (6 n d^2 + n^2 d)``.
* Loss: ``cls_scale * CE + reg_scale * (r - reduction_target)^2`` with cls_scale 1,
  reg_scale 10, reduction_target 0.75 by default (CE = timm's train loss, label smoothing 0.1).
"""
import math

import torch
import torch.nn.functional as F

# Defaults read from the official code (tools/train.py, lt_mergeprune.py, threshold_masking.py).
DEFAULTS = dict(
    tau_train=0.5,  # tools/train.py --tau, passed to create_model(tau=...)
    tau_model=0.1,  # LTMPVisionTransformer(tau=0.1) default; README uses tau=0.1
    tau_masker=0.5,  # ThresholdMasker(tau=0.5) default (overridden by the model)
    theta_merge_init=0.9,
    theta_prune_init=0.0,
    theta_clamp=(0.0, 1.0),
    reg_scale=10.0,
    cls_scale=1.0,
    reduction_target=0.75,
    # README: --lr 0.000005 0.005 -> prune theta lr 5e-6, merge theta lr 5e-3 (two lrs); one lr
    # -> both thresholds use it; three lrs -> prune, merge, rest (and the rest is trained).
    lr_prune=5e-6,
    lr_merge=5e-3,
    opt='momentum',  # timm SGD, --momentum default 0.0, --weight-decay default 0
    momentum=0.0,
    weight_decay=0.0,
    epochs=1,
    batch_size=128,
    softmax_eps=1e-5,
)


class _StraightThroughThreshold(torch.autograd.Function):
    """Hard ``sigmoid((v - theta) / tau) > 0.5`` forward, sigmoid gradient backward."""

    @staticmethod
    def forward(ctx, v, theta, tau):
        s = torch.sigmoid((v - theta) / tau)
        hard = (s > 0.5).to(torch.float32)
        out_dtype = torch.promote_types(s.dtype, torch.float32)
        ctx.save_for_backward(s)
        ctx.tau = tau
        ctx.theta_meta = (theta.shape, theta.dtype)
        ctx.v_meta = (v.shape, v.dtype)
        return hard.to(out_dtype)

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        g = grad.to(s.dtype) * (s * (1 - s)) / ctx.tau
        grad_v = grad_theta = None
        if ctx.needs_input_grad[0]:
            grad_v = g.sum_to_size(ctx.v_meta[0]).to(ctx.v_meta[1])
        if ctx.needs_input_grad[1]:
            grad_theta = (-g).sum_to_size(ctx.theta_meta[0]).to(ctx.theta_meta[1])
        return grad_v, grad_theta, None


def threshold_mask(v, theta, tau):
    """Straight-through threshold mask of ``ThresholdMasker``.

    Args:
        v: values, any shape (e.g. (B, N) importances or (B, N/2) best similarities).
        theta: threshold tensor of shape (1,) (or broadcastable to v).
        tau: float temperature.

    Returns:
        Tensor of v's shape with values exactly 0. or 1. (``sigmoid((v - theta)/tau) > 0.5``),
        dtype promote(v/theta dtype, float32); its gradient w.r.t. v and theta is that of
        ``sigmoid((v - theta) / tau)``.
    """
    if not torch.is_tensor(theta):
        theta = torch.tensor([float(theta)], dtype=v.dtype, device=v.device)
    return _StraightThroughThreshold.apply(v, theta, float(tau))


def masked_softmax(attn, mask, training=True, eps=1e-5):
    """``softmax_with_mask``: attn (B, h, N, N) logits, mask (B, N) key mask -> (B, h, N, N)."""
    n = attn.shape[-1]
    e = torch.exp(attn - attn.max(dim=-1, keepdim=True).values)
    e = e * mask[:, None, None, :]
    if training:
        return (e + eps / n) / (e.sum(dim=-1, keepdim=True) + eps)
    return e / e.sum(dim=-1, keepdim=True)


def ltmp_attention(x, size, mask, params, num_heads, training=True, prefix='attn.'):
    """``LTMPAttention.forward`` (qk_norm off, no dropout).

    Args:
        x: (B, N, C) normalised input. size: (B, N, 1) token sizes. mask: (B, N) keep mask.
        params: dict with ``{prefix}qkv.weight`` (3C, C), ``{prefix}qkv.bias`` (3C,) or absent,
            ``{prefix}proj.weight`` (C, C), ``{prefix}proj.bias`` (C,).
        num_heads: h.

    Returns:
        out (B, N, C), metric (B, N, C/h) head-averaged keys, importance (B, N) with cls = inf.
    """
    b, n, c = x.shape
    hd = c // num_heads
    qkv = F.linear(x, params[prefix + 'qkv.weight'], params.get(prefix + 'qkv.bias'))
    qkv = qkv.view(b, n, 3, num_heads, hd)
    q = qkv[:, :, 0].transpose(1, 2)
    k = qkv[:, :, 1].transpose(1, 2)
    v = qkv[:, :, 2].transpose(1, 2)
    logits = torch.matmul(q * hd ** -0.5, k.transpose(-1, -2))
    logits = logits + torch.log(size[..., 0])[:, None, None, :]
    attn = masked_softmax(logits, mask, training)
    out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, c)
    out = F.linear(out, params[prefix + 'proj.weight'], params.get(prefix + 'proj.bias'))
    imp = attn.mean(dim=1).mean(dim=1)
    imp = torch.cat([torch.full_like(imp[:, :1], math.inf), imp[:, 1:]], dim=1)
    metric = k.mean(dim=1)
    return out, metric, imp


def ltmp_merge_prune(x, size, mask, metric, importance, theta_merge, theta_prune, tau,
                     viz=None):
    """Merge-then-prune step of ``LTMPBlock.forward`` (between the attention and MLP residuals).

    Args:
        x: (B, N, C) tokens after the attention residual. size: (B, N, 1). mask: (B, N).
        metric: (B, N, D) head-averaged keys. importance: (B, N) scores (cls entry = inf).
        theta_merge, theta_prune: (1,) thresholds. tau: temperature.
        viz: optional (B, N, T) visualisation map.

    Returns:
        x (B, N, C), size (B, N, 1), mask (B, N), viz (B, N, T) or None -- all in the new token
        order ``[even indices..., odd indices...]``; x is the size-weighted mean for dst tokens.
    """
    xs = x * size
    src_x, dst_x = xs[:, 0::2], xs[:, 1::2]
    src_s, dst_s = size[:, 0::2], size[:, 1::2]
    src_m, dst_m = mask[:, 0::2], mask[:, 1::2]
    src_i, dst_i = importance[:, 0::2], importance[:, 1::2]

    unit = metric / torch.linalg.vector_norm(metric, dim=-1, keepdim=True)
    unit = unit * mask.detach()[..., None]
    sim = torch.matmul(unit[:, 0::2], unit[:, 1::2].transpose(-1, -2))  # (B, Ns, Nd)
    sim = torch.cat([torch.full_like(sim[:, :1], -math.inf), sim[:, 1:]], dim=1)
    best, best_idx = sim.max(dim=-1)

    merge = threshold_mask(best, theta_merge, tau)  # (B, Ns)
    src_keep = torch.where(src_m != 0, 1 - merge, src_m)
    w = merge.detach()
    assign = F.one_hot(best_idx, num_classes=dst_x.shape[1]).to(x.dtype)  # (B, Ns, Nd)
    routed = assign * w[..., None]
    new_dst_x = dst_x + torch.einsum('bij,bic->bjc', routed, src_x)
    new_dst_s = dst_s + torch.einsum('bij,bic->bjc', routed, src_s)

    src_contrib = src_i * w
    src_contrib = torch.cat([torch.zeros_like(src_contrib[:, :1]), src_contrib[:, 1:]], dim=1)
    cand = torch.where(assign.bool(), src_contrib[..., None], torch.full_like(assign, -math.inf))
    new_dst_i = torch.cat([dst_i[:, None, :], cand], dim=1).amax(dim=1)

    new_size = torch.cat([src_s, new_dst_s], dim=1)
    new_x = torch.cat([src_x, new_dst_x], dim=1) / new_size
    new_mask = torch.cat([src_keep, dst_m], dim=1)
    new_imp = torch.cat([src_i, new_dst_i], dim=1)

    prune = threshold_mask(new_imp, theta_prune, tau)
    new_mask = torch.where(new_mask != 0, prune, new_mask)

    new_viz = None
    if viz is not None:
        src_v, dst_v = viz[:, 0::2], viz[:, 1::2]
        mv = src_v * w[..., None]
        cand_v = torch.where(assign.bool()[..., None], mv[:, :, None, :],
                             torch.full_like(mv[:, :, None, :], -math.inf))
        new_dst_v = torch.cat([dst_v[:, None], cand_v], dim=1).amax(dim=1)
        new_viz = torch.cat([src_v, new_dst_v], dim=1)
    return new_x, new_size, new_mask, new_viz


def ltmp_block(x, size, mask, params, num_heads, tau, viz=None, training=True, ln_eps=1e-6):
    """Training-mode ``LTMPBlock.forward`` on a state dict with the official key names.

    params: ``norm1.*``, ``attn.qkv.*``, ``attn.proj.*``, ``norm2.*``, ``mlp.fc1.*``,
    ``mlp.fc2.*``, ``merge_masker.threshold``, ``prune_masker.threshold`` (no LayerScale, no
    drop path, exact GELU; ViT/DeiT use LayerNorm eps 1e-6).

    Returns (x, size, mask, viz) like the official block (token order permuted, see module doc).
    """
    c = x.shape[-1]
    h = F.layer_norm(x, (c,), params['norm1.weight'], params['norm1.bias'], ln_eps)
    a, metric, imp = ltmp_attention(h, size, mask, params, num_heads, training)
    x = x + a
    x, size, mask, viz = ltmp_merge_prune(
        x, size, mask, metric, imp, params['merge_masker.threshold'],
        params['prune_masker.threshold'], tau, viz)
    h = F.layer_norm(x, (c,), params['norm2.weight'], params['norm2.bias'], ln_eps)
    h = F.linear(h, params['mlp.fc1.weight'], params.get('mlp.fc1.bias'))
    h = F.linear(F.gelu(h), params['mlp.fc2.weight'], params.get('mlp.fc2.bias'))
    return x + h, size, mask, viz


def flops_ratio(masks, n=None, d=None):
    """FLOPs ratio r of ``tools/train.py`` (differentiable).

    Args:
        masks: list over the L blocks of the (B, N) masks after each block (or their scalar
            means); each is averaged over batch and tokens (cls included).
        n: token count, default ``masks[0].shape[-1]`` (all tokens incl. cls, e.g. 197).
        d: embedding dim (``model.embed_dim``).

    Returns:
        scalar r = mean over blocks l of
        ``[2 m_{l-1} n d^2 + (m_{l-1} n)^2 d + 4 m_l n d^2] / (6 n d^2 + n^2 d)``, m_0 = 1.
    """
    if n is None:
        n = masks[0].shape[-1]
    means = [1.0] + [torch.as_tensor(m).mean() for m in masks]
    layers = len(masks)
    full = 6 * n * d ** 2 + n ** 2 * d
    total = 0.0
    for i in range(layers):
        tok_in = means[i] * n
        tok_out = means[i + 1] * n
        cost = 2 * tok_in * d ** 2 + tok_in ** 2 * d + 4 * tok_out * d ** 2
        total = total + cost / full / layers
    return total


def ltmp_loss(ce, r_flops, r_target=0.75, reg_scale=10.0, cls_scale=1.0):
    """``cls_scale * ce + reg_scale * (r_flops - r_target) ** 2`` (returns the total loss)."""
    return cls_scale * ce + reg_scale * (r_flops - r_target) ** 2
