"""PlainMamba (Yang et al., BMVC 2024): a plain (non-hierarchical) Mamba with a convolutional
stem and a continuous ("snake") 2D scan in four directions.

Data flow::

    image -> conv stem (7x7 s2 + BN + ReLU, extra 3x3 convs) -> 8x8 s8 projection (stride 16)
          -> + position embedding (bicubic-resized to the input's grid)
          -> layers: x = x + drop_path(PlainMamba2D(LN(x)))   [L1: then a dw3x3 + BN + GELU
                     block after layer 0, no residual]
          -> ln1 after the last layer; ``norm_layer{i}`` on the other outputs

Parameter names equal the official keys (``patch_embed.stem/convs/projection``, ``pos_embed``,
``layers.{i}.{norm,mamba,dw}``, ``ln1``), so the released files load 1:1 (``backbone.``
stripped, ``head.*`` and EMA buffers dropped).

The mixer computes exactly what the official one does, including its two quirks: only the
input ``u`` is put into each direction's order (step sizes, B and C stay in raster order, the
direction's learned bias ``direction_Bs[code]`` added to B by step), and the step-size bias is
applied twice (inside ``dt_proj`` and again as the scan's ``delta_bias``). The four directions
are snake orders (:class:`~amvim_mm.models.layout.scan_orders.Snake`) run as one grouped
selective scan; their outputs (each with its own ``D * u``) are summed, gated by ``SiLU(z)``.

Token reduction (``token_reduction=dict(type='ToMe' | 'RandomPrune' | 'EViT' | 'ToP', ...)``)
acts on the layers' single stream, as in Vim (no class token to protect):

* survivors stay in raster order in storage; each direction visits them in its own snake rank
  order. **decision (the first quirk on a reduced sequence)**: without alignment, step ``j`` of
  every direction takes delta, B and C of the survivor stored at index ``j`` (the official
  index pairing, applied to the survivors), and the direction code of the survivor it visits
  (``reduced_direction_codes='positional'``, default: the survivor's code in the full grid;
  ``'displacement'``: the move from the previous survivor). A token without a cell (EViT's
  fused token, last in every direction) gets code 0.
* with ToP's alignment the reduced scan equals the full-length official pass with zero input
  at the absent cells (``PlainMamba2D._aligned_scan``), to float rounding.
* the depthwise 7x7 conv and L1's layer-0 3x3 block run on the grid with a merged token at
  all of its cells and the pruned cells at zero (:mod:`~amvim_mm.models.layout.grid_conv`);
  the 3x3 block's BN normalises the present tokens.
* ToP's importance: the clipped channel sum of the summed four-direction output.
* dense outputs get the full grid back before their norm (merged tokens copied to their cells,
  pruned cells keep their last feature); ``avg_featmap`` is the size-weighted token mean.
"""
from __future__ import annotations

import copy
import functools
import math
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import MMLogger
from mmengine.model import BaseModule

from amvim_mm import runtime
from amvim_mm.errors import ConfigError, LookupConfigError
from amvim_mm.ops.backends import check_backend_usable
from amvim_mm.ops.cross_scan import DirectionIndex, cross_merge, cross_scan
from amvim_mm.ops.selective_scan import aligned_selective_scan, selective_scan_fn
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS
from ..layout.grid_conv import grid_depthwise_conv, whole_grid
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import masked_path_permutation, scan_rank
from ..reduction import ReducibleBackbone, ReductionSession, restore_grid
from .args import is_int, positive_int, rate, resolve_out_indices
from .checkpoint_guard import CheckpointGuard, pretrained_init_cfg
from .drop import DropPath
from .embed import resize_pos_embed
from .input_check import ImageInputCheck
from .layer_decay import teach_upstream_layer_decay

#: the official arch zoo (``PlainMamba.arch_zoo``); d_state 16, expand 2, dt_rank ceil(C/16)
PLAIN_MAMBA_ARCHS = {
    'l1': dict(aliases=('l1', 'L1'), embed_dims=192, num_layers=24, num_convs_patch_embed=1,
               layers_with_dwconv=(0, )),
    'l2': dict(aliases=('l2', 'L2'), embed_dims=384, num_layers=24, num_convs_patch_embed=2,
               layers_with_dwconv=()),
    'l3': dict(aliases=('l3', 'L3'), embed_dims=448, num_layers=36, num_convs_patch_embed=2,
               layers_with_dwconv=()),
    # a small architecture so that every code path runs on a CPU in well under a second
    'test': dict(embed_dims=32, num_layers=4, num_convs_patch_embed=1, layers_with_dwconv=(0, ),
                 d_state=8),
}
REQUIRED_ARCH_KEYS = frozenset({'embed_dims', 'num_layers'})
ARCH_DEFAULTS = dict(patch_size=16, num_convs_patch_embed=2, layers_with_dwconv=(), d_state=16,
                     expand=2, dt_rank=None, d_conv=7)
OUT_TYPES = ('featmap', 'avg_featmap')
#: the four directions: row snake, its reverse, column snake, its reverse (official order)
SNAKE_DIRECTIONS = (dict(order='snake', axis='row'), dict(order='snake', axis='row', reverse=True),
                    dict(order='snake', axis='col'), dict(order='snake', axis='col', reverse=True))
STEM_CHANNELS = 64
#: ToP-ViM's PlainMamba-L3 budget: 41.6 % fewer FLOPs than the 14.454 G of L3 at 224, i.e.
#: 8.44 G. Keeping ``rho`` of the tokens after layers 9, 18 and 27 (counted from 1) costs about
#: 1.403 + 0.3624 * 9 * (1 + rho + rho^2 + rho^3) G; with the schedule's ``int()`` rounding
#: rho = 0.598 keeps 196 -> 117 -> 69 -> 41 tokens: 8.447 G (41.6 % fewer; 0.6 gives 8.48 G).
#: Use as ``dict(type='ToP', **L3_TOP_BUDGET)`` (or EViT, the same schedule).
L3_TOP_BUDGET = dict(keep_rate=0.598, locations=(8, 17, 26))
#: how the steps of a reduced sequence get their direction codes (see :class:`PlainMamba2D`)
REDUCED_DIRECTION_CODES = ('positional', 'displacement')


def _arch_settings(arch: Union[str, dict]) -> Dict[str, object]:
    if isinstance(arch, str):
        aliases = {a: k for k, v in PLAIN_MAMBA_ARCHS.items() for a in v.get('aliases', (k, ))}
        key = aliases.get(arch)
        if key is None:
            raise LookupConfigError(f'unknown PlainMamba arch {arch!r}; choose one of '
                                    f'{sorted(aliases)} or pass a dict with the keys '
                                    f'{sorted(REQUIRED_ARCH_KEYS)}')
        cfg = dict(ARCH_DEFAULTS)
        cfg.update({k: v for k, v in PLAIN_MAMBA_ARCHS[key].items() if k != 'aliases'})
    else:
        if not isinstance(arch, dict):
            raise ConfigError(f'PlainMamba arch must be a name or a dict, got '
                              f'{type(arch).__name__}')
        missing = REQUIRED_ARCH_KEYS - set(arch)
        unknown = set(arch) - REQUIRED_ARCH_KEYS - set(ARCH_DEFAULTS)
        if missing or unknown:
            raise ConfigError(
                f'custom PlainMamba arch {arch!r}: '
                + (f'missing keys {sorted(missing)}; ' if missing else '')
                + (f'unknown keys {sorted(unknown)}; ' if unknown else '')
                + f'required {sorted(REQUIRED_ARCH_KEYS)}, optional {sorted(ARCH_DEFAULTS)}')
        cfg = dict(ARCH_DEFAULTS)
        cfg.update(arch)
    for k in ('embed_dims', 'num_layers', 'd_state', 'expand', 'd_conv'):
        if not is_int(cfg[k]) or cfg[k] < 1:
            raise ConfigError(f'PlainMamba arch: {k} must be a positive int, got {cfg[k]!r}')
    if not is_int(cfg['patch_size']) or cfg['patch_size'] < 2 or cfg['patch_size'] % 2:
        raise ConfigError(f'PlainMamba arch: patch_size must be an even int >= 2 (the stem '
                          f'halves, the projection does the rest), got {cfg["patch_size"]!r}')
    if cfg['d_conv'] % 2 == 0:
        raise ConfigError(f'PlainMamba arch: d_conv must be odd, got {cfg["d_conv"]!r}')
    if not is_int(cfg['num_convs_patch_embed']) or cfg['num_convs_patch_embed'] < 0:
        raise ConfigError('PlainMamba arch: num_convs_patch_embed must be an int >= 0, got '
                          f'{cfg["num_convs_patch_embed"]!r}')
    dw = cfg['layers_with_dwconv']
    if not isinstance(dw, (list, tuple)) or not all(
            is_int(i) and 0 <= i < cfg['num_layers'] for i in dw):
        raise ConfigError(f'PlainMamba arch: layers_with_dwconv must be layer indices, got '
                          f'{dw!r}')
    cfg['layers_with_dwconv'] = tuple(int(i) for i in dw)
    if cfg['dt_rank'] is None:
        cfg['dt_rank'] = math.ceil(cfg['embed_dims'] / 16)
    elif not is_int(cfg['dt_rank']) or cfg['dt_rank'] < 1:
        raise ConfigError(f'PlainMamba arch: dt_rank must be a positive int, got '
                          f'{cfg["dt_rank"]!r}')
    return cfg


# ---------------------------------------------------------------------------------------------
# the snake directions
# ---------------------------------------------------------------------------------------------
#: direction codes (index of ``direction_Bs``): 0 start, 1 right, 2 left, 3 up, 4 down
MOVE_CODES = {(0, 1): 1, (0, -1): 2, (-1, 0): 3, (1, 0): 4}


def move_codes(order: torch.Tensor, W: int) -> torch.Tensor:
    """(L,) raster positions in visiting order -> (L,) code of the move arriving at each step
    (0 at the first step; a non-neighbouring jump is refused)."""
    i, j = order // W, order % W
    di, dj = (i[1:] - i[:-1]).tolist(), (j[1:] - j[:-1]).tolist()
    codes = [0]
    for a, b in zip(di, dj):
        if (a, b) not in MOVE_CODES:
            raise ConfigError(f'a snake order jumps by ({a}, {b}): not a neighbouring cell')
        codes.append(MOVE_CODES[(a, b)])
    return torch.tensor(codes, dtype=torch.long)


@functools.lru_cache(maxsize=64)
def snake_directions(H: int, W: int, device) -> Tuple[DirectionIndex, torch.Tensor]:
    """The four directions of an H x W grid: their :class:`DirectionIndex` (perm (4, 1, L))
    and the direction codes of each step (4, L), cached per grid and device."""
    orders = []
    for spec in SNAKE_DIRECTIONS:
        order = torch.argsort(scan_rank(H, W, {k: v for k, v in spec.items()
                                               if k != 'reverse'}))
        orders.append(order.flip(0) if spec.get('reverse') else order)
    perm = torch.stack(orders)
    codes = torch.stack([move_codes(o, W) for o in orders])
    return DirectionIndex.from_perm(perm[:, None].to(device)), codes.to(device)


@functools.lru_cache(maxsize=64)
def snake_cell_tables(H: int, W: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per direction and grid cell (both (4, H * W + 1) long, the extra column for a token
    without a cell): the cell's step in the direction's full-grid order (its rank; ``H * W``
    for the extra column) and the code of the move arriving at it (0 for the extra column)."""
    index, codes = snake_directions(H, W, device)
    perm = index.perm[:, 0]                                            # (4, L): cell at step
    M = H * W
    steps = torch.full((4, M + 1), M, dtype=torch.long, device=device)
    steps[:, :M] = index.inv[:, 0].long()
    cell_codes = torch.zeros(4, M + 1, dtype=torch.long, device=device)
    cell_codes[:, :M].scatter_(1, perm, codes)
    return steps, cell_codes


def displacement_codes(cells: torch.Tensor, W: int) -> torch.Tensor:
    """(..., L) grid cells in a direction's visiting order -> the code of each step recomputed
    from the displacement to the previous present cell (the ``'displacement'`` option for
    reduced sequences): the larger of the row and column moves decides (the column move on a
    tie), its sign the code; 0 at the first step and for a token without a cell (< 0)."""
    i, j = torch.div(cells, W, rounding_mode='floor'), cells % W
    di, dj = i[..., 1:] - i[..., :-1], j[..., 1:] - j[..., :-1]
    horiz = dj.abs() >= di.abs()
    code = torch.where(horiz, torch.where(dj > 0, 1, 2), torch.where(di > 0, 4, 3))
    code = torch.cat([torch.zeros_like(code[..., :1]), code], -1)
    valid = cells >= 0
    prev_valid = torch.cat([torch.zeros_like(valid[..., :1]), valid[..., :-1]], -1)
    return torch.where(valid & prev_valid, code, torch.zeros_like(code))


# ---------------------------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------------------------
class ConvPatchEmbed(nn.Module):
    """The official convolutional patch embedding: a 7x7 stride-2 stem conv + BN + ReLU,
    ``num_convs`` 3x3 convs + BN + ReLU, and a ``patch_size / 2`` projection of the same stride
    (8x8 stride 8 for the released models: stride 16 in all); inputs are zero-padded
    bottom/right to a multiple of the projection's stride (mmcv's
    ``AdaptivePadding('corner')``)."""

    def __init__(self, in_channels: int, embed_dims: int, num_convs: int,
                 patch_size: int = 16) -> None:
        super().__init__()
        self.patch_size = patch_size
        c = STEM_CHANNELS
        self.stem = nn.Sequential(nn.Conv2d(in_channels, c, 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        convs = []
        for _ in range(num_convs):
            convs += [nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c),
                      nn.ReLU(inplace=True)]
        self.convs = nn.Sequential(*convs)
        k = patch_size // 2
        self.projection = nn.Conv2d(c, embed_dims, k, k)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.convs(self.stem(x))
        h, w = x.shape[-2:]
        k = self.projection.stride[0]
        ph, pw = -h % k, -w % k
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        x = self.projection(x)
        return x.flatten(2).transpose(1, 2), tuple(x.shape[-2:])


class PlainMamba2D(nn.Module):
    """The official PlainMamba mixer on (B, L, C) raster tokens of an H x W grid.

    Args:
        embed_dims: C; ``expand``: E = expand * C; ``d_state``: N; ``dt_rank``: R;
        ``d_conv``: the depthwise conv size (7); ``scan_backend``: selective-scan backend.
        reduced_direction_codes: the direction codes of a reduced sequence's steps without
            alignment: ``'positional'`` (each survivor keeps the code of its cell in the full
            grid, default) or ``'displacement'`` (recomputed from the move from the previous
            survivor). Aligned scans use the full-grid codes (they equal the full pass).
    """

    num_directions = len(SNAKE_DIRECTIONS)

    def __init__(self, embed_dims: int, d_state: int = 16, expand: int = 2, dt_rank: int = 12,
                 d_conv: int = 7, scan_backend: Optional[str] = None,
                 reduced_direction_codes: str = 'positional', dt_min: float = 0.001,
                 dt_max: float = 0.1, dt_init_floor: float = 1e-4) -> None:
        super().__init__()
        if reduced_direction_codes not in REDUCED_DIRECTION_CODES:
            raise ConfigError(f'PlainMamba: reduced_direction_codes must be one of '
                              f'{REDUCED_DIRECTION_CODES}, got {reduced_direction_codes!r}')
        self.reduced_direction_codes = reduced_direction_codes
        self.d_model, self.d_state, self.dt_rank = embed_dims, d_state, dt_rank
        self.d_inner = E = expand * embed_dims
        self.scan_backend = scan_backend
        self.dt_init_range = (dt_min, dt_max, dt_init_floor)
        self.in_proj = nn.Linear(embed_dims, 2 * E, bias=True)
        self.conv2d = nn.Conv2d(E, E, d_conv, padding=d_conv // 2, groups=E, bias=True)
        self.x_proj = nn.Linear(E, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, E, bias=True)
        self.out_proj = nn.Linear(E, embed_dims, bias=True)
        self.A_log = nn.Parameter(torch.empty(E, d_state))
        self.D = nn.Parameter(torch.empty(E))
        self.direction_Bs = nn.Parameter(torch.empty(5, d_state))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The official initialisation: PyTorch defaults for the linear layers and convs,
        dt_proj U(-R^-0.5, R^-0.5) with the inverse-softplus bias of a log-uniform step in
        [dt_min, dt_max], S4D-real ``A_log``, ``D = 1``, ``direction_Bs`` trunc-normal 0.02."""
        for m in (self.in_proj, self.conv2d, self.x_proj, self.out_proj):
            m.reset_parameters()
        dt_min, dt_max, floor = self.dt_init_range
        R, E = self.dt_rank, self.d_inner
        with torch.no_grad():
            self.dt_proj.weight.uniform_(-R**-0.5, R**-0.5)
            dt = torch.exp(torch.rand(E) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min)).clamp(min=floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.A_log.copy_(torch.log(torch.arange(1, self.d_state + 1, dtype=torch.float32))
                             .repeat(E, 1))
            self.D.fill_(1.0)
        nn.init.trunc_normal_(self.direction_Bs, std=.02)

    def forward(self, x: torch.Tensor, ctx: ScanContext) -> torch.Tensor:
        """(B, L, C) tokens of the grid cells in ``ctx`` (the whole grid, or the survivors of
        a token reduction) -> (B, L, C)."""
        B, L, _ = x.shape
        H, W = ctx.grid
        K, E = self.num_directions, self.d_inner
        xi, z = self.in_proj(x).chunk(2, dim=-1)
        xc = F.silu(grid_depthwise_conv(xi, ctx, self.conv2d))
        x_dbl = F.linear(xc, self.x_proj.weight)                   # storage (raster) order
        if whole_grid(ctx):
            index, codes = snake_directions(H, W, x.device)
            index_cells = None
        else:
            index = ctx.direction_index(SNAKE_DIRECTIONS)
            pos = ctx.pos if ctx.pos.dim() == 2 else ctx.pos.expand(B, -1)
            cell = torch.where(pos >= 0, pos, torch.full_like(pos, H * W))  # no cell -> H*W
            # (B, K, L): the cell each direction visits at each of its steps
            index_cells = torch.gather(cell.unsqueeze(0).expand(K, -1, -1), 2,
                                       index.perm).permute(1, 0, 2)
        xs = cross_scan(xc, H, W, index)                # only u goes into each order (Q1)
        ct = torch.float64 if xs.dtype == torch.float64 else torch.float32
        A = -torch.exp(self.A_log.to(ct)).repeat(K, 1)
        bias = self.dt_proj.bias.to(ct).repeat(K)
        if index_cells is not None and ctx.align is not None and ctx.reduced:
            y = self._aligned_scan(xs, x_dbl, cell, index_cells, ctx, A, bias)
        else:
            y = self._scan(xs, x_dbl, codes if index_cells is None
                           else self._reduced_codes(index_cells, H, W), A, bias)
        y = cross_merge(y.view(B, K, E, L), H, W, index)                    # (B, L, E) sum
        if ctx.want_importance:
            # ToP importance: the clipped channel sum of the summed 4-direction output
            ctx.importance = y.float().clamp_min(0).sum(-1).detach()
        return self.out_proj(y.to(z.dtype) * F.silu(z))

    def forward_masked(self, x: torch.Tensor, ctx: ScanContext, keep: torch.Tensor
                       ) -> torch.Tensor:
        """The mixer on the full grid with per-sample keep masks (a learned reducer's
        training): equal, at the kept tokens, to the mixer on each sample's pruned sequence
        without alignment; the dropped tokens' outputs are zero.

        The depthwise conv sees the dropped cells as zero (what the reduced grid's conv gives
        them); every direction scans each sample's kept tokens first in its own order, and
        step ``j`` takes delta, B, C of the ``j``-th kept token in raster order (the first
        quirk on the reduced sequence) and the direction code of the cell it visits
        (``'positional'``), the dropped tokens after. ``keep`` (B, L) 0 / 1 (a float
        straight-through mask carries the gradient into the conv output and the output).
        """
        if self.reduced_direction_codes != 'positional':
            raise ConfigError("PlainMamba: a learned reducer's masked training forward uses "
                              "reduced_direction_codes='positional'")
        if not whole_grid(ctx):
            raise ConfigError('forward_masked takes the whole grid')
        B, L, _ = x.shape
        H, W = ctx.grid
        K, E = self.num_directions, self.d_inner
        kf = keep.to(x.dtype).unsqueeze(-1)
        kept = keep > 0.5
        xi, z = self.in_proj(x).chunk(2, dim=-1)
        xc = F.silu(grid_depthwise_conv(xi * kf, ctx, self.conv2d)) * kf
        steps, cell_codes = snake_cell_tables(H, W, x.device)
        pos = torch.arange(L, device=x.device)
        store = masked_path_permutation(pos, pos, kept)                 # kept, raster order
        x_dbl = F.linear(torch.gather(xc, 1, store.unsqueeze(-1).expand_as(xc)),
                         self.x_proj.weight)
        perms = torch.stack([masked_path_permutation(steps[k, :L], pos, kept)
                             for k in range(K)], 1)                     # (B, K, L)
        xs = torch.gather(xc.transpose(1, 2).unsqueeze(1).expand(B, K, E, L), 3,
                          perms.unsqueeze(2).expand(B, K, E, L))
        codes = torch.gather(cell_codes[:, :L].unsqueeze(0).expand(B, -1, -1), 2, perms)
        ct = torch.float64 if xs.dtype == torch.float64 else torch.float32
        A = -torch.exp(self.A_log.to(ct)).repeat(K, 1)
        bias = self.dt_proj.bias.to(ct).repeat(K)
        y = self._scan(xs.contiguous(), x_dbl, codes, A, bias).view(B, K, E, L)
        y = torch.zeros_like(y).scatter_(3, perms.unsqueeze(2).expand(B, K, E, L), y)
        y = y.sum(1).transpose(1, 2)                                      # (B, L, E)
        if ctx.want_importance:
            ctx.importance = y.float().clamp_min(0).sum(-1).detach()
        return self.out_proj(y.to(z.dtype) * F.silu(z)) * kf

    def _scan(self, xs: torch.Tensor, x_dbl: torch.Tensor, codes: torch.Tensor,
              A: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The official scan: step ``j`` of every direction takes u of the token the direction
        visits there (``xs``) and delta, B, C of the token stored at index ``j`` (Q1), the
        direction bias ``direction_Bs[codes]`` ((K, L) or (B, K, L)) and the dt bias again as
        ``delta_bias`` (Q2)."""
        B, K, E, L = xs.shape
        N, R = self.d_state, self.dt_rank
        dt_low, Bm, Cm = torch.split(x_dbl, [R, N, N], dim=-1)
        dt = self.dt_proj(dt_low)                       # first application of the dt bias
        dtype = xs.dtype
        delta = dt.transpose(1, 2).unsqueeze(1).expand(B, K, E, L).reshape(B, K * E, L)
        Bk = (Bm.transpose(1, 2).unsqueeze(1)
              + self.direction_Bs[codes].transpose(-1, -2))                # (B, K, N, L)
        Ck = Cm.transpose(1, 2).unsqueeze(1).expand(B, K, N, L)
        ct = A.dtype
        return selective_scan_fn(xs.reshape(B, K * E, L), delta.to(dtype), A,
                                 Bk.to(dtype).contiguous(), Ck.to(dtype).contiguous(),
                                 self.D.to(ct).repeat(K), None, delta_bias=bias,   # again (Q2)
                                 delta_softplus=True, backend=self.scan_backend)

    def _reduced_codes(self, index_cells: torch.Tensor, H: int, W: int) -> torch.Tensor:
        """(B, K, L) direction codes of a reduced sequence's steps: each survivor's own
        full-grid code (``'positional'``) or the code of the displacement from the previous
        survivor (``'displacement'``); 0 for a token without a cell."""
        if self.reduced_direction_codes == 'displacement':
            cells = torch.where(index_cells < H * W, index_cells, torch.full_like(index_cells, -1))
            return displacement_codes(cells, W)
        _, cell_codes = snake_cell_tables(H, W, index_cells.device)
        return torch.gather(cell_codes.unsqueeze(0).expand(index_cells.shape[0], -1, -1), 2,
                            index_cells)

    def _aligned_scan(self, xs: torch.Tensor, x_dbl: torch.Tensor, cell: torch.Tensor,
                      index_cells: torch.Tensor, ctx: ScanContext, A: torch.Tensor,
                      bias: torch.Tensor) -> torch.Tensor:
        """ToP's hidden-state alignment: each direction scans the survivors as the full-length
        official scan with zero input at the absent cells would, read at the survivors.

        In that pass step ``t`` of a direction takes u of the cell the direction visits there
        and delta, B, C of raster cell ``t`` (Q1); an absent cell has ``xc = 0``, so its
        ``dt = dt_proj(0)`` is the bias (delta ``softplus(2 b)``), its B the direction bias
        and its C zero. A survivor visited at full-grid step ``s`` therefore takes delta, B, C
        of raster cell ``s`` (a survivor's, or an absent cell's), and the absent steps between
        two survivors (u = 0) fold into its step size
        (:func:`~amvim_mm.ops.selective_scan.aligned_selective_scan`). Nothing full-length is
        formed: raster cell ``t`` is found among the stored survivors (raster-ascending) by a
        search, a gap's present cells are summed by a scatter-add (no prefix-sum
        differences) and its absent cells count ``softplus(2 b)`` each.
        ``gap_delta='token'`` uses the survivor's own step size for every skipped step instead.
        """
        B, K, E, L = xs.shape
        N, R = self.d_state, self.dt_rank
        H, W = ctx.grid
        ct = A.dtype
        if ctx.has_fused:
            raise ConfigError('PlainMamba: hidden-state alignment with a fused token (EViT) '
                              'is not defined')
        steps_tab, cell_codes = snake_cell_tables(H, W, xs.device)
        steps = torch.gather(steps_tab.unsqueeze(0).expand(B, -1, -1), 2, index_cells)
        codes = torch.gather(cell_codes.unsqueeze(0).expand(B, -1, -1), 2, index_cells)
        pos = cell.contiguous()                                   # (B, L) raster-ascending
        # the stored survivor at raster cell s (if any) for every kept step s: (B, K, L)
        flat = steps.reshape(B, K * L)
        idx = torch.searchsorted(pos, flat).clamp(max=L - 1)
        here = (torch.gather(pos, 1, idx) == flat).view(B, K, L)
        idx = idx.view(B, K, L)
        dt_low, Bm, Cm = torch.split(x_dbl, [R, N, N], dim=-1)
        dt = self.dt_proj(dt_low).to(ct)                          # (B, L, E), one bias

        def at_steps(t: torch.Tensor, absent) -> torch.Tensor:   # (B, L, X) -> (B, K, X, L)
            X = t.shape[-1]
            g = torch.gather(t, 1, idx.reshape(B, K * L, 1).expand(-1, -1, X))
            g = g.view(B, K, L, X).transpose(2, 3)
            return torch.where(here.unsqueeze(2), g, absent)

        b1 = bias[:E]
        delta = at_steps(dt, b1.view(1, 1, E, 1)).reshape(B, K * E, L)   # absent: dt = b
        Bk = at_steps(Bm.to(ct), 0.0) + self.direction_Bs.to(ct)[codes].transpose(-1, -2)
        Ck = at_steps(Cm.to(ct), 0.0)
        prev = torch.cat([steps.new_full((B, K, 1), -1), steps[..., :-1]], -1)
        skipped = (steps - prev - 1).to(ct)                          # (B, K, L)
        if ctx.align == 'token':
            own = F.softplus(delta + bias[None, :, None]).view(B, K, E, L)
            gap = skipped.unsqueeze(2) * own
        else:
            # survivor i (raster cell pos_i = a step) lies in the gap before the first kept
            # step after it; the kept step at its own cell, or none after it, is no gap (slot L)
            seg = torch.searchsorted(steps.reshape(B * K, L),
                                     pos.unsqueeze(1).expand(B, K, L).reshape(B * K, L))
            own_step = torch.gather(steps.reshape(B * K, L), 1, seg.clamp(max=L - 1)) == \
                pos.unsqueeze(1).expand(B, K, L).reshape(B * K, L)
            seg = torch.where(own_step | (seg >= L), torch.full_like(seg, L), seg).view(B, K, L)
            d = F.softplus(dt + b1).transpose(1, 2)                           # (B, E, L)
            present = d.new_zeros(B, K, E, L + 1).scatter_add_(
                3, seg.unsqueeze(2).expand(B, K, E, L), d.unsqueeze(1).expand(B, K, E, L))
            n_present = skipped.new_zeros(B, K, L + 1).scatter_add_(
                2, seg, torch.ones_like(skipped))
            absent = (skipped - n_present[..., :L]).unsqueeze(2)
            gap = present[..., :L] + absent * F.softplus(b1 + b1).view(1, 1, E, 1)
        return aligned_selective_scan(xs.reshape(B, K * E, L), delta, A, Bk, Ck,
                                      self.D.to(ct).repeat(K), None, delta_bias=bias,
                                      gap_delta=gap.reshape(B, K * E, L),
                                      backend=self.scan_backend)


class PlainMambaLayer(nn.Module):
    """``x = x + drop_path(mamba(norm(x)))``, then (L1's layer 0) ``x = dw(x)`` on the grid:
    dw3x3 (no bias) + BN + GELU, no residual."""

    def __init__(self, embed_dims: int, drop_path: float, with_dwconv: bool,
                 norm_eps: float = 1e-5, **mixer_kwargs) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mamba = PlainMamba2D(embed_dims, **mixer_kwargs)
        self.drop_path = DropPath(drop_path)
        if with_dwconv:
            self.dw = nn.Sequential(
                nn.Conv2d(embed_dims, embed_dims, 3, 1, 1, groups=embed_dims, bias=False),
                nn.BatchNorm2d(embed_dims), nn.GELU())

    def merge_metric(self, x: torch.Tensor) -> torch.Tensor:
        """ToMe's similarity features of this layer's input: its normalised input."""
        return self.norm(x)

    def forward(self, x: torch.Tensor, ctx: ScanContext,
                keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``keep``: a learned reducer's (B, L) keep mask (training): the mixer's masked
        forward; the dw block (L1's layer 0) sees the dropped cells as zero and leaves the
        dropped tokens as they are (inference does not touch a pruned token)."""
        if keep is not None:
            x = x + self.drop_path(self.mamba.forward_masked(self.norm(x), ctx, keep))
            if hasattr(self, 'dw'):
                kf = keep.to(x.dtype).unsqueeze(-1)
                g = grid_depthwise_conv(x * kf, ctx, self.dw[0])
                g = self.dw[1](g.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)
                x = torch.where(kf > 0.5, self.dw[2](g), x)
            return x
        x = x + self.drop_path(self.mamba(self.norm(x), ctx))
        if hasattr(self, 'dw'):
            B, L, C = x.shape
            # the 3x3 conv on the grid cells (absent cells zero); BN over the present tokens
            g = grid_depthwise_conv(x, ctx, self.dw[0])
            g = self.dw[1](g.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)
            x = self.dw[2](g)
        return x


# ---------------------------------------------------------------------------------------------
# the backbone
# ---------------------------------------------------------------------------------------------
@MODELS.register_module()
class PlainMamba(ImageInputCheck, CheckpointGuard, ReducibleBackbone, BaseModule):
    """PlainMamba L1 / L2 / L3 for classification, segmentation and detection.

    Args:
        arch: ``'l1'``, ``'l2'``, ``'l3'`` (or ``'L1'``...), ``'test'``, or a dict with
            ``embed_dims`` and ``num_layers`` (optional ``patch_size`` (16; even: the stem's
            stride 2 times the projection's), ``num_convs_patch_embed``,
            ``layers_with_dwconv``, ``d_state``, ``expand``, ``dt_rank``, ``d_conv``).
        img_size: the position embedding's image size (its grid: ``img_size / patch``); any input
            size works (the embedding is resized bicubically, as the official code does).
        in_channels: image channels.
        out_indices: layers whose outputs are returned (negatives count from the end; default
            the last).
        out_type: ``'featmap'`` (B, C, H/p, W/p), p the patch size (16): layer ``i``'s
            output through its own ``norm_layer{i}`` (LayerNorm eps 1e-6), the last layer's
            through ``ln1`` when
            ``final_norm`` (the official ``PlainMamba.forward(x)[1]`` / mmseg backbone);
            ``'avg_featmap'`` (B, C): ``ln1`` and the mean over tokens (the official
            classifier's pooling), with ``out_indices=-1`` only.
        final_norm: ``ln1`` (eps 1e-6) after the last layer.
        drop_rate: dropout after the position embedding; ``drop_path_rate``: stochastic depth,
            ``linspace(0, rate, num_layers)``.
        frozen_stages: -1 none; ``k >= 0`` freezes the patch and position embeddings and the
            first ``k`` layers.
        norm_eps: the layers' LayerNorm epsilon (1e-5 as the official code).
        scan_backend: selective-scan backend (``None``: automatic).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads a released file (mmcls
            layout: ``state_dict`` with ``backbone.*``, ``head.*``) or a bare backbone state
            dict strictly; ``head.*`` and EMA buffers (``ema_*``) are dropped; output norms
            absent from the file keep weight 1 / bias 0 (logged).
        pretrained: mmseg's deprecated form of ``init_cfg=dict(type='Pretrained',
            checkpoint=pretrained)`` (mmseg's ``EncoderDecoder`` passes its own on); not
            together with ``init_cfg`` (see
            :func:`~amvim_mm.models.backbones.checkpoint_guard.pretrained_init_cfg`).
    """

    arch_zoo = PLAIN_MAMBA_ARCHS
    classifier_out_types = ('avg_featmap', )

    @property
    def min_input_size(self) -> int:
        """The smallest image height and width: one patch (see :meth:`check_images`)."""
        return self.patch_size

    def input_dtype(self) -> torch.dtype:
        """The dtype of images outside autocast: the stem's first weight's."""
        return self.patch_embed.stem[0].weight.dtype

    def __init__(self,
                 arch: Union[str, dict] = 'l1',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'featmap',
                 final_norm: bool = True,
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eps: float = 1e-5,
                 scan_backend: Optional[str] = None,
                 token_reduction: Optional[dict] = None,
                 reduced_direction_codes: str = 'positional',
                 init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None) -> None:
        name = type(self).__name__
        super().__init__(init_cfg=pretrained_init_cfg(name, pretrained, copy.deepcopy(init_cfg)))
        teach_upstream_layer_decay()    # mmseg's / mmdet's decay constructors (see layer_decay)
        self.arch_settings = cfg = _arch_settings(arch)
        self.embed_dims = C = cfg['embed_dims']
        self.num_layers = depth = cfg['num_layers']
        if out_type not in OUT_TYPES:
            raise ConfigError(f'{name}: out_type must be one of {OUT_TYPES}, got {out_type!r}')
        self.out_type = out_type
        if is_int(img_size):
            img_size = (img_size, img_size)
        if not isinstance(img_size, (tuple, list)) or len(img_size) != 2 or \
                not all(is_int(v) and v >= cfg['patch_size'] for v in img_size):
            raise ConfigError(f'{name}: img_size must be an int or a pair (H, W) of ints >= '
                              f'{cfg["patch_size"]} (the patch size), got {img_size!r}')
        self.img_size = (int(img_size[0]), int(img_size[1]))
        in_channels = positive_int(name, 'in_channels', in_channels)
        self.in_channels = int(in_channels)
        drop_rate = rate(name, 'drop_rate', drop_rate)
        drop_path_rate = rate(name, 'drop_path_rate', drop_path_rate)
        if not is_int(frozen_stages) or frozen_stages < -1:
            raise ConfigError(f'{name}: frozen_stages must be an int >= -1, got '
                              f'{frozen_stages!r}')
        if not isinstance(final_norm, bool):
            raise ConfigError(f'{name}: final_norm must be a bool, got {final_norm!r}')
        self.final_norm = final_norm
        self.out_indices = resolve_out_indices(name, out_indices, depth, 'layers')
        if out_type == 'avg_featmap' and self.out_indices != [depth - 1]:
            raise ConfigError(f'{name}: out_type="avg_featmap" is the classifier input and needs '
                              f'out_indices=-1, got {out_indices!r}')
        check_backend_usable(scan_backend, name)

        self.patch_size = P = cfg['patch_size']
        self.patch_embed = ConvPatchEmbed(in_channels, C, cfg['num_convs_patch_embed'], P)
        self.patch_resolution = (math.ceil(self.img_size[0] / P),
                                 math.ceil(self.img_size[1] / P))
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.patch_resolution[0] * self.patch_resolution[1], C))
        self.drop_after_pos = nn.Dropout(p=float(drop_rate))
        dpr = [x.item() for x in torch.linspace(0, float(drop_path_rate), depth)]
        self.layers = nn.ModuleList(
            PlainMambaLayer(C, dpr[i], i in cfg['layers_with_dwconv'], norm_eps,
                            d_state=cfg['d_state'], expand=cfg['expand'],
                            dt_rank=cfg['dt_rank'], d_conv=cfg['d_conv'],
                            scan_backend=scan_backend,
                            reduced_direction_codes=reduced_direction_codes)
            for i in range(depth))
        if final_norm:
            self.ln1 = nn.LayerNorm(C, eps=1e-6)
        if out_type == 'featmap':
            for i in self.out_indices:
                if i != depth - 1:
                    self.add_module(f'norm_layer{i}', nn.LayerNorm(C, eps=1e-6))
        self.frozen_stages = frozen_stages
        self._register_load_state_dict_pre_hook(self._official_keys)
        self.guard_whole_model_loads()
        self.reset_weights()
        self._freeze_stages()
        self.token_counts: Sequence[int] = ()
        self.last_context: Optional[ScanContext] = None
        self.set_token_reduction(token_reduction)

    # ----------------------------------------------------------------- init and loading
    def reset_weights(self) -> None:
        """The official initialisation (mixers as :meth:`PlainMamba2D.reset_parameters`,
        norms 1 / 0, position embedding trunc-normal 0.02, convs PyTorch's default)."""
        for m in self.modules():
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                m.reset_parameters()
            elif isinstance(m, nn.Conv2d):
                m.reset_parameters()
            elif isinstance(m, PlainMamba2D):
                m.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=.02)

    def init_weights(self) -> None:
        """Load ``init_cfg=dict(type='Pretrained', checkpoint=...)`` strictly, or initialise
        (a parent's generic ``init_cfg`` has run before: the own initialisation first)."""
        self.reset_weights()
        if not self.load_pretrained():
            super().init_weights()

    def _official_keys(self, state_dict, prefix, *args, **kwargs) -> None:
        """Load pre-hook: drop a classifier head (``head.*``) and EMA buffers (``ema_*``);
        resize a position embedding of another grid (bicubic, as the official code); give
        output norms absent from an official file this model's values (weight 1, bias 0)."""
        for k in [k for k in state_dict if k.startswith(prefix)]:
            rest = k[len(prefix):]
            if rest.startswith('head.') or rest.startswith('ema_'):
                del state_dict[k]
        name = prefix + 'pos_embed'
        if name in state_dict and state_dict[name].shape != self.pos_embed.shape:
            ckpt = state_dict[name]
            side = math.isqrt(ckpt.shape[1])
            if ckpt.dim() == 3 and side * side == ckpt.shape[1] and \
                    ckpt.shape[-1] == self.embed_dims:
                MMLogger.get_current_instance().info(
                    f'Resize the pos_embed shape from {tuple(ckpt.shape)} to '
                    f'{tuple(self.pos_embed.shape)}.')
                state_dict[name] = resize_pos_embed(ckpt, (side, side), self.patch_resolution,
                                                    with_cls_token=False)
        self.keep_missing_output_norms(state_dict, prefix, 'norm_layer',
                                       'patch_embed.projection.weight')

    # ----------------------------------------------------------------- training helpers
    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        self.pos_embed.requires_grad = False
        frozen = [self.patch_embed] + [self.layers[i] for i in
                                       range(min(self.frozen_stages, self.num_layers))]
        for m in frozen:
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        return self

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """``(layer_depth, num_layers + 2)``: embeddings 0, layer ``i`` ``i + 1``, the norms
        after the layers the last."""
        num_layers = self.num_layers + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix):]
        if name.startswith(('patch_embed', 'pos_embed')):
            return 0, num_layers
        if name.startswith('layers.'):
            return int(name.split('.')[1]) + 1, num_layers
        return num_layers - 1, num_layers

    # ----------------------------------------------------------------- token reduction
    def reduction_domain(self) -> Tuple[int, int]:
        """(tokens, layers) a token reducer's schedule acts on at ``img_size``."""
        return self.patch_resolution[0] * self.patch_resolution[1], self.num_layers

    def reduction_domain_note(self, tokens: int, blocks: int) -> str:
        return f'{tokens} tokens, {blocks} layers'

    # ----------------------------------------------------------------- forward
    def _output(self, i: int, x: torch.Tensor, ctx: ScanContext,
                keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Layer ``i``'s output as the requested map or pooled vector. A reduced sequence is
        given its full grid back first (merged tokens copied to their cells, pruned cells
        their last feature), then normed; the pooled vector is the size-weighted mean of the
        normed tokens (the grid mean when nothing was pruned). ``keep``: the masked training
        forward's (B, L) mask (the pooled vector is then the mean over the kept tokens, as
        inference pools the present ones)."""
        last = i == self.num_layers - 1
        norm = (self.ln1 if self.final_norm else None) if last else \
            getattr(self, f'norm_layer{i}', None)
        if self.out_type == 'avg_featmap':
            x = norm(x) if norm is not None else x
            if keep is not None:
                w = keep.to(x.dtype)
                return (x * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)
            if not ctx.reduced:
                return x.mean(1)
            w = ctx.size.to(x.dtype)
            return (x * w.unsqueeze(-1)).sum(1) / w.sum(1, keepdim=True)
        if ctx.reduced:
            x = restore_grid(ctx, x)
        if norm is not None:
            x = norm(x)
        B, L, C = x.shape
        return x.transpose(1, 2).reshape(B, C, *ctx.grid).contiguous()

    #: PlainMamba's mixer has the masked forward a learned (pruning) reducer trains with
    supports_learned_reduction = True

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        with runtime.pinned():      # the switches read once per forward, not at every call
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        red = self.token_reducer
        if self.runs_per_image(x):
            return self.forward_per_image(x)
        self.check_images(x)
        x, grid = self.patch_embed(x)
        pos = self.pos_embed
        if tuple(grid) != tuple(self.patch_resolution):
            pos = resize_pos_embed(pos, self.patch_resolution, grid, with_cls_token=False)
        x = self.drop_after_pos(x + pos)
        ctx = ScanContext(grid, cls_index=NO_CLS, device=x.device)
        if self.training and red is not None and red.learned:
            return self._forward_masked(x, ctx)
        session = ReductionSession(self.token_reducer, ctx, x, self.num_layers, self.training)
        outs, counts = [], []
        for i, layer in enumerate(self.layers):
            x, _, _ = session.before_block(i, layer, x, None, fused=False)
            counts.append(x.shape[1])
            x = layer(x, session.ctx)
            if i in self.out_indices:
                outs.append(self._output(i, x, session.ctx))
        self.token_counts = counts
        self.last_context = session.ctx if self.token_reducer is not None else None
        if self.token_reducer is not None and self.token_reducer.dynamic:
            self.token_reducer.observe(counts)
        return tuple(outs)

    def _forward_masked(self, x: torch.Tensor, ctx: ScanContext) -> Tuple[torch.Tensor, ...]:
        """The training forward with a learned reducer (see
        :mod:`amvim_mm.models.reduction.learned`): the whole grid throughout, every layer after
        the first decision on the mixer's masked forward; a dropped token keeps the value it
        had when dropped (what the dense restore gives it)."""
        red = self.begin_masked_training(ctx, x, self.num_layers)
        keep, outs = None, []
        for i, layer in enumerate(self.layers):
            new = red.decide(i, x, ctx, layer)
            if new is not None:
                keep = new.keep
            x = layer(x, ctx, keep=keep)
            if i in self.out_indices:
                outs.append(self._output(i, x, ctx, keep))
        self.token_counts = [x.shape[1]] * self.num_layers
        self.last_context, self.keep_mask = ctx, keep
        return tuple(outs)
