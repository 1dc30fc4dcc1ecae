"""VMamba's SS2D mixer: four cross-scan directions of one grid, as rank orders.

The official ``SS2D`` (``forward_type='v05_noz'``, the final VMamba models) computes::

    x = SiLU(dwconv3x3(in_proj(x)))                         (B, E, H, W), no z branch
    xs_k = x in direction k's order                          k: row-major, column-major,
                                                                and both reversed
    dt_k, B_k, C_k = split(x_proj_k(xs_k)); dt_k = dt_projs_k(dt_k)
    y_k = selective_scan(xs_k, dt_k, A_k, B_k, C_k, D_k, delta_bias=dt_projs_bias_k, softplus)
    y = sum_k (y_k back in raster order)                     cross-merge: a SUM, not a mean
    out = out_proj(out_norm(y))

Vanilla VMamba (``'v0'``) adds the gate: ``in_proj`` gives ``2E`` channels, ``z = SiLU(z)``, the
conv has a bias, and ``out = out_proj(out_norm(y) * z)``.

Here the four directions are four :mod:`~amvim_mm.models.layout.scan_orders` (``raster``,
``column``, each reversed), so the mixer runs on any set of present grid cells: the full grid
(the official computation), or the survivors of token reduction inside a stage. The scan of all
four directions is one selective-scan call over ``K * E`` channels with B and C grouped per
direction (``(B, K, N, L)``), as the official code and the mamba-ssm kernel take it. Parameter
names and shapes equal the official checkpoint keys (``x_proj_weight`` (K, R+2N, E),
``dt_projs_weight`` (K, E, R), ``dt_projs_bias`` (K, E), ``A_logs`` (K*E, N), ``Ds`` (K*E)).

Reduced sequences (token reduction, :class:`~amvim_mm.models.layout.scan_context.ScanContext`
with ``full_grid=False``):

* the depthwise 3x3 conv runs on the grid as the dense restore fills it: **decision**: a
  merged token at all of its cells, pruned cells **zero** (the block then equals the full-grid
  block with zero input at those cells, the same convention as the scan's hidden-state
  alignment), :mod:`~amvim_mm.models.layout.grid_conv`. An EViT fused token (no cell) sees no
  neighbours: the centre tap only.
* each direction orders the present tokens by its own rank over the original grid; with ToP's
  alignment the scan runs as if the absent cells were there with zero input (gap folding,
  :func:`~amvim_mm.ops.selective_scan.aligned_selective_scan`), per direction.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.errors import ConfigError
from amvim_mm.ops.cross_scan import DirectionIndex, cross_merge, cross_scan
from amvim_mm.ops.fused_mixer import autocast_dtype
from amvim_mm.ops.selective_scan import aligned_selective_scan, selective_scan_fn
from ..execution import BlockPlan
from ..layout.grid_conv import grid_depthwise_conv, whole_grid
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import is_reverse, masked_path_permutation, scan_rank_on

#: the four cross-scan directions of the official ``CrossScan`` (k = 0..3), as scan orders
SS2D_DIRECTIONS = (dict(order='raster'), dict(order='column'),
                   dict(order='raster', reverse=True), dict(order='column', reverse=True))
#: forward types this module implements (the final models and Vanilla VMamba)
FORWARD_TYPES = ('v05_noz', 'v0')


class SS2D(nn.Module):
    """The 2D selective-scan mixer of VMamba on a (B, L, d) channel-last token sequence.

    Args:
        d_model: stage width d.
        d_state: SSM state size N (1 in the final models, 16 in v0).
        ssm_ratio: E = int(ssm_ratio * d).
        dt_rank: R (``None``: ceil(d / 16), the official "auto").
        d_conv: depthwise conv size (3).
        conv_bias: bias of the depthwise conv (v0: True).
        forward_type: ``'v05_noz'`` (no gate) or ``'v0'`` (SiLU(z) gate).
        scan_backend: selective-scan backend (``None``: automatic, see ``amvim_mm.ops``).
    """

    num_directions = len(SS2D_DIRECTIONS)

    def __init__(self, d_model: int, d_state: int = 1, ssm_ratio: float = 1.0,
                 dt_rank: Optional[int] = None, d_conv: int = 3, conv_bias: bool = False,
                 forward_type: str = 'v05_noz', scan_backend: Optional[str] = None,
                 dt_min: float = 0.001, dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4) -> None:
        super().__init__()
        if forward_type not in FORWARD_TYPES:
            raise ConfigError(f'SS2D: forward_type must be one of {FORWARD_TYPES}, got '
                              f'{forward_type!r}')
        if d_conv < 1 or d_conv % 2 == 0:
            raise ConfigError(f'SS2D: d_conv must be a positive odd int, got {d_conv!r}')
        self.forward_type = forward_type
        self.gated = forward_type == 'v0'
        self.d_model = d_model
        self.d_state = N = d_state
        self.d_inner = E = int(ssm_ratio * d_model)
        self.dt_rank = R = dt_rank if dt_rank is not None else math.ceil(d_model / 16)
        self.scan_backend = scan_backend
        self.dt_init_range = (dt_min, dt_max, dt_init_floor)
        K = self.num_directions
        self.in_proj = nn.Linear(d_model, 2 * E if self.gated else E, bias=False)
        self.conv2d = nn.Conv2d(E, E, d_conv, padding=d_conv // 2, groups=E, bias=conv_bias)
        self.x_proj_weight = nn.Parameter(torch.empty(K, R + 2 * N, E))
        self.dt_projs_weight = nn.Parameter(torch.empty(K, E, R))
        self.dt_projs_bias = nn.Parameter(torch.empty(K, E))
        self.A_logs = nn.Parameter(torch.empty(K * E, N))
        self.Ds = nn.Parameter(torch.empty(K * E))
        self.out_norm = nn.LayerNorm(E)
        self.out_proj = nn.Linear(E, d_model, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The official ``mamba_init`` (v0 scheme): dt weights U(-R^-0.5, R^-0.5), dt bias the
        inverse softplus of a log-uniform step in [dt_min, dt_max], S4D-real ``A_logs``,
        ``Ds = 1``, ``x_proj_weight`` as PyTorch's default ``nn.Linear`` init; the linear
        layers trunc-normal std 0.02 (``VSSM._init_weights``)."""
        K, E, R, N = self.num_directions, self.d_inner, self.dt_rank, self.d_state
        dt_min, dt_max, floor = self.dt_init_range
        with torch.no_grad():
            bound = 1 / math.sqrt(E)
            self.x_proj_weight.uniform_(-bound, bound)
            self.dt_projs_weight.uniform_(-R**-0.5, R**-0.5)
            dt = torch.exp(torch.rand(K, E) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min)).clamp(min=floor)
            self.dt_projs_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.A_logs.copy_(torch.log(torch.arange(1, N + 1, dtype=torch.float32))
                              .repeat(K * E, 1))
            self.Ds.fill_(1.0)
        for lin in (self.in_proj, self.out_proj):
            nn.init.trunc_normal_(lin.weight, std=.02)
        self.conv2d.reset_parameters()
        self.out_norm.reset_parameters()

    # ------------------------------------------------------------------ pieces
    def flops(self, L: int, official: bool) -> int:
        """FLOPs of this mixer on ``L`` tokens (:mod:`amvim_mm.analysis.vmamba_flops`):
        in_proj, the depthwise conv, x_proj / dt_projs per direction, the scan (``official``:
        fvcore's handle ``9 * L * (K * E) * N + L * (K * E)``, else ``9 * L * E * N`` per
        direction), the out norm (``official``: 5 per element) and out_proj."""
        d, E, N, R, K = self.d_model, self.d_inner, self.d_state, self.dt_rank, \
            self.num_directions
        k2 = self.conv2d.kernel_size[0] * self.conv2d.kernel_size[1]
        ln = 5 if official else 0
        f = L * d * self.in_proj.out_features + L * E * k2                # in_proj, dw conv
        f += K * L * E * (R + 2 * N) + K * L * R * E                      # x_proj, dt_projs
        f += (9 * L * K * E * N + L * K * E) if official else K * 9 * L * E * N
        return f + ln * L * E + L * E * d                                 # out_norm, out_proj

    def grid_conv(self, x: torch.Tensor, ctx: ScanContext) -> torch.Tensor:
        """Depthwise conv + SiLU of (B, L, E) tokens on their grid cells -> (B, L, E)
        (absent cells hold zero, :mod:`~amvim_mm.models.layout.grid_conv`)."""
        return F.silu(grid_depthwise_conv(x, ctx, self.conv2d))

    def project(self, xs: torch.Tensor):
        """Per-direction projections of (B, K, E, L) sequences -> (u, delta) (B, K*E, L) and
        grouped B, C (B, K, N, L), all in the sequences' dtype (the kernel's contract)."""
        B, K, E, L = xs.shape
        N, R = self.d_state, self.dt_rank
        # batched over (B, K) with the weights broadcast over B: no copy of the sequences
        x_dbl = torch.matmul(self.x_proj_weight.to(xs.dtype), xs)           # (B, K, R+2N, L)
        dts, Bs, Cs = torch.split(x_dbl, [R, N, N], dim=2)
        dts = torch.matmul(self.dt_projs_weight.to(dts.dtype), dts)         # (B, K, E, L)
        return (xs.reshape(B, K * E, L), dts.reshape(B, K * E, L), Bs.contiguous(),
                Cs.contiguous())

    def ssm_params(self, dtype: torch.dtype):
        """A = -exp(A_logs), D and the step bias in ``dtype`` (fp32, or fp64 for fp64)."""
        return (-torch.exp(self.A_logs.to(dtype)), self.Ds.to(dtype),
                self.dt_projs_bias.to(dtype).reshape(-1))

    def direction_index(self, ctx: ScanContext, paths: Sequence) -> Optional[DirectionIndex]:
        """The directions' token orders of the present sequence: None for the full grid in
        the official directions (computed in the kernels), else a
        :class:`~amvim_mm.ops.cross_scan.DirectionIndex` (cached on the context)."""
        if whole_grid(ctx) and paths is SS2D_DIRECTIONS:
            return None
        return ctx.direction_index(paths)

    def directions(self, x: torch.Tensor, ctx: ScanContext, paths: Sequence = SS2D_DIRECTIONS,
                   index: Optional[DirectionIndex] = None, kernels: Optional[bool] = None
                   ) -> Tuple[torch.Tensor, Optional[DirectionIndex]]:
        """Cross-scan, per-direction projections and one grouped selective scan of the
        (B, L, E) conv output -> the outputs in path order (B, K, E, L) and the directions'
        index (None: the full grid).

        Without alignment the scan gets the sequences in the compute dtype (bf16 under
        autocast, as the official code and the mamba-ssm kernel take them) and accumulates in
        fp32. With ToP's alignment (``ctx.align``) each direction scans its present tokens as
        if the absent cells were there with zero input (gap folding, in fp32).
        """
        B, L, E = x.shape
        K = self.num_directions
        H, W = ctx.grid
        if index is None:     # else: the masked training forward's per-sample orders
            index = self.direction_index(ctx, paths)
        xs = cross_scan(x, H, W, index, kernels)                            # (B, K, E, L)
        u, delta, Bs, Cs = self.project(xs)
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        A, D, bias = self.ssm_params(ct)
        gaps = [ctx.path_gaps(p) for p in paths]
        if gaps[0] is None:
            y = selective_scan_fn(u, delta, A, Bs, Cs, D, None, delta_bias=bias,
                                  delta_softplus=True, backend=self.scan_backend)
        else:
            u, delta, Bs, Cs = u.to(ct), delta.to(ct), Bs.to(ct), Cs.to(ct)
            if ctx.align == 'bias':
                step = F.softplus(bias).view(1, K, E, 1)
            else:   # the next kept token's own step size
                step = F.softplus(delta + bias[None, :, None]).view(B, K, E, L)
            g = torch.stack(gaps, 1).to(ct).unsqueeze(2)                    # (B, K, 1, L)
            y = aligned_selective_scan(u, delta, A, Bs, Cs, D, None, delta_bias=bias,
                                       gap_delta=(g * step).reshape(B, K * E, L),
                                       backend=self.scan_backend)
        return y.view(B, K, E, L), index

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, ctx: ScanContext,
                paths: Sequence = SS2D_DIRECTIONS, keep: Optional[torch.Tensor] = None,
                route: Optional[BlockPlan] = None) -> torch.Tensor:
        """(B, L, d) tokens of the grid cells in ``ctx`` -> (B, L, d).

        ``route``: the block's routes in the forward's execution plan (its ``cross_scan``:
        the Triton cross-scan / cross-merge or PyTorch); None: the op decides for the call.

        ``keep``: a learned reducer's (B, L) keep mask on the whole grid (its training):
        the conv sees the dropped cells as zero (what the reduced grid's conv gives them),
        every direction scans each sample's kept tokens first in its own order
        (:func:`~amvim_mm.models.layout.scan_orders.masked_path_permutation`), the dropped
        tokens' outputs are zero: equal, at the kept tokens, to the pruned sequence."""
        if len(paths) != self.num_directions:
            raise ConfigError(f'SS2D has {self.num_directions} directions, got {len(paths)} '
                              'scan orders')
        x = self.in_proj(x)
        z = None
        if self.gated:
            x, z = x.chunk(2, dim=-1)
            z = F.silu(z)
        index = None
        if keep is not None:
            if not whole_grid(ctx):
                raise ConfigError('a keep mask takes the whole grid')
            kf = keep.to(x.dtype).unsqueeze(-1)
            x = self.grid_conv(x * kf, ctx) * kf
            H, W = ctx.grid
            pos = torch.arange(H * W, device=x.device)
            index = DirectionIndex.from_perm(torch.stack([masked_path_permutation(
                scan_rank_on(H, W, p, x.device), pos, keep > 0.5, -1, is_reverse(p))
                for p in paths]))
        else:
            x = self.grid_conv(x, ctx)
        kernels = None if route is None else route.uses('cross_scan')
        ys, index = self.directions(x, ctx, paths, index, kernels)          # (B, K, E, L)
        if ctx.want_importance:
            # ToP importance: sum over directions and channels of max(0, y), per token (the
            # directions' channel sums merged back to token order by the PyTorch ops)
            r = ys.float().clamp_min(0).sum(2, keepdim=True)                # (B, K, 1, L)
            ctx.importance = cross_merge(r, *ctx.grid, index, kernels=False)[..., 0].detach()
        y = cross_merge(ys, *ctx.grid, index, kernels)                      # (B, L, E) sum
        if autocast_dtype(y.device.type) is None:  # fp32 scan output, a 16-bit model's norm
            y = y.to(self.out_norm.weight.dtype)
        y = self.out_norm(y)
        if z is not None:
            y = y * z
        y = self.out_proj(y)
        return y if keep is None else y * keep.to(y.dtype).unsqueeze(-1)
