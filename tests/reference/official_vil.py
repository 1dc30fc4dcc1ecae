"""An independent, slow re-statement of the official Vision-LSTM (ViL) forward (test ground truth).

Re-states ``VisionLSTM2`` (``vision_lstm/vision_lstm2.py``, the released v2 configuration:
``legacy_norm=True, pooling='bilateral_flatten', conv_kind='2d', conv_kernel_size=3,
norm_bias=True, proj_bias=True``, patch 16) and ``VisionLSTM`` (``vision_lstm/vision_lstm.py``,
v1 with its defaults and ``legacy_norm=True``) of github NX-AI/vision-lstm. It works on a plain
state dict with the official key names, writes the mLSTM cell as explicit per-head matrices and
shares no code with ``amvim_mm`` (nor with the official repository).

Checked against the official modules (NX-AI/vision-lstm commit 381ba95, CPU, weights from
``official_state_dict`` loaded with ``strict=True``, same key order): v2 dim 192 depth 12, v1 dim
192 depth 4 and 24 at input (3, 64, 96), and at (3, 96, 64) / (3, 80, 128) with the 4 x 6
position embedding resized by the official ``load_state_dict``: every ``blocks[i]`` output, the
normed tokens, the classifier input and the logits agree to relative L2 <= 1e-13 in fp64 (fp32:
<= 2.1e-5 for v2 depth 12, 1.2e-6 for v1 depth 4); ``mlstm_recurrent`` in place of the parallel
cell to 3e-15.

Semantics re-stated (D = dim, E = 2D the inner dim, 4 cell heads of E/4 channels each):

* Patch embed: conv 3 -> D, kernel = stride = 16, bias; tokens in row-major order of the
  h x w patch grid. The position embedding ``pos_embed.embed`` (1, h0, w0, D) is added; for a
  grid other than h0 x w0 it is resized by ``F.interpolate(mode='bicubic')`` (no
  ``align_corners``), as the official ``load_state_dict`` and ``VitPosEmbed2d`` do.
* Norms: the official ``LayerNorm`` uses the weight ``1 + w`` ("residual weight"), eps 1e-5
  unless said otherwise; ``MultiHeadLayerNorm`` (outnorm) is that norm per cell head (a group
  norm with 4 groups). ``nn.LayerNorm`` uses the weight as is.
* Block (sub-block in v2): ``x + layer(norm(x))`` (drop path off). A layer of direction
  'bottom right' flips the sequence on entry and flips its output back.
* Layer: ``proj_up`` D -> 2E, split into the mLSTM branch u and the gate z. c = silu(conv(u))
  (v2: depthwise conv2d k3 pad 1 with bias on the h x w grid of the -- possibly flipped --
  sequence; v1: depthwise causal conv1d k4 with bias, i.e. left padding 3). q = Wq c, k = Wk c,
  v = Wv u with block-diagonal ("headwise") weights of 4 x 4 blocks (E/4 blocks; weight
  (E/4, 4, 4) as (block, out, in)) plus bias in v2. Gates: i~ = igate([q, k, v]),
  f~ = fgate([q, k, v]) (linear 3E -> 4, bias) per token and cell head.
* mLSTM cell (parallel stabilised form) per cell head, keys scaled by 1/sqrt(E/4):
  log D_ij = sum_{s=j+1..i} logsigmoid(f~_s) + i~_j for j <= i (else -inf), m_i = max_j log D_ij,
  C_ij = (q_i . k_j / sqrt(E/4)) exp(log D_ij - m_i), n_i = max(|sum_j C_ij|, exp(-m_i)),
  h_i = sum_j C_ij v_j / (n_i + 1e-6). Then outnorm (per head, weight 1 + w, bias in v2).
* Output: ``proj_down((h + learnable_skip * c) * silu(z))`` (bias in v2).
* v2: ``blocks[i]`` is a pair: the sub-block ``rowwise_from_top_left`` then
  ``rowwise_from_bot_right``. After the blocks ``norm`` (official LayerNorm with bias, eps 1e-6),
  then features = ``legacy_norm`` (``nn.LayerNorm(2D)``) of concat(token 0, token N-1).
* v1: ``blocks[i]`` is one block; odd blocks run 'bottom right'. After the blocks ``legacy_norm``
  (official LayerNorm without bias) on all tokens, then features = ``norm`` (``nn.LayerNorm(D)``,
  eps 1e-6) of (token 0 + token N-1) / 2.
* logits = ``head`` (linear, bias) of the features.
"""
import math

import torch
import torch.nn.functional as F

QKV_BLOCK = 4       # the official ``qkv_block_size``: block size of q/k/v AND number of cell heads
EXPANSION = 2
PATCH = 16
V1_CONV = 4         # v1 causal conv1d kernel
V2_CONV = 3         # v2 conv2d kernel


def _block_prefixes(version, depth):
    """The official prefixes of the (sub-)blocks in execution order, each with its direction."""
    if version == 'v2':
        return [(f'blocks.{i}.{name}.', flip) for i in range(depth)
                for name, flip in (('rowwise_from_top_left', False),
                                   ('rowwise_from_bot_right', True))]
    if version == 'v1':
        return [(f'blocks.{i}.', i % 2 == 1) for i in range(depth)]
    raise ValueError(f"version must be 'v1' or 'v2', got {version!r}")


def _shapes(version, dim, depth, input_shape, num_classes):
    """Ordered (key, shape) list of the official module's state dict."""
    c, hh, ww = input_shape
    if hh % PATCH or ww % PATCH:
        raise ValueError(f'input_shape {input_shape} is not a multiple of the patch size {PATCH}')
    if dim % QKV_BLOCK:
        raise ValueError(f'dim {dim} is not a multiple of {QKV_BLOCK}')
    v2 = version == 'v2'
    e = EXPANSION * dim
    out = [('patch_embed.proj.weight', (dim, c, PATCH, PATCH)), ('patch_embed.proj.bias', (dim,)),
           ('pos_embed.embed', (1, hh // PATCH, ww // PATCH, dim))]
    for p, _ in _block_prefixes(version, depth):
        out.append((p + 'norm.weight', (dim,)))
        if v2:
            out.append((p + 'norm.bias', (dim,)))
        lp = p + 'layer.'
        out.append((lp + 'learnable_skip', (e,)))
        out.append((lp + 'proj_up.weight', (2 * e, dim)))
        if v2:
            out.append((lp + 'proj_up.bias', (2 * e,)))
        for name in ('q_proj', 'k_proj', 'v_proj'):
            out.append((lp + name + '.weight', (e // QKV_BLOCK, QKV_BLOCK, QKV_BLOCK)))
            if v2:
                out.append((lp + name + '.bias', (e,)))
        if v2:
            out += [(lp + 'conv.weight', (e, 1, V2_CONV, V2_CONV)), (lp + 'conv.bias', (e,))]
        else:
            out += [(lp + 'conv1d.conv.weight', (e, 1, V1_CONV)), (lp + 'conv1d.conv.bias', (e,))]
        cp = lp + 'mlstm_cell.'
        for gate in ('igate', 'fgate'):
            out += [(cp + gate + '.weight', (QKV_BLOCK, 3 * e)),
                    (cp + gate + '.bias', (QKV_BLOCK,))]
        out.append((cp + 'outnorm.weight', (e,)))
        if v2:
            out.append((cp + 'outnorm.bias', (e,)))
        out.append((lp + 'proj_down.weight', (dim, e)))
        if v2:
            out.append((lp + 'proj_down.bias', (dim,)))
    if v2:
        out += [('norm.weight', (dim,)), ('norm.bias', (dim,)),
                ('legacy_norm.weight', (2 * dim,)), ('legacy_norm.bias', (2 * dim,)),
                ('head.weight', (num_classes, 2 * dim)), ('head.bias', (num_classes,))]
    else:
        out += [('legacy_norm.weight', (dim,)), ('norm.weight', (dim,)), ('norm.bias', (dim,)),
                ('head.weight', (num_classes, dim)), ('head.bias', (num_classes,))]
    return out


def _random_value(key, shape, g):
    randn = torch.randn(shape, generator=g)
    if key.endswith('fgate.bias'):                  # official init linspace(3, 6): mostly kept
        return torch.linspace(-1.0, 5.0, shape[0]) + 0.5 * randn
    if key.endswith('igate.bias'):
        return 0.5 * randn
    if key.endswith('learnable_skip'):               # official init ones
        return 1 + 0.3 * randn
    if key == 'pos_embed.embed':
        return 0.3 * randn
    if 'norm.' in key or key.endswith('.bias'):      # norm weights (residual or plain) and biases
        return 0.2 * randn
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
    if key.endswith(('q_proj.weight', 'k_proj.weight', 'v_proj.weight')):
        fan_in = shape[-1]
    return randn / math.sqrt(fan_in)


def official_state_dict(version, dim, depth, input_shape, num_classes=1000, seed=0):
    """Random (seeded) weights with exactly the key names, order and shapes of the official
    module's ``state_dict()``: v2 = ``VisionLSTM2(dim, depth=depth, input_shape=input_shape,
    legacy_norm=True, pooling='bilateral_flatten', conv_kind='2d', conv_kernel_size=3,
    norm_bias=True, proj_bias=True)``, v1 = ``VisionLSTM(dim, depth=depth,
    input_shape=input_shape, legacy_norm=True)``. Gates, skips, norms and biases are perturbed
    from their official inits so that a wrong wiring shows."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in _shapes(version, dim, depth, tuple(input_shape), num_classes):
        sd[key] = _random_value(key, shape, g)
    # plain nn.LayerNorm weights (v2 legacy_norm, v1 norm) live around 1; the official
    # LayerNorm's residual weights (all other norms) around 0
    plain = 'legacy_norm.weight' if version == 'v2' else 'norm.weight'
    sd[plain] = 1 + sd[plain]
    return sd


def layer_norm(x, weight, bias=None, eps=1e-5, residual_weight=True):
    """LayerNorm over the last dim; the official ``LayerNorm`` scales by ``1 + weight``."""
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps) * ((1 + weight) if residual_weight else weight)
    return y if bias is None else y + bias


def headwise(x, weight, bias=None):
    """Block-diagonal linear map: ``weight`` (blocks, out, in) on consecutive channel blocks."""
    nb, o, i = weight.shape
    y = torch.einsum('bsni,noi->bsno', x.reshape(*x.shape[:-1], nb, i), weight)
    y = y.reshape(*x.shape[:-1], nb * o)
    return y if bias is None else y + bias


def mlstm_parallel(q, k, v, igate, fgate, eps=1e-6):
    """Parallel stabilised mLSTM for one head. q, k, v (B, S, DH); igate, fgate (B, S)."""
    S, dh = q.shape[1], q.shape[2]
    cum = torch.cumsum(F.logsigmoid(fgate), dim=1)                    # F_i = sum_{s<=i} log f_s
    log_d = cum[:, :, None] - cum[:, None, :] + igate[:, None, :]     # F_i - F_j + i_j
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    log_d = log_d.masked_fill(~causal, float('-inf'))
    m = log_d.max(dim=2, keepdim=True).values                          # (B, S, 1)
    c = (q @ k.transpose(1, 2) / math.sqrt(dh)) * torch.exp(log_d - m)
    n = torch.maximum(c.sum(dim=2, keepdim=True).abs(), torch.exp(-m))
    return (c / (n + eps)) @ v


def mlstm_recurrent(q, k, v, igate, fgate, eps=1e-6):
    """The same cell as a stabilised recurrence (matrix memory, normaliser state, running max);
    equal to ``mlstm_parallel`` up to rounding (used to cross-check it)."""
    B, S, dh = q.shape
    mem = q.new_zeros(B, dh, dh)
    nrm = q.new_zeros(B, dh)
    m = q.new_full((B,), float('-inf'))
    out = []
    k = k / math.sqrt(dh)
    for t in range(S):
        log_f = F.logsigmoid(fgate[:, t])
        m_new = torch.maximum(log_f + m, igate[:, t])
        f_s = torch.exp(log_f + m - m_new)
        i_s = torch.exp(igate[:, t] - m_new)
        mem = f_s[:, None, None] * mem + i_s[:, None, None] * v[:, t, :, None] * k[:, t, None, :]
        nrm = f_s[:, None] * nrm + i_s[:, None] * k[:, t]
        num = (mem @ q[:, t, :, None])[..., 0]
        den = torch.maximum((nrm * q[:, t]).sum(-1).abs(), torch.exp(-m_new))
        out.append(num / (den + eps)[:, None])
        m = m_new
    return torch.stack(out, dim=1)


def token_conv(u, sd, lp, version, grid):
    """v2: depthwise conv2d k3 on the h x w grid of the sequence; v1: causal depthwise conv1d."""
    B, S, E = u.shape
    if version == 'v2':
        h, w = grid
        img = u.transpose(1, 2).reshape(B, E, h, w)
        y = F.conv2d(img, sd[lp + 'conv.weight'], sd[lp + 'conv.bias'], padding=V2_CONV // 2,
                     groups=E)
        return y.reshape(B, E, S).transpose(1, 2)
    wt = sd[lp + 'conv1d.conv.weight']
    y = F.conv1d(F.pad(u.transpose(1, 2), (wt.shape[-1] - 1, 0)), wt, sd[lp + 'conv1d.conv.bias'],
                 groups=E)
    return y.transpose(1, 2)


def vil_layer(sd, lp, x, version, grid, flip, cell=mlstm_parallel):
    """The official ``ViLLayer`` with prefix ``lp`` (ending in 'layer.')."""
    get = sd.get
    if flip:
        x = x.flip(1)
    up = F.linear(x, sd[lp + 'proj_up.weight'], get(lp + 'proj_up.bias'))
    u, z = up.chunk(2, dim=-1)
    c = F.silu(token_conv(u, sd, lp, version, grid))
    q = headwise(c, sd[lp + 'q_proj.weight'], get(lp + 'q_proj.bias'))
    k = headwise(c, sd[lp + 'k_proj.weight'], get(lp + 'k_proj.bias'))
    v = headwise(u, sd[lp + 'v_proj.weight'], get(lp + 'v_proj.bias'))
    cp = lp + 'mlstm_cell.'
    qkv = torch.cat([q, k, v], dim=-1)
    ig = F.linear(qkv, sd[cp + 'igate.weight'], sd[cp + 'igate.bias'])       # (B, S, heads)
    fg = F.linear(qkv, sd[cp + 'fgate.weight'], sd[cp + 'fgate.bias'])
    E = u.shape[-1]
    dh = E // QKV_BLOCK
    ow, ob = sd[cp + 'outnorm.weight'], get(cp + 'outnorm.bias')
    heads = []
    for j in range(QKV_BLOCK):
        sl = slice(j * dh, (j + 1) * dh)
        hj = cell(q[..., sl], k[..., sl], v[..., sl], ig[..., j], fg[..., j])
        heads.append(layer_norm(hj, ow[sl], None if ob is None else ob[sl]))
    h = torch.cat(heads, dim=-1)
    out = (h + sd[lp + 'learnable_skip'] * c) * F.silu(z)
    out = F.linear(out, sd[lp + 'proj_down.weight'], get(lp + 'proj_down.bias'))
    return out.flip(1) if flip else out


def embed(sd, x):
    """Patch embedding plus the (resized where the grid differs) position embedding."""
    w = sd['patch_embed.proj.weight']
    t = F.conv2d(x, w, sd['patch_embed.proj.bias'], stride=w.shape[-2:])   # (B, D, h, w)
    pos = sd['pos_embed.embed']                                            # (1, h0, w0, D)
    if pos.shape[1:3] != t.shape[2:]:
        pos = F.interpolate(pos.permute(0, 3, 1, 2), size=t.shape[2:], mode='bicubic')
        pos = pos.permute(0, 2, 3, 1)
    t = t.permute(0, 2, 3, 1) + pos
    return t.flatten(1, 2), tuple(t.shape[1:3])


def official_forward(sd, x, version, dim, depth, cell=mlstm_parallel):
    """The official forward of ``official_state_dict``'s module on images ``x`` (B, 3, H, W).

    Returns dict(blocks=[output of the official ``blocks[i]``, (B, N, dim) in token order],
    tokens=(B, N, dim) the normed tokens before pooling (v2: after ``norm``; v1: after
    ``legacy_norm``), features=(B, D') the classifier input, logits=(B, num_classes)).
    The weights are cast to ``x``'s dtype and device.
    """
    if sd['patch_embed.proj.weight'].shape[0] != dim:
        raise ValueError(f"dim {dim} does not match the state dict's "
                         f"{sd['patch_embed.proj.weight'].shape[0]}")
    sd = {k: v.to(dtype=x.dtype, device=x.device) for k, v in sd.items()}
    t, grid = embed(sd, x)
    prefixes = _block_prefixes(version, depth)
    per_block = 2 if version == 'v2' else 1
    blocks = []
    for n, (p, flip) in enumerate(prefixes):
        normed = layer_norm(t, sd[p + 'norm.weight'], sd.get(p + 'norm.bias'))
        t = t + vil_layer(sd, p + 'layer.', normed, version, grid, flip, cell)
        if (n + 1) % per_block == 0:
            blocks.append(t)
    if version == 'v2':
        tokens = layer_norm(t, sd['norm.weight'], sd['norm.bias'], eps=1e-6)
        pooled = torch.cat([tokens[:, 0], tokens[:, -1]], dim=1)
        feats = layer_norm(pooled, sd['legacy_norm.weight'], sd['legacy_norm.bias'],
                           residual_weight=False)
    else:
        tokens = layer_norm(t, sd['legacy_norm.weight'])
        pooled = (tokens[:, 0] + tokens[:, -1]) / 2
        feats = layer_norm(pooled, sd['norm.weight'], sd['norm.bias'], eps=1e-6,
                           residual_weight=False)
    logits = F.linear(feats, sd['head.weight'], sd['head.bias'])
    return dict(blocks=blocks, tokens=tokens, features=feats, logits=logits)
