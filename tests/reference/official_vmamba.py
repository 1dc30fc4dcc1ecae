"""An independent, slow re-statement of the official VMamba forward pass (test ground truth).

Written from the structure of the official classification model (``VSSM`` with ``VSSBlock`` and
``SS2D``; forward types ``v05_noz`` -- the published VMamba-T/S/B "s1lX"/"s2lX" models -- and
``v0`` -- "Vanilla VMamba") and of the dense ``Backbone_VSSM`` (stage outputs before each
downsample, through ``outnorm{i}``). It works on a plain state dict with the official
*classification* checkpoint key names (``op.x_proj_weight``, ``op.dt_projs_weight``, ...; the
older names and the single-file ``vmamba.py`` names are mapped by
:func:`canonical_official_state_dict`), keeps everything channel-first, builds the four scan
orders with ``flip``/``transpose`` and runs the selective scan as a sequential loop. It shares no
code with ``amvim_mm``.

Semantics re-stated (d = stage width, E = d_inner, R = dt rank, N = d_state, K = 4, L = H*W):

* SS2D: ``in_proj`` (d -> E, or 2E with a SiLU'd z gate for ``v0``), depthwise 3x3 conv
  (bias only in ``v0``) + SiLU, four sequences (row-major, column-major, and both reversed),
  per-direction ``x_proj_weight`` (K, R+2N, E) -> dt/B/C, ``dt_projs_weight`` (K, E, R) without
  bias, scan with ``delta_bias = dt_projs_bias`` and softplus, ``A = -exp(A_logs)``, ``D = Ds``,
  B/C shared by the E channels of one direction; the four outputs are mapped back to row-major
  and *summed*; LayerNorm over E (``out_norm``), ``* z`` for ``v0``, ``out_proj`` (E -> d).
* Block: ``x + op(norm(x))`` then, when an MLP exists, ``x + fc2(gelu(fc1(norm2(x))))``.
* Stem v2: conv3x3/s2 (3 -> d/2) LN GELU conv3x3/s2 (d/2 -> d) LN; stem v1: conv4x4/s4 + LN.
* Downsample v3 (``.1`` conv3x3/s2 p1, ``.3`` LN), v2 (same keys, conv2x2/s2), v1 (Swin
  PatchMerging: zero-pad bottom/right to even, concat the (0,0),(1,0),(0,1),(1,1) pixels of each
  2x2 cell along channels, LN(4d) ``downsample.norm``, ``downsample.reduction`` 4d -> 2d).
* Head: LN, global average pool, Linear. All LayerNorms use eps 1e-5.
"""
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

# Architecture table of the official factories / yaml configs (classification/configs/vssm/*).
ARCHS = {
    # published VMamba-T / -S / -B (NeurIPS 2024): s1l8 / s2l15 / s2l15
    'tiny_s1l8': dict(dims=96, depths=(2, 2, 8, 2), ssm_ratio=1.0, d_state=1, mlp_ratio=4.0,
                      forward_type='v05_noz', patch_embed='v2', downsample='v3'),
    'small_s2l15': dict(dims=96, depths=(2, 2, 15, 2), ssm_ratio=2.0, d_state=1, mlp_ratio=4.0,
                        forward_type='v05_noz', patch_embed='v2', downsample='v3'),
    'base_s2l15': dict(dims=128, depths=(2, 2, 15, 2), ssm_ratio=2.0, d_state=1, mlp_ratio=4.0,
                       forward_type='v05_noz', patch_embed='v2', downsample='v3'),
    'tiny_s2l5': dict(dims=96, depths=(2, 2, 5, 2), ssm_ratio=2.0, d_state=1, mlp_ratio=4.0,
                      forward_type='v05_noz', patch_embed='v2', downsample='v3'),
    'small_s1l20': dict(dims=96, depths=(2, 2, 20, 2), ssm_ratio=1.0, d_state=1, mlp_ratio=4.0,
                        forward_type='v05_noz', patch_embed='v2', downsample='v3'),
    'base_s1l20': dict(dims=128, depths=(2, 2, 20, 2), ssm_ratio=1.0, d_state=1, mlp_ratio=4.0,
                       forward_type='v05_noz', patch_embed='v2', downsample='v3'),
    # Vanilla VMamba (vmambav0_*.yaml): d_state 16, no MLP, PatchMerging, channel-last LN
    'vanilla_tiny': dict(dims=96, depths=(2, 2, 9, 2), ssm_ratio=2.0, d_state=16, mlp_ratio=0.0,
                         forward_type='v0', patch_embed='v1', downsample='v1'),
    'vanilla_small': dict(dims=96, depths=(2, 2, 27, 2), ssm_ratio=2.0, d_state=16,
                          mlp_ratio=0.0, forward_type='v0', patch_embed='v1', downsample='v1'),
    'vanilla_base': dict(dims=128, depths=(2, 2, 27, 2), ssm_ratio=2.0, d_state=16,
                         mlp_ratio=0.0, forward_type='v0', patch_embed='v1', downsample='v1'),
}

# Parameter counts with the 1000-class head, in millions, as published / verified (spec section 6).
PARAMS_M = {'tiny_s1l8': 30.25, 'small_s2l15': 50.15, 'base_s2l15': 88.56, 'tiny_s2l5': 30.71,
            'small_s1l20': 49.01, 'base_s1l20': 86.61, 'vanilla_tiny': 22.89}

LN_EPS = 1e-5
# forward types with the same math as v05_noz (v3_noz: the kernel the 0230 checkpoints used)
_NOZ_TYPES = ('v05_noz', 'v3_noz', 'v2_noz', 'v04_noz', 'v03_noz', 'v02_noz', 'v01_noz')


# ----------------------------------------------------------------------------------------------
# scan
def selective_scan_loop(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=True):
    """Sequential selective scan with grouped B/C.

    u, delta: (b, c, L); A: (c, N); B, C: (b, G, N, L) with G dividing c (channel group g =
    channels [g*c/G, (g+1)*c/G)) or (b, N, L); D, delta_bias: (c,). Computes
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t, y_t = <C_t, h_t> + D u_t with
    dt = softplus(delta + delta_bias). Runs in float64 if u is float64, else float32; returns
    (b, c, L) in that dtype.
    """
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    u, delta, A, B, C = (t.to(dt) for t in (u, delta, A, B, C))
    if B.dim() == 3:
        B, C = B[:, None], C[:, None]
    nb, ch, L = u.shape
    G, N = B.shape[1], B.shape[2]
    assert ch % G == 0 and A.shape == (ch, N)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dt)[None, :, None]
    if delta_softplus:
        delta = F.softplus(delta)
    cg = ch // G
    u4 = u.view(nb, G, cg, L)
    d4 = delta.view(nb, G, cg, L)
    A3 = A.view(G, cg, N)
    h = u.new_zeros(nb, G, cg, N)
    out = []
    for t in range(L):
        dlt = d4[..., t, None]                       # (nb, G, cg, 1)
        h = torch.exp(dlt * A3) * h + (dlt * u4[..., t, None]) * B[:, :, None, :, t]
        out.append((h * C[:, :, None, :, t]).sum(-1))
    y = torch.stack(out, dim=-1).view(nb, ch, L)
    if D is not None:
        y = y + D.to(dt)[None, :, None] * u
    return y


# ----------------------------------------------------------------------------------------------
# small pieces (all channel-first: (B, C, H, W))
def layer_norm_cf(x, w=None, b=None, eps=LN_EPS):
    """LayerNorm over the channel dim of an NCHW map."""
    y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), w, b, eps)
    return y.permute(0, 3, 1, 2)


def linear_cf(x, w, b=None):
    """Per-pixel Linear on an NCHW map; w may be stored as (out, in) or (out, in, 1, 1)."""
    y = torch.einsum('oc,bchw->bohw', w.reshape(w.shape[0], -1), x)
    return y if b is None else y + b[None, :, None, None]


def cross_scan(x):
    """(B, E, H, W) -> (B, 4, E, H*W): row-major, column-major, and both reversed."""
    rows = x.flatten(2)
    cols = x.transpose(2, 3).flatten(2)
    return torch.stack([rows, cols, rows.flip(-1), cols.flip(-1)], dim=1)


def cross_merge(y, H, W):
    """(B, 4, E, H*W) -> (B, E, H, W): undo each order and SUM the four directions."""
    b, _, e, _ = y.shape
    rows = y[:, 0] + y[:, 2].flip(-1)
    cols = y[:, 1] + y[:, 3].flip(-1)
    return rows.view(b, e, H, W) + cols.view(b, e, W, H).transpose(2, 3)


def ss2d_scan_merge(sd, p, xi):
    """SS2D core on the post-conv map xi (B, E, H, W): cross-scan, per-direction projections,
    selective scan, cross-merge (sum). Returns (B, E, H, W) *before* ``out_norm`` (useful in
    tests: the LayerNorm that follows hides a global rescaling such as mean-vs-sum merging)."""
    Bn, E, H, W = xi.shape
    L = H * W
    xs = cross_scan(xi)                                     # (B, K, E, L)
    xw = sd[p + 'x_proj_weight']                            # (K, R+2N, E)
    dw = sd[p + 'dt_projs_weight']                          # (K, E, R)
    K, R = dw.shape[0], dw.shape[2]
    A = -torch.exp(sd[p + 'A_logs'])                        # (K*E, N)
    N = A.shape[1]
    proj = torch.einsum('kce,bkel->bkcl', xw, xs)
    if p + 'x_proj_bias' in sd:
        proj = proj + sd[p + 'x_proj_bias'].view(1, K, -1, 1)
    dts, Bs, Cs = proj[:, :, :R], proj[:, :, R:R + N], proj[:, :, R + N:R + 2 * N]
    dts = torch.einsum('ker,bkrl->bkel', dw, dts)
    ys = selective_scan_loop(xs.reshape(Bn, K * E, L), dts.reshape(Bn, K * E, L), A, Bs, Cs,
                             sd[p + 'Ds'], sd[p + 'dt_projs_bias'].reshape(-1))
    return cross_merge(ys.view(Bn, K, E, L).to(xi.dtype), H, W)


def ss2d(sd, p, x, forward_type='v05_noz'):
    """The SS2D mixer on a channel-first map x (B, d, H, W); p = 'layers.i.blocks.j.op.'."""
    gated = forward_type == 'v0'
    if not gated and forward_type not in _NOZ_TYPES:
        raise NotImplementedError(forward_type)
    conv_w = sd[p + 'conv2d.weight']
    E = conv_w.shape[0]
    xz = linear_cf(x, sd[p + 'in_proj.weight'])
    if gated:
        assert xz.shape[1] == 2 * E, 'v0 needs in_proj to 2*d_inner'
        xi, z = xz[:, :E], F.silu(xz[:, E:])
    else:
        assert xz.shape[1] == E, f'{forward_type} needs in_proj to d_inner'
        xi, z = xz, None
    k = conv_w.shape[-1]
    xi = F.silu(F.conv2d(xi, conv_w, sd.get(p + 'conv2d.bias'), padding=(k - 1) // 2, groups=E))

    y = ss2d_scan_merge(sd, p, xi)
    y = layer_norm_cf(y, sd[p + 'out_norm.weight'], sd[p + 'out_norm.bias'])
    if gated:
        y = y * z
    return linear_cf(y, sd[p + 'out_proj.weight'], sd.get(p + 'out_proj.bias'))


def vss_block(sd, p, x, forward_type='v05_noz'):
    x = x + ss2d(sd, p + 'op.', layer_norm_cf(x, sd[p + 'norm.weight'], sd[p + 'norm.bias']),
                 forward_type)
    if p + 'mlp.fc1.weight' in sd:
        h = layer_norm_cf(x, sd[p + 'norm2.weight'], sd[p + 'norm2.bias'])
        h = F.gelu(linear_cf(h, sd[p + 'mlp.fc1.weight'], sd[p + 'mlp.fc1.bias']))
        x = x + linear_cf(h, sd[p + 'mlp.fc2.weight'], sd[p + 'mlp.fc2.bias'])
    return x


def patch_embed(sd, x):
    if 'patch_embed.5.weight' in sd:        # v2: two overlapping stride-2 convs
        w0, w5 = sd['patch_embed.0.weight'], sd['patch_embed.5.weight']
        x = F.conv2d(x, w0, sd['patch_embed.0.bias'], stride=w0.shape[-1] - 1,
                     padding=(w0.shape[-1] - 1) // 2)
        x = F.gelu(layer_norm_cf(x, sd['patch_embed.2.weight'], sd['patch_embed.2.bias']))
        x = F.conv2d(x, w5, sd['patch_embed.5.bias'], stride=w5.shape[-1] - 1,
                     padding=(w5.shape[-1] - 1) // 2)
        return layer_norm_cf(x, sd['patch_embed.7.weight'], sd['patch_embed.7.bias'])
    w0 = sd['patch_embed.0.weight']         # v1: non-overlapping patchify (floor on odd sizes)
    x = F.conv2d(x, w0, sd['patch_embed.0.bias'], stride=w0.shape[-1])
    if 'patch_embed.2.weight' in sd:
        x = layer_norm_cf(x, sd['patch_embed.2.weight'], sd['patch_embed.2.bias'])
    return x


def downsample(sd, p, x):
    """p = 'layers.i.downsample.'; identity when the stage has no downsample keys."""
    if p + 'reduction.weight' in sd:        # v1 PatchMerging (pads odd sizes at the end)
        H, W = x.shape[-2:]
        x = F.pad(x, (0, W % 2, 0, H % 2))
        x = torch.cat([x[..., 0::2, 0::2], x[..., 1::2, 0::2],
                       x[..., 0::2, 1::2], x[..., 1::2, 1::2]], dim=1)
        x = layer_norm_cf(x, sd[p + 'norm.weight'], sd[p + 'norm.bias'])
        return linear_cf(x, sd[p + 'reduction.weight'])
    if p + '1.weight' in sd:                # v2 (k2) / v3 (k3 p1) conv + LN at index 3
        w = sd[p + '1.weight']
        x = F.conv2d(x, w, sd[p + '1.bias'], stride=2, padding=(w.shape[-1] - 1) // 2)
        return layer_norm_cf(x, sd[p + '3.weight'], sd[p + '3.bias'])
    return x


# ----------------------------------------------------------------------------------------------
# state dicts
def canonical_official_state_dict(sd):
    """Map old-training-code and single-file (repo-root ``vmamba.py``) names onto the official
    classification names consumed here; a plain dict is returned, the input is not modified."""
    out = OrderedDict()
    for k, v in sd.items():
        nk = k.replace('patch_embed.proj.', 'patch_embed.0.').replace('patch_embed.norm.',
                                                                      'patch_embed.2.')
        nk = nk.replace('.ln_1.', '.norm.').replace('.self_attention.', '.op.')
        if nk.startswith('norm.'):
            nk = 'classifier.' + nk
        elif nk.startswith('head.'):
            nk = 'classifier.' + nk
        out[nk] = v
    for k in list(out):
        if k.endswith('op.x_proj.weight'):      # root file: grouped Linear (K*(R+2N), E)
            p = k[:-len('x_proj.weight')]
            K = out[p + 'dt_projs_bias'].shape[0]
            v = out.pop(k)
            out[p + 'x_proj_weight'] = v.reshape(K, v.shape[0] // K, v.shape[1])
        elif k.endswith('op.x_proj.bias'):
            out[k[:-len('x_proj.bias')] + 'x_proj_bias'] = out.pop(k)
        elif k.endswith('op.dt_projs.weight'):  # root file: grouped Linear (K*E, R)
            p = k[:-len('dt_projs.weight')]
            K, E = out[p + 'dt_projs_bias'].shape
            out[p + 'dt_projs_weight'] = out.pop(k).reshape(K, E, -1)
        elif k.endswith('downsample.2.weight') and out[k].dim() == 2:  # root PatchMerge layout
            p = k[:-len('2.weight')]
            out[p + 'reduction.weight'] = out.pop(k)
            out[p + 'norm.weight'] = out.pop(p + '1.weight')
            out[p + 'norm.bias'] = out.pop(p + '1.bias')
    return out


def _arch_cfg(arch):
    cfg = dict(ARCHS[arch]) if isinstance(arch, str) else dict(arch)
    dims = cfg['dims']
    if isinstance(dims, int):
        dims = [dims * 2 ** i for i in range(len(cfg['depths']))]
    cfg['dims'] = list(dims)
    cfg.setdefault('patch_size', 4)
    cfg.setdefault('in_chans', 3)
    v0 = cfg['forward_type'] == 'v0'
    cfg.setdefault('patch_embed', 'v1' if v0 else 'v2')
    cfg.setdefault('downsample', 'v1' if v0 else 'v3')
    cfg.setdefault('conv_bias', v0)
    cfg.setdefault('d_conv', 3)
    return cfg


def official_key_shapes(arch, num_classes=1000, with_head=True, with_outnorm=False):
    """OrderedDict key -> shape of the official classification ``VSSM`` state dict (the order of
    ``model.state_dict()``); ``with_outnorm`` adds the ``Backbone_VSSM`` ``outnorm{i}`` keys.
    ``arch`` is a key of :data:`ARCHS` or a dict with the same fields."""
    c = _arch_cfg(arch)
    dims, depths, N = c['dims'], c['depths'], c['d_state']
    gated = c['forward_type'] == 'v0'
    K, ps, d0 = 4, c['patch_size'], c['dims'][0]
    s = OrderedDict()
    if c['patch_embed'] == 'v2':
        st = ps // 2
        s['patch_embed.0.weight'] = (d0 // 2, c['in_chans'], st + 1, st + 1)
        s['patch_embed.0.bias'] = (d0 // 2,)
        s['patch_embed.2.weight'] = s['patch_embed.2.bias'] = (d0 // 2,)
        s['patch_embed.5.weight'] = (d0, d0 // 2, st + 1, st + 1)
        s['patch_embed.5.bias'] = (d0,)
        s['patch_embed.7.weight'] = s['patch_embed.7.bias'] = (d0,)
    else:
        s['patch_embed.0.weight'] = (d0, c['in_chans'], ps, ps)
        s['patch_embed.0.bias'] = (d0,)
        s['patch_embed.2.weight'] = s['patch_embed.2.bias'] = (d0,)
    for i, (d, depth) in enumerate(zip(dims, depths)):
        E, R = int(c['ssm_ratio'] * d), math.ceil(d / 16)
        for j in range(depth):
            p = f'layers.{i}.blocks.{j}.'
            s[p + 'norm.weight'] = s[p + 'norm.bias'] = (d,)
            s[p + 'op.x_proj_weight'] = (K, R + 2 * N, E)
            s[p + 'op.A_logs'] = (K * E, N)
            s[p + 'op.Ds'] = (K * E,)
            s[p + 'op.dt_projs_weight'] = (K, E, R)
            s[p + 'op.dt_projs_bias'] = (K, E)
            tail = OrderedDict()
            tail['in_proj.weight'] = (2 * E if gated else E, d)
            tail['conv2d.weight'] = (E, 1, c['d_conv'], c['d_conv'])
            if c['conv_bias']:
                tail['conv2d.bias'] = (E,)
            norm = OrderedDict([('out_norm.weight', (E,)), ('out_norm.bias', (E,))])
            # v0 registers out_norm after conv2d, the v2 family before in_proj
            tail = OrderedDict(list(tail.items()) + list(norm.items())) if gated else \
                OrderedDict(list(norm.items()) + list(tail.items()))
            tail['out_proj.weight'] = (d, E)
            for k, v in tail.items():
                s[p + 'op.' + k] = v
            hid = int(d * c['mlp_ratio'])
            if hid > 0:
                s[p + 'norm2.weight'] = s[p + 'norm2.bias'] = (d,)
                s[p + 'mlp.fc1.weight'], s[p + 'mlp.fc1.bias'] = (hid, d), (hid,)
                s[p + 'mlp.fc2.weight'], s[p + 'mlp.fc2.bias'] = (d, hid), (d,)
        if i < len(dims) - 1:
            p, dn = f'layers.{i}.downsample.', dims[i + 1]
            if c['downsample'] == 'v1':
                s[p + 'reduction.weight'] = (dn, 4 * d)
                s[p + 'norm.weight'] = s[p + 'norm.bias'] = (4 * d,)
            else:
                k = 3 if c['downsample'] == 'v3' else 2
                s[p + '1.weight'], s[p + '1.bias'] = (dn, d, k, k), (dn,)
                s[p + '3.weight'] = s[p + '3.bias'] = (dn,)
    if with_head:
        s['classifier.norm.weight'] = s['classifier.norm.bias'] = (dims[-1],)
        s['classifier.head.weight'] = (num_classes, dims[-1])
        s['classifier.head.bias'] = (num_classes,)
    if with_outnorm:
        for i, d in enumerate(dims):
            s[f'outnorm{i}.weight'] = s[f'outnorm{i}.bias'] = (d,)
    return s


def official_param_count(arch, num_classes=1000):
    """Number of parameters of the official classification model (with head)."""
    return sum(math.prod(v) for v in official_key_shapes(arch, num_classes).values())


def randomize_official_state_dict(sd, seed=0, dt_range=(1e-3, 1e-1)):
    """Fill the tensors of an official-format state dict (or an OrderedDict of shapes) with
    random values on scales that keep the scan stable and the activations O(1); returns a new
    dict (float32 CPU tensors, same shapes). ``dt_projs_bias`` = inverse softplus of dt drawn
    log-uniformly from ``dt_range`` (the official init range by default; with it the scan's
    C*h term moves the logits by only ~2% (T) / ~6% (Vanilla-T) -- use e.g. (1e-2, 1.0) for
    tests that must be sensitive to scan details)."""
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(shape, generator=g)

    def ru(*shape):
        return torch.rand(shape, generator=g)

    out = OrderedDict()
    for k, v in sd.items():
        shape = tuple(v.shape) if torch.is_tensor(v) else tuple(v)
        if k.endswith('A_logs'):                # S4D-real log(1..N), jittered
            n = shape[1]
            out[k] = torch.log(torch.arange(1, n + 1, dtype=torch.float32)).expand(shape) \
                + 0.5 * (ru(*shape) - 0.5)
        elif k.endswith('.Ds'):
            out[k] = 1 + 0.2 * rn(*shape)
        elif k.endswith('dt_projs_bias'):       # inverse softplus of dt in [1e-3, 1e-1]
            lo, hi = math.log(dt_range[0]), math.log(dt_range[1])
            dt = torch.exp(ru(*shape) * (hi - lo) + lo)
            out[k] = dt + torch.log(-torch.expm1(-dt))
        elif k.endswith('dt_projs_weight'):     # U(-R^-1/2, R^-1/2)
            bound = shape[-1] ** -0.5
            out[k] = (2 * ru(*shape) - 1) * bound
        elif k.endswith('x_proj_weight'):       # nn.Linear default scale
            bound = shape[-1] ** -0.5
            out[k] = (2 * ru(*shape) - 1) * bound
        elif len(shape) == 1 and k.endswith('.weight'):   # LayerNorm weights
            out[k] = 1 + 0.1 * rn(*shape)
        elif len(shape) == 1:                   # LayerNorm / conv / linear biases
            out[k] = 0.02 * rn(*shape)
        else:                                   # convs / linears: unit-variance outputs
            out[k] = rn(*shape) / math.sqrt(math.prod(shape[1:]))
    return out


def random_official_state_dict(arch, num_classes=10, seed=0, with_head=True,
                               with_outnorm=False, dt_range=(1e-3, 1e-1)):
    """A random official-format state dict for ``arch`` (see :data:`ARCHS`), built from
    :func:`official_key_shapes` only (no model needed)."""
    return randomize_official_state_dict(
        official_key_shapes(arch, num_classes, with_head=with_head, with_outnorm=with_outnorm),
        seed=seed, dt_range=dt_range)


def infer_depths(sd):
    depths = []
    i = 0
    while any(k.startswith(f'layers.{i}.blocks.') for k in sd):
        depths.append(1 + max(int(k.split('.')[3]) for k in sd
                              if k.startswith(f'layers.{i}.blocks.')))
        i += 1
    return depths


# ----------------------------------------------------------------------------------------------
# the forward
def infer_forward_type(sd):
    """'v0' when ``in_proj`` maps to 2*d_inner (z gate), else 'v05_noz'."""
    w = sd['layers.0.blocks.0.op.in_proj.weight']
    return 'v0' if w.shape[0] == 2 * sd['layers.0.blocks.0.op.conv2d.weight'].shape[0] \
        else 'v05_noz'


def official_vmamba_forward(sd, x, depths=None, forward_type=None, return_dense=False,
                            out_indices=(0, 1, 2, 3), eps=LN_EPS):
    """Official VMamba forward on a plain (official-format) state dict.

    x: (B, 3, H, W). ``depths`` defaults to the depths found in ``sd``; ``forward_type``
    ('v05_noz' or 'v0') to :func:`infer_forward_type`; stem and downsample versions follow the
    keys present (v2 stem iff ``patch_embed.5.*``; PatchMerging iff ``downsample.reduction.*``,
    else conv + LN at ``downsample.{1,3}``). Returns the logits
    (B, num_classes) (None if ``sd`` has no ``classifier.*`` keys); with ``return_dense`` returns
    ``(logits, dense)`` where ``dense`` is the list of NCHW maps of ``Backbone_VSSM`` for
    ``out_indices``: stage i's block output before its downsample, through ``outnorm{i}``
    (weight 1 / bias 0 when those keys are absent), eps 1e-5. The computation runs in x's dtype
    (state-dict tensors are cast to it); the scan is fp32, or float64 for float64 inputs.
    """
    if eps != LN_EPS:
        raise NotImplementedError('official LayerNorms use eps 1e-5')
    sd = canonical_official_state_dict(sd)
    sd = {k: (v.to(x.dtype) if v.is_floating_point() else v) for k, v in sd.items()}
    if depths is None:
        depths = infer_depths(sd)
    if forward_type is None:
        forward_type = infer_forward_type(sd)
    h = patch_embed(sd, x)
    dense = []
    for i, depth in enumerate(depths):
        for j in range(depth):
            h = vss_block(sd, f'layers.{i}.blocks.{j}.', h, forward_type)
        if return_dense and i in out_indices:
            w, b = sd.get(f'outnorm{i}.weight'), sd.get(f'outnorm{i}.bias')
            dense.append(layer_norm_cf(h, w, b).contiguous())
        h = downsample(sd, f'layers.{i}.downsample.', h)
    logits = None
    if 'classifier.head.weight' in sd:
        f = layer_norm_cf(h, sd['classifier.norm.weight'], sd['classifier.norm.bias'])
        logits = F.linear(f.mean((2, 3)), sd['classifier.head.weight'],
                          sd['classifier.head.bias'])
    return (logits, dense) if return_dense else logits
