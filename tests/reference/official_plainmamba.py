"""An independent, slow re-statement of the official PlainMamba forward pass (test ground truth).

Re-states the classification backbone ``PlainMamba`` of github ChenhongyiYang/PlainMamba
(``mmcls/plain_mamba_dev/models/plain_mamba/plain_mamba.py``, ``plain_mamba_layer.py`` and
``models/modules/patch_embed.py``, arch zoo L1/L2/L3) together with the classifier's
``CustomAveragePooling`` neck and ``LinearClsHead``. It works on a plain state dict with the
official key names (backbone keys without the ``backbone.`` prefix, the head as ``head.fc.*``),
builds the four snake orders from index arithmetic, runs the selective scan as a sequential loop
and shares no code with ``amvim_mm`` (nor with the official repository).

Semantics re-stated (C = embed dims, E = 2C, R = ceil(C/16), N = 16, grid h x w, L = h*w):

* Patch embed: conv 3->64 k7 s2 p3 (no bias), BN, ReLU; ``num_convs`` x [conv 64->64 k3 p1
  (no bias), BN, ReLU]; zero-pad bottom/right to a multiple of 8 (mmcv AdaptivePadding
  'corner'); ``projection`` conv 64->C k8 s8 with bias; flatten row-major. BN: eval mode
  (running statistics), eps 1e-5.
* ``pos_embed`` (1, 196, C) is added; for a grid other than 14x14 it is resized like mmcls 0.x
  ``resize_pos_embed``: (1, 196, C) -> (1, 14, 14, C) -> (1, C, 14, 14) ->
  ``F.interpolate(size=(h, w), mode='bicubic', align_corners=False)`` (no antialias) ->
  (1, h*w, C).
* Layer: ``x + mamba(LN(x))`` (LN eps 1e-5). Layers listed in ``layers_with_dwconv`` (L1: layer 0)
  then apply ``GELU(BN(dw3x3(x)))`` on the grid (dw conv without bias, exact GELU) and keep no
  residual around it.
* PlainMamba2D: ``in_proj`` (bias) -> x, z; x -> depthwise 7x7 conv (bias, pad 3) on the grid ->
  SiLU -> xc (raster order); ``x_proj`` (no bias) -> dt_low, B, C; ``dt = dt_proj(dt_low)`` (with
  its bias). For each of the four snake orders o_k with direction codes d_k:
  ``y_k = scan(u = xc[o_k], delta = dt, B = B + direction_Bs[d_k], C = C, D = D,
  delta_bias = dt_proj.bias, softplus)`` mapped back to raster order. Quirk Q1: only u is taken in
  scan order -- delta, B and C stay in raster order (step t uses raster token t's delta/B/C and
  the direction code of step t). Quirk Q2: the dt bias enters twice (inside ``dt_proj`` and as
  ``delta_bias``). Output ``out_proj(sum_k y_k * SiLU(z))`` (bias); every y_k carries its own
  ``D * u`` term.
* Final LayerNorm ``ln1`` (eps 1e-6) after the last layer. Dense output for out index i: layer
  i's output as an NCHW map, through ``norm_layer{i}`` (LN eps 1e-6) when i is not the last layer;
  the last layer's map is the ``ln1`` output with no further norm.
* Classifier: mean over the L tokens of the ``ln1`` output, then ``head.fc`` Linear.
"""
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

# Architecture zoo of the official ``PlainMamba.arch_zoo`` (all: patch 16, d_state 16, expand 2,
# depthwise conv 7x7 with bias, in_proj/out_proj with bias, LN layers, pos_embed for 14x14).
ARCHS = {
    'L1': dict(embed_dims=192, num_layers=24, num_convs_patch_embed=1, layers_with_dwconv=(0,),
               d_state=16, expand=2, conv_size=7, patch_size=16),
    'L2': dict(embed_dims=384, num_layers=24, num_convs_patch_embed=2, layers_with_dwconv=(),
               d_state=16, expand=2, conv_size=7, patch_size=16),
    'L3': dict(embed_dims=448, num_layers=36, num_convs_patch_embed=2, layers_with_dwconv=(),
               d_state=16, expand=2, conv_size=7, patch_size=16),
}

# Dense out_indices of the official ADE20K UperNet configs.
OUT_INDICES = {'L1': (5, 11, 17, 23), 'L2': (5, 11, 17, 23), 'L3': (8, 17, 26, 35)}

# Backbone parameter counts (millions), verified on the official module.
PARAMS_M = {'L1': 7.359, 'L2': 25.761, 'L3': 50.507}

# fvcore GFLOPs at 224x224 with a 1000-class Linear head and the scan counted as
# 9*B*L*E*N + B*E*L per direction and layer (see :func:`official_flops`).
FLOPS_G = {'L1': 3.021, 'L2': 8.089, 'L3': 14.454}

LN_EPS = 1e-5          # nn.LayerNorm inside every layer
OUT_LN_EPS = 1e-6      # ln1 and norm_layer{i} (norm_cfg=dict(type='LN', eps=1e-6))
BN_EPS = 1e-5
STEM_CH = 64
POS_HW = (14, 14)      # pos_embed grid (img_size 224 / patch 16)

# direction codes: 0 start, 1 right (j+1), 2 left (j-1), 3 up (i-1), 4 down (i+1)
_MOVE_CODE = {(0, 1): 1, (0, -1): 2, (-1, 0): 3, (1, 0): 4}


# ----------------------------------------------------------------------------------------------
# snake orders
def _codes_of(order, W):
    """Direction code of the move that arrives at each step (0 at step 0)."""
    i, j = order // W, order % W
    di, dj = (i[1:] - i[:-1]).tolist(), (j[1:] - j[:-1]).tolist()
    return torch.tensor([0] + [_MOVE_CODE[(a, b)] for a, b in zip(di, dj)], dtype=torch.long)


def snake_orders(H, W):
    """The four continuous 2D scan orders of an H x W grid and their direction codes.

    Returns ``(orders, codes)``, both LongTensors of shape (4, H*W): ``orders[k][t]`` is the raster
    index (i*W + j) visited at step t of direction k, ``codes[k][t]`` the code of the move that
    arrives there (0 start, 1 right, 2 left, 3 up, 4 down). Direction 0 snakes along rows starting
    at (0, 0) (row 0 left to right, row 1 right to left, ...), direction 1 is direction 0
    reversed, direction 2 snakes along columns starting at (0, 0) (column 0 downwards, column 1
    upwards, ...), direction 3 is direction 2 reversed.
    """
    grid = torch.arange(H * W, dtype=torch.long).view(H, W)
    rows = grid.clone()
    rows[1::2] = rows[1::2].flip(-1)
    cols = grid.t().clone()            # (W, H): column j top to bottom
    cols[1::2] = cols[1::2].flip(-1)
    o_row, o_col = rows.reshape(-1), cols.reshape(-1)
    orders = torch.stack([o_row, o_row.flip(0), o_col, o_col.flip(0)])
    codes = torch.stack([_codes_of(o, W) for o in orders])
    return orders, codes


def inverse_orders(orders):
    """inv[k][p] = step at which direction k visits raster index p."""
    inv = torch.empty_like(orders)
    steps = torch.arange(orders.shape[-1], dtype=orders.dtype).expand_as(orders)
    return inv.scatter_(-1, orders, steps)


# ----------------------------------------------------------------------------------------------
# scan
def selective_scan_loop(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=True):
    """Sequential selective scan, B/C shared by all channels.

    u, delta: (b, E, L); A: (E, N); B, C: (b, N, L) or (N, L) (the same for every batch element);
    D, delta_bias: (E,). h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t, y_t = <C_t, h_t> + D u_t with
    dt = softplus(delta + delta_bias) (no softplus if ``delta_softplus`` is False). Runs in float64
    if u is float64, else float32; returns (b, E, L) in that dtype.
    """
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    u, delta, A, B, C = (t.to(dt) for t in (u, delta, A, B, C))
    nb, E, L = u.shape
    if B.dim() == 2:
        B = B.expand(nb, -1, -1)
    if C.dim() == 2:
        C = C.expand(nb, -1, -1)
    assert A.shape[0] == E and B.shape == C.shape == (nb, A.shape[1], L)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dt)[None, :, None]
    if delta_softplus:
        delta = F.softplus(delta)
    h = u.new_zeros(nb, E, A.shape[1])
    ys = []
    for t in range(L):
        d_t = delta[:, :, t, None]                              # (b, E, 1)
        h = torch.exp(d_t * A) * h + d_t * u[:, :, t, None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + D.to(dt)[None, :, None] * u
    return y


# ----------------------------------------------------------------------------------------------
# pieces (tokens are (B, L, C) in raster order)
def batch_norm_eval(sd, p, x, eps=BN_EPS):
    """BatchNorm2d in eval mode on NCHW x from ``p + {weight,bias,running_mean,running_var}``."""
    scale = sd[p + 'weight'] / torch.sqrt(sd[p + 'running_var'] + eps)
    shift = sd[p + 'bias'] - sd[p + 'running_mean'] * scale
    return x * scale[None, :, None, None] + shift[None, :, None, None]


def _ln(x, sd, p, eps):
    C = x.shape[-1]
    return F.layer_norm(x, (C,), sd.get(p + 'weight'), sd.get(p + 'bias'), eps)


def patch_embed(sd, x):
    """(B, 3, H, W) -> tokens (B, h*w, C) and (h, w)."""
    x = F.conv2d(x, sd['patch_embed.stem.0.weight'], stride=2, padding=3)
    x = F.relu(batch_norm_eval(sd, 'patch_embed.stem.1.', x))
    k = 0
    while f'patch_embed.convs.{k}.weight' in sd:
        x = F.conv2d(x, sd[f'patch_embed.convs.{k}.weight'], padding=1)
        x = F.relu(batch_norm_eval(sd, f'patch_embed.convs.{k + 1}.', x))
        k += 3
    w = sd['patch_embed.projection.weight']
    ks = w.shape[-1]
    H, W = x.shape[-2:]
    x = F.pad(x, (0, -W % ks, 0, -H % ks))
    x = F.conv2d(x, w, sd.get('patch_embed.projection.bias'), stride=ks)
    h, wd = x.shape[-2:]
    return x.flatten(2).transpose(1, 2), (h, wd)


def resize_pos_embed(pos, src_hw, dst_hw):
    """mmcls 0.x ``resize_pos_embed`` without extra tokens: bicubic, align_corners=False, no
    antialias; identity when the grids agree."""
    if tuple(src_hw) == tuple(dst_hw):
        return pos
    C = pos.shape[-1]
    grid = pos.reshape(1, src_hw[0], src_hw[1], C).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(dst_hw), mode='bicubic', align_corners=False)
    return grid.flatten(2).transpose(1, 2)


def plain_mamba_2d(sd, p, x, hw, orders=None, present=None):
    """PlainMamba2D on tokens x (B, L, C); p = 'layers.i.mamba.'.

    ``present`` (B, L) bool (not in the official code): the "zero-input full-length pass" of
    token pruning -- the conv input and the conv output (after SiLU) are zero at the absent
    cells, everything else is the official computation over the full length.
    """
    Bn, L, _ = x.shape
    H, W = hw
    xz = F.linear(x, sd[p + 'in_proj.weight'], sd.get(p + 'in_proj.bias'))
    E = xz.shape[-1] // 2
    xi, z = xz[..., :E], xz[..., E:]
    if present is not None:
        xi = xi * present[..., None].to(xi.dtype)
    cw = sd[p + 'conv2d.weight']
    grid = xi.transpose(1, 2).reshape(Bn, E, H, W)
    grid = F.silu(F.conv2d(grid, cw, sd.get(p + 'conv2d.bias'), padding=cw.shape[-1] // 2,
                           groups=E))
    xc = grid.reshape(Bn, E, L)                                   # (B, E, L) raster order
    if present is not None:
        xc = xc * present[:, None, :].to(xc.dtype)
    A = -torch.exp(sd[p + 'A_log'])
    N = A.shape[1]
    dt_w = sd[p + 'dt_proj.weight']
    R = dt_w.shape[1]
    proj = torch.einsum('oe,bel->bol', sd[p + 'x_proj.weight'], xc)   # (B, R+2N, L)
    dt_low, Bm, Cm = proj[:, :R], proj[:, R:R + N], proj[:, R + N:R + 2 * N]
    dt_b = sd[p + 'dt_proj.bias']
    delta = torch.einsum('er,brl->bel', dt_w, dt_low) + dt_b[None, :, None]  # dt_proj (1st bias)
    if orders is None:
        orders = snake_orders(H, W)
    order, codes = orders
    inv = inverse_orders(order)
    dir_B = sd[p + 'direction_Bs']                                 # (5, N)
    y = 0
    for k in range(order.shape[0]):
        u_k = xc[:, :, order[k]]                                  # only u in scan order (Q1)
        B_k = Bm + dir_B[codes[k]].t()[None]                       # raster-order B + step code
        y_k = selective_scan_loop(u_k, delta, A, B_k, Cm, sd[p + 'D'],
                                  delta_bias=dt_b, delta_softplus=True)  # 2nd bias (Q2)
        y = y + y_k[:, :, inv[k]]
    y = y.to(x.dtype).transpose(1, 2) * F.silu(z)
    return F.linear(y, sd[p + 'out_proj.weight'], sd.get(p + 'out_proj.bias'))


def plain_mamba_layer(sd, p, x, hw, orders=None):
    """One PlainMambaLayer; p = 'layers.i.'."""
    x = x + plain_mamba_2d(sd, p + 'mamba.', _ln(x, sd, p + 'norm.', LN_EPS), hw, orders)
    if p + 'dw.0.weight' in sd:
        Bn, L, C = x.shape
        g = x.transpose(1, 2).reshape(Bn, C, *hw)
        g = F.conv2d(g, sd[p + 'dw.0.weight'], padding=1, groups=C)
        g = F.gelu(batch_norm_eval(sd, p + 'dw.1.', g))
        x = g.reshape(Bn, C, L).transpose(1, 2)
    return x


def infer_num_layers(sd):
    return 1 + max(int(k.split('.')[1]) for k in sd if k.startswith('layers.'))


def _arch_cfg(arch):
    return dict(ARCHS[arch]) if isinstance(arch, str) else dict(arch)


# ----------------------------------------------------------------------------------------------
# the forward
def official_plainmamba_forward(sd, x, arch=None, out_indices=None, return_tokens=False,
                                final_norm=None):
    """Official ``PlainMamba`` (+ classifier) forward on a plain official-format state dict.

    x: (B, 3, H, W). ``arch`` ('L1'/'L2'/'L3' or a dict like :data:`ARCHS`) is only used to
    check the state dict; everything else is read from the keys (number of layers, stem convs,
    dw-conv layers). ``out_indices``: layer indices of the dense outputs (negative = from the
    end; default: the last layer, like the official ``out_indices=-1``). ``final_norm``: apply
    ``ln1`` (default: iff ``ln1.weight`` is in ``sd``).

    Returns a dict:
      ``tokens``  (B, h*w, C) the final features (after ``ln1``) = ``PlainMamba.forward()[0]``;
      ``dense``   list of NCHW maps (B, C, h, w) for ``out_indices`` = ``forward()[1]``; non-final
                  indices go through ``norm_layer{i}`` (LN eps 1e-6; weight 1 / bias 0 when the
                  keys are absent), the final index is the ``ln1`` output;
      ``hw``      (h, w); ``pooled`` (B, C) mean of ``tokens``;
      ``logits``  ``head.fc`` applied to ``pooled`` (None without ``head.fc.weight``);
      ``layer_tokens`` (only with ``return_tokens``) the list of every layer's output (B, L, C),
                  the last one before ``ln1``.
    Runs in x's dtype (state-dict tensors are cast to it); the scan runs in float32, or float64
    for float64 inputs.
    """
    sd = {k: (v.to(x.dtype) if v.is_floating_point() else v) for k, v in sd.items()}
    depth = infer_num_layers(sd)
    if arch is not None:
        cfg = _arch_cfg(arch)
        assert depth == cfg['num_layers'], (depth, cfg['num_layers'])
        assert sd['pos_embed'].shape[-1] == cfg['embed_dims']
        assert all((f'layers.{i}.dw.0.weight' in sd) == (i in cfg['layers_with_dwconv'])
                   for i in range(depth))
    if final_norm is None:
        final_norm = 'ln1.weight' in sd
    if out_indices is None:
        out_indices = (depth - 1,)
    out_indices = [i + depth if i < 0 else i for i in out_indices]

    t, hw = patch_embed(sd, x)
    if 'pos_embed' in sd:
        pos = sd['pos_embed']
        s = math.isqrt(pos.shape[1])
        assert s * s == pos.shape[1]
        t = t + resize_pos_embed(pos, (s, s), hw)
    orders = snake_orders(*hw)
    C = t.shape[-1]
    dense, layer_tokens = [], []
    for i in range(depth):
        t = plain_mamba_layer(sd, f'layers.{i}.', t, hw, orders)
        if return_tokens:
            layer_tokens.append(t)
        if i == depth - 1 and final_norm:
            t = F.layer_norm(t, (C,), sd['ln1.weight'], sd['ln1.bias'], OUT_LN_EPS)
        if i in out_indices:
            m = t
            if i != depth - 1:
                m = _ln(m, sd, f'norm_layer{i}.', OUT_LN_EPS)
            dense.append(m.transpose(1, 2).reshape(t.shape[0], C, *hw).contiguous())
    pooled = t.mean(1)
    logits = None
    if 'head.fc.weight' in sd:
        logits = F.linear(pooled, sd['head.fc.weight'], sd.get('head.fc.bias'))
    out = dict(tokens=t, dense=dense, hw=hw, pooled=pooled, logits=logits)
    if return_tokens:
        out['layer_tokens'] = layer_tokens
    return out


# ----------------------------------------------------------------------------------------------
# state dicts
def _bn_keys(s, p, c):
    s[p + 'weight'] = s[p + 'bias'] = (c,)
    s[p + 'running_mean'] = s[p + 'running_var'] = (c,)
    s[p + 'num_batches_tracked'] = ()


def official_key_shapes(arch, with_head=False, out_indices=(), num_classes=1000):
    """OrderedDict key -> shape in the order of the official ``PlainMamba(arch,
    out_indices=...).state_dict()`` (BN buffers included; ``num_batches_tracked`` has shape ());
    ``norm_layer{i}`` for every non-final i in ``out_indices``; ``with_head`` appends
    ``head.fc.{weight,bias}``."""
    c = _arch_cfg(arch)
    C, depth, N = c['embed_dims'], c['num_layers'], c['d_state']
    E, R, k = c['expand'] * C, math.ceil(C / 16), c['conv_size']
    ps = c.get('patch_size', 16) // 2
    s = OrderedDict()
    s['pos_embed'] = (1, POS_HW[0] * POS_HW[1], C)
    s['patch_embed.stem.0.weight'] = (STEM_CH, 3, 7, 7)
    _bn_keys(s, 'patch_embed.stem.1.', STEM_CH)
    for j in range(c['num_convs_patch_embed']):
        s[f'patch_embed.convs.{3 * j}.weight'] = (STEM_CH, STEM_CH, 3, 3)
        _bn_keys(s, f'patch_embed.convs.{3 * j + 1}.', STEM_CH)
    s['patch_embed.projection.weight'] = (C, STEM_CH, ps, ps)
    s['patch_embed.projection.bias'] = (C,)
    for i in range(depth):
        p = f'layers.{i}.'
        s[p + 'norm.weight'] = s[p + 'norm.bias'] = (C,)
        if i in c['layers_with_dwconv']:
            s[p + 'dw.0.weight'] = (C, 1, 3, 3)
            _bn_keys(s, p + 'dw.1.', C)
        p += 'mamba.'
        s[p + 'A_log'] = (E, N)
        s[p + 'D'] = (E,)
        s[p + 'direction_Bs'] = (5, N)
        s[p + 'in_proj.weight'], s[p + 'in_proj.bias'] = (2 * E, C), (2 * E,)
        s[p + 'conv2d.weight'], s[p + 'conv2d.bias'] = (E, 1, k, k), (E,)
        s[p + 'x_proj.weight'] = (R + 2 * N, E)
        s[p + 'dt_proj.weight'], s[p + 'dt_proj.bias'] = (E, R), (E,)
        s[p + 'out_proj.weight'], s[p + 'out_proj.bias'] = (C, E), (C,)
    s['ln1.weight'] = s['ln1.bias'] = (C,)
    for i in out_indices:
        i = i + depth if i < 0 else i
        if i != depth - 1:
            s[f'norm_layer{i}.weight'] = s[f'norm_layer{i}.bias'] = (C,)
    if with_head:
        s['head.fc.weight'], s['head.fc.bias'] = (num_classes, C), (num_classes,)
    return s


def official_param_count(arch, with_head=False, num_classes=1000, out_indices=()):
    """Number of parameters (BN buffers excluded) of the official backbone (+ head)."""
    return sum(math.prod(v) for k, v in
               official_key_shapes(arch, with_head, out_indices, num_classes).items()
               if not k.endswith(('running_mean', 'running_var', 'num_batches_tracked')))


def randomize_official_state_dict(shapes, seed=0, dt_range=(1e-3, 1e-1)):
    """Random float32 tensors for an OrderedDict of shapes (or a state dict), on scales that keep
    the activations O(1): convs / linears ~ unit-variance outputs, LN and BN weights ~1, BN running
    stats (mean ~0.1 N(0,1), var U[0.5, 1.5]), ``A_log`` = log(1..N) jittered, ``D`` ~ 1,
    ``dt_proj.bias`` = inverse softplus of dt log-uniform in ``dt_range`` (with the official range
    and the doubled bias (Q2) the effective dt is ~dt^2: use e.g. (0.05, 1.0) for tests that must
    be sensitive to the scan), ``direction_Bs`` 0.2 N(0,1), ``pos_embed`` 0.1 N(0,1)."""
    g = torch.Generator().manual_seed(seed)

    def rn(shape):
        return torch.randn(shape, generator=g)

    def ru(shape):
        return torch.rand(shape, generator=g)

    out = OrderedDict()
    for k, v in shapes.items():
        shape = tuple(v.shape) if torch.is_tensor(v) else tuple(v)
        if k.endswith('num_batches_tracked'):
            out[k] = torch.tensor(0, dtype=torch.long)
        elif k.endswith('running_mean'):
            out[k] = 0.1 * rn(shape)
        elif k.endswith('running_var'):
            out[k] = 0.5 + ru(shape)
        elif k.endswith('A_log'):
            n = shape[1]
            out[k] = torch.log(torch.arange(1, n + 1, dtype=torch.float32)).expand(shape) \
                + 0.5 * (ru(shape) - 0.5)
        elif k.endswith('mamba.D'):
            out[k] = 1 + 0.2 * rn(shape)
        elif k.endswith('direction_Bs'):
            out[k] = 0.2 * rn(shape)
        elif k == 'pos_embed':
            out[k] = 0.1 * rn(shape)
        elif k.endswith('dt_proj.bias'):
            lo, hi = math.log(dt_range[0]), math.log(dt_range[1])
            dt = torch.exp(ru(shape) * (hi - lo) + lo).clamp(min=1e-4)
            out[k] = dt + torch.log(-torch.expm1(-dt))
        elif k.endswith('dt_proj.weight'):
            b = shape[1] ** -0.5
            out[k] = (2 * ru(shape) - 1) * b
        elif len(shape) == 1 and k.endswith('.weight'):   # LN / BN weights
            out[k] = 1 + 0.1 * rn(shape)
        elif len(shape) == 1:                               # biases
            out[k] = 0.02 * rn(shape)
        else:                                               # convs / linears
            out[k] = rn(shape) / math.sqrt(math.prod(shape[1:]))
    return out


def random_official_state_dict(arch, seed=0, with_head=False, num_classes=10, out_indices=(),
                               dt_range=(1e-3, 1e-1)):
    """A random official-format state dict for ``arch`` (key order of the official module)."""
    return randomize_official_state_dict(
        official_key_shapes(arch, with_head, out_indices, num_classes), seed=seed,
        dt_range=dt_range)


# ----------------------------------------------------------------------------------------------
# FLOPs
def official_flops(arch, H=224, W=224, num_classes=1000, scan=True, batch=1):
    """FLOPs of the official model in the fvcore convention (one multiply-add = 1 FLOP).

    fvcore counts convs (out elements x in-ch/group x k*k, no bias), Linear (in elements x
    out features, no bias), LayerNorm (5 x elements with affine), eval BatchNorm (2 x elements),
    and nothing else (activations, adds, index ops, mean pooling and the bicubic pos-embed resize
    are free). ``scan`` adds the official ``get_ssm_flops`` term 9*L*E*N + E*L per direction
    (4) and layer. ``num_classes`` = 0 drops the head. Returns a dict of FLOPs per category and
    ``total``; at 224x224 with a 1000-class head the totals are 3.021 / 8.089 / 14.454 GFLOPs for
    L1 / L2 / L3 (:data:`FLOPS_G`)."""
    c = _arch_cfg(arch)
    C, depth, N = c['embed_dims'], c['num_layers'], c['d_state']
    E, R, k = c['expand'] * C, math.ceil(C / 16), c['conv_size']
    ps = c.get('patch_size', 16) // 2
    h1, w1 = (H + 1) // 2, (W + 1) // 2                  # stem k7 s2 p3
    h, w = -(-h1 // ps), -(-w1 // ps)                    # corner padding + k8 s8
    L = h * w
    f = dict(conv=0, linear=0, batch_norm=0, layer_norm=0, scan=0)
    f['conv'] += h1 * w1 * STEM_CH * 3 * 49
    f['batch_norm'] += 2 * h1 * w1 * STEM_CH
    for _ in range(c['num_convs_patch_embed']):
        f['conv'] += h1 * w1 * STEM_CH * STEM_CH * 9
        f['batch_norm'] += 2 * h1 * w1 * STEM_CH
    f['conv'] += L * C * STEM_CH * ps * ps
    for i in range(depth):
        f['layer_norm'] += 5 * L * C
        f['linear'] += L * (C * 2 * E + E * (R + 2 * N) + R * E + E * C)
        f['conv'] += L * E * k * k
        if i in c['layers_with_dwconv']:
            f['conv'] += L * C * 9
            f['batch_norm'] += 2 * L * C
        if scan:
            f['scan'] += 4 * (9 * L * E * N + L * E)
    f['layer_norm'] += 5 * L * C                          # ln1
    f['linear'] += C * num_classes
    f = {key: v * batch for key, v in f.items()}
    f['total'] = sum(f.values())
    return f
