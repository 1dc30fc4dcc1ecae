"""An independent, slow re-statement of the official Vim forward pass (test ground truth).

Written from the reference code's structure (``VisionMamba.forward_features`` with fused
add+norm, ``Mamba.forward`` with ``bimamba_type="v2"`` and ``if_devide_out=True``,
``mamba_inner_fn_no_out_proj``): it works on a plain state dict, uses ``flip`` for the backward
path and a sequential loop for the scan, and shares no code with ``amvim_mm``.
"""
import math

import torch
import torch.nn.functional as F
from einops import rearrange


def scan_loop(u, delta, A, B, C, D, z, delta_bias):
    delta = F.softplus(delta.float() + delta_bias[None, :, None].float())
    u, B, C, z = u.float(), B.float(), C.float(), z.float()
    b, e, L = u.shape
    h = u.new_zeros(b, e, A.shape[1])
    ys = []
    for t in range(L):
        h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t, None] * B[:, None, :, t]
                                                       * u[:, :, t, None])
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, -1) + D[None, :, None] * u
    return y * F.silu(z)


def rms_norm(x, w, eps=1e-5):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def inner_fn(xz, conv_w, conv_b, x_proj_w, dt_proj_w, A, D, dt_bias):
    L = xz.shape[-1]
    x, z = xz.chunk(2, dim=1)
    d_conv = conv_w.shape[-1]
    x = F.silu(F.conv1d(x, conv_w, conv_b, padding=d_conv - 1, groups=x.shape[1])[..., :L])
    x_dbl = F.linear(rearrange(x, 'b d l -> (b l) d'), x_proj_w)
    R = dt_proj_w.shape[1]
    N = A.shape[1]
    delta = rearrange(dt_proj_w @ x_dbl[:, :R].t(), 'd (b l) -> b d l', l=L)
    Bm = rearrange(x_dbl[:, R:R + N], '(b l) n -> b n l', l=L)
    Cm = rearrange(x_dbl[:, -N:], '(b l) n -> b n l', l=L)
    return scan_loop(x, delta, A, Bm, Cm, D, z, dt_bias)


def mixer(sd, p, h):
    L = h.shape[1]
    xz = rearrange(sd[p + 'in_proj.weight'] @ rearrange(h, 'b l d -> d (b l)'),
                   'd (b l) -> b d l', l=L)
    A = -torch.exp(sd[p + 'A_log'].float())
    A_b = -torch.exp(sd[p + 'A_b_log'].float())
    out = inner_fn(xz, sd[p + 'conv1d.weight'], sd[p + 'conv1d.bias'], sd[p + 'x_proj.weight'],
                   sd[p + 'dt_proj.weight'], A, sd[p + 'D'].float(), sd[p + 'dt_proj.bias'])
    out_b = inner_fn(xz.flip([-1]), sd[p + 'conv1d_b.weight'], sd[p + 'conv1d_b.bias'],
                     sd[p + 'x_proj_b.weight'], sd[p + 'dt_proj_b.weight'], A_b,
                     sd[p + 'D_b'].float(), sd[p + 'dt_proj_b.bias'])
    return F.linear(rearrange(out + out_b.flip([-1]), 'b d l -> b l d') / 2,
                    sd[p + 'out_proj.weight'])


def official_vim_forward(sd, x, stride=16, return_tokens=False, mixer_fn=mixer):
    """The middle class token after norm_f (B, D) and the logits (or all tokens)."""
    depth = 1 + max(int(k.split('.')[1]) for k in sd if k.startswith('layers.'))
    w = sd['patch_embed.proj.weight']
    t = F.conv2d(x, w, sd['patch_embed.proj.bias'], stride=stride).flatten(2).transpose(1, 2)
    B, M, _ = t.shape
    pos = M // 2
    t = torch.cat([t[:, :pos], sd['cls_token'].expand(B, -1, -1), t[:, pos:]], dim=1)
    t = t + sd['pos_embed']
    residual = None
    hidden = t
    for i in range(depth):
        p = f'layers.{i}.'
        residual = hidden if residual is None else residual + hidden
        hidden = rms_norm(residual, sd[p + 'norm.weight'])
        residual = residual.float()
        hidden = mixer_fn(sd, p + 'mixer.', hidden)
    out = rms_norm(residual + hidden, sd['norm_f.weight'])
    if return_tokens:
        return out
    cls = out[:, pos]
    logits = F.linear(cls, sd['head.weight'], sd['head.bias']) if 'head.weight' in sd else None
    return cls, logits


def random_official_state_dict(model, num_classes=10, seed=0):
    """Official-format weights with the shapes of ``model`` (a Vim), randomised realistically."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith('A_log') or k.endswith('A_b_log'):
            sd[k] = torch.log(torch.rand(v.shape, generator=g) * 15 + 0.5)
        elif k.endswith('.D') or k.endswith('.D_b'):
            sd[k] = torch.rand(v.shape, generator=g) + 0.5
        elif 'norm' in k:
            sd[k] = 1 + 0.1 * torch.randn(v.shape, generator=g)
        elif k.endswith('dt_proj.bias') or k.endswith('dt_proj_b.bias'):
            sd[k] = torch.rand(v.shape, generator=g) * 4 - 5
        else:
            fan_in = v[0].numel() if v.dim() > 1 else 1
            std = 1 / math.sqrt(fan_in) if v.dim() > 1 else 0.02
            sd[k] = torch.randn(v.shape, generator=g) * std
    D = model.embed_dims
    sd['head.weight'] = torch.randn(num_classes, D, generator=g) / math.sqrt(D)
    sd['head.bias'] = torch.randn(num_classes, generator=g) * 0.01
    return sd


def official_vim_seg_forward(sd, x, out_indices, use_residual_as_feature, stride=16):
    """The official Vim segmentation backbone with its pyramid (``VisionMambaSeg.
    forward_features`` with ``if_cls_token=False``, no RoPE, the ``/2`` merge, patch 16) on a
    state dict in the official layout (``backbone.*`` keys, pyramid ``backbone.fpn1/2``), in
    eval mode: four maps.

    Taps: without ``use_residual_as_feature`` the mixer output of block ``i`` (``hidden``);
    with it, the residual the next block returns (the stream after block ``i``) and for the last
    block ``hidden + residual`` (``last_layer_process='add'``).
    """
    b = {k[len('backbone.'):]: v for k, v in sd.items() if k.startswith('backbone.')}
    depth = 1 + max(int(k.split('.')[1]) for k in b if k.startswith('layers.'))
    t = F.conv2d(x, b['patch_embed.proj.weight'], b['patch_embed.proj.bias'],
                 stride=stride).flatten(2).transpose(1, 2)
    B, M, _ = t.shape
    Hp = Wp = int(math.sqrt(M))
    t = t + b['pos_embed']
    residual, hidden, feats = None, t, []
    for i in range(depth):
        p = f'layers.{i}.'
        residual = hidden if residual is None else residual + hidden
        normed = rms_norm(residual, b[p + 'norm.weight'])
        hidden = mixer(b, p + 'mixer.', normed)
        if use_residual_as_feature:
            if i - 1 in out_indices:      # the residual entering block i: stream after i - 1
                feats.append(residual)
        elif i in out_indices:
            feats.append(hidden)
    if use_residual_as_feature and out_indices[-1] == depth - 1:
        feats.append(hidden + residual)
    maps = [f.transpose(1, 2).reshape(B, -1, Hp, Wp) for f in feats]

    def bn(y, p):
        return F.batch_norm(y, b[p + 'running_mean'], b[p + 'running_var'], b[p + 'weight'],
                            b[p + 'bias'], training=False, eps=1e-5)

    def convt(y, p):
        return F.conv_transpose2d(y, b[p + 'weight'], b[p + 'bias'], stride=2)

    fpn1 = convt(F.gelu(bn(convt(maps[0], 'fpn1.0.'), 'fpn1.1.')), 'fpn1.3.')
    fpn2 = convt(maps[1], 'fpn2.0.')
    return [fpn1, fpn2, maps[2], F.max_pool2d(maps[3], 2, 2)]
