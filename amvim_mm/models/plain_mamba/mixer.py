"""PlainMamba's mixer (``PlainMamba2D``) on (B, L, C) raster tokens of a grid.

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
* CUDA inference runs the four scans and their sum as one Triton kernel
  (:func:`~amvim_mm.ops.plain_scan.snake_scan`, chosen by
  :func:`~amvim_mm.ops.plain_scan.use_snake_scan`): the same quirks, pairings and aligned gaps;
  the cross-scan, the grouped selective scan and the cross-merge below stay the reference.
* dense outputs get the full grid back before their norm (merged tokens copied to their cells,
  pruned cells keep their last feature); ``avg_featmap`` is the size-weighted token mean.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from amvim_mm.ops.cross_scan import cross_merge, cross_scan
from amvim_mm.ops.plain_aligned import (aligned_inputs_torch, aligned_scan, at_steps,
                                        snake_gap_tables, step_lookup, use_kernels)
from amvim_mm.ops.plain_scan import snake_scan, use_snake_scan
from amvim_mm.ops.selective_scan import aligned_selective_scan, selective_scan_fn
from ..execution import TRITON, BlockPlan
from ..layout.grid_conv import grid_depthwise_conv, whole_grid
from ..layout.scan_context import ScanContext
from ..layout.scan_orders import masked_path_permutation
from .scan import (SNAKE_DIRECTIONS, SNAKE_KEYS, displacement_codes, snake_cell_tables,
                   snake_directions)

#: how the steps of a reduced sequence get their direction codes (see :class:`PlainMamba2D`)
REDUCED_DIRECTION_CODES = ('positional', 'displacement')


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

    def flops(self, L: int, official: bool) -> int:
        """FLOPs on ``L`` tokens (:mod:`amvim_mm.analysis.plainmamba_flops`): in_proj, the
        depthwise conv, x_proj, dt_proj, out_proj and per direction the scan (``official``:
        ``9 * L * E * N + L * E``, else ``9 * L * E * N``)."""
        C, E, N, R = self.d_model, self.d_inner, self.d_state, self.dt_rank
        k2 = self.conv2d.kernel_size[0] * self.conv2d.kernel_size[1]
        f = L * C * 2 * E + L * E * k2                                 # in_proj, dw conv
        f += L * E * (R + 2 * N) + L * R * E + L * E * C               # x_proj, dt_proj, out
        return f + self.num_directions * (9 * L * E * N + (L * E if official else 0))

    def forward(self, x: torch.Tensor, ctx: ScanContext, route: Optional[BlockPlan] = None
                ) -> torch.Tensor:
        """(B, L, C) tokens of the grid cells in ``ctx`` (the whole grid, or the survivors of
        a token reduction) -> (B, L, C). ``route``: the layer's routes in the forward's
        execution plan (:func:`~amvim_mm.models.execution.plan_plain_mamba`: the snake-scan
        kernel as ``mixer``, ``cross_scan`` and ``aligned_inputs``); None: each op decides
        for the call."""
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
            index = ctx.direction_index(SNAKE_KEYS)
            pos = ctx.pos if ctx.pos.dim() == 2 else ctx.pos.expand(B, -1)
            cell = torch.where(pos >= 0, pos, torch.full_like(pos, H * W))  # no cell -> H*W
            # (B, K, L): the cell each direction visits at each of its steps
            index_cells = torch.gather(cell.unsqueeze(0).expand(K, -1, -1), 2,
                                       index.perm).permute(1, 0, 2)
        aligned = index_cells is not None and ctx.align is not None and ctx.reduced
        if aligned and ctx.has_fused:
            raise ConfigError('PlainMamba: hidden-state alignment with a fused token (EViT) '
                              'is not defined')
        snake = use_snake_scan(x, E, self.d_state, self.scan_backend, self.parameters()) \
            if route is None else route.mixer.route == TRITON
        cross = None if route is None else route.uses('cross_scan')
        if snake:
            y = self._snake_scan(xc, x_dbl, ctx, index, codes if index_cells is None else None,
                                 index_cells, cell if aligned else None)
        else:
            xs = cross_scan(xc, H, W, index, cross)     # only u goes into each order (Q1)
            ct = torch.float64 if xs.dtype == torch.float64 else torch.float32
            A = -torch.exp(self.A_log.to(ct)).repeat(K, 1)
            bias = self.dt_proj.bias.to(ct).repeat(K)
            if aligned:
                y = self._aligned_scan(xs, x_dbl, cell, index_cells, ctx, A, bias,
                                       None if route is None else route.uses('aligned_inputs'))
            else:
                y = self._scan(xs, x_dbl, codes if index_cells is None
                               else self._reduced_codes(index_cells, H, W), A, bias)
            y = cross_merge(y.view(B, K, E, L), H, W, index, cross)         # (B, L, E) sum
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
        D = self.D.to(ct).repeat(K)
        if runtime.exporting():
            return _folded(selective_scan_fn, K, xs.reshape(B, K * E, L), delta.to(dtype), A,
                           Bk.to(dtype), Ck.to(dtype), D, delta_bias=bias,
                           delta_softplus=True, backend=self.scan_backend)
        return selective_scan_fn(xs.reshape(B, K * E, L), delta.to(dtype), A,
                                 Bk.to(dtype).contiguous(), Ck.to(dtype).contiguous(),
                                 D, None, delta_bias=bias,                       # again (Q2)
                                 delta_softplus=True, backend=self.scan_backend)

    def _snake_scan(self, xc: torch.Tensor, x_dbl: torch.Tensor, ctx: ScanContext, index,
                    codes: Optional[torch.Tensor], index_cells: Optional[torch.Tensor],
                    cell: Optional[torch.Tensor]) -> torch.Tensor:
        """:meth:`_scan` / :meth:`_aligned_scan` and the cross-merge as one Triton kernel
        (:func:`~amvim_mm.ops.plain_scan.snake_scan`): (B, L, E) fp32. ``codes`` (K, L) on the
        whole grid; else ``index_cells`` (B, K, L) the visited cells and, with ToP's
        alignment, ``cell`` (B, L) the survivors' raster cells."""
        H, W = ctx.grid
        dt = self.dt_proj(x_dbl[..., :self.dt_rank])              # first application of the bias
        q = steps = below = None
        if cell is not None:
            B = xc.shape[0]
            steps_tab, cell_codes = snake_cell_tables(H, W, xc.device)
            steps = torch.gather(steps_tab.unsqueeze(0).expand(B, -1, -1), 2, index_cells)
            codes = torch.gather(cell_codes.unsqueeze(0).expand(B, -1, -1), 2, index_cells)
            q, below = snake_gap_tables(cell.contiguous(), steps, H * W,
                                        below=ctx.align == 'bias')
        elif codes is None:
            codes = self._reduced_codes(index_cells, H, W)
        return snake_scan(xc, dt, x_dbl, index.perm, codes, self.direction_Bs,
                          -torch.exp(self.A_log.float()), self.dt_proj.bias, self.D,
                          self.dt_rank, q=q, steps=steps, below=below,
                          align=ctx.align if cell is not None else None)

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
                      bias: torch.Tensor, kernel: Optional[bool] = None) -> torch.Tensor:
        """ToP's hidden-state alignment: each direction scans the survivors as the full-length
        official scan with zero input at the absent cells would, read at the survivors.

        In that pass step ``t`` of a direction takes u of the cell the direction visits there
        and delta, B, C of raster cell ``t`` (Q1); an absent cell has ``xc = 0``, so its
        ``dt = dt_proj(0)`` is the bias (delta ``softplus(2 b)``), its B the direction bias
        and its C zero. A survivor visited at full-grid step ``s`` therefore takes delta, B, C
        of raster cell ``s`` (a survivor's, or an absent cell's), and the absent steps between
        two survivors (u = 0) fold into its step size (``ctx.align``: ``'bias'`` their own step
        sizes, ``'token'`` the survivor's for each; :mod:`amvim_mm.ops.plain_aligned`). Nothing
        full-length is formed. The folded inputs come from one Triton kernel where
        :func:`~amvim_mm.ops.plain_aligned.use_kernels` says so (CUDA), else from PyTorch ops
        (:func:`~amvim_mm.ops.plain_aligned.aligned_inputs_torch`).
        """
        B, K, E, L = xs.shape
        N, R = self.d_state, self.dt_rank
        H, W = ctx.grid
        ct = A.dtype
        steps_tab, cell_codes = snake_cell_tables(H, W, xs.device)
        steps = torch.gather(steps_tab.unsqueeze(0).expand(B, -1, -1), 2, index_cells)
        codes = torch.gather(cell_codes.unsqueeze(0).expand(B, -1, -1), 2, index_cells)
        pos = cell.contiguous()                                   # (B, L) raster-ascending
        idx, here = step_lookup(pos, steps, H * W)   # the survivor at raster cell s of step s
        dt_low, Bm, Cm = torch.split(x_dbl, [R, N, N], dim=-1)
        dt = self.dt_proj(dt_low).to(ct)                          # (B, L, E), one bias
        Bk = (at_steps(Bm.to(ct), idx, here, 0.0)
              + self.direction_Bs.to(ct)[codes].transpose(-1, -2))          # (B, K, N, L)
        Ck = at_steps(Cm.to(ct), idx, here, 0.0)
        D = self.D.to(ct).repeat(K)
        if use_kernels(xs, dt) if kernel is None else kernel:
            return aligned_scan(xs, dt, bias, steps, pos, H * W, A, Bk, Ck, D, ctx.align,
                                backend=self.scan_backend)
        delta, gap = aligned_inputs_torch(dt, bias, steps, pos, idx, here, ctx.align, H * W)
        if runtime.exporting():
            return _folded(aligned_selective_scan, K, xs.reshape(B, K * E, L), delta, A, Bk,
                           Ck, D, delta_bias=bias, gap_delta=gap, backend=self.scan_backend)
        return aligned_selective_scan(xs.reshape(B, K * E, L), delta, A, Bk, Ck, D, None,
                                      delta_bias=bias, gap_delta=gap,
                                      backend=self.scan_backend)


def _folded(scan, K: int, u, delta, A, Bk, Ck, D, **kw) -> torch.Tensor:
    """``scan`` (a selective scan) of the K directions with the directions folded into the
    batch: (B, K*E, L) -> (B*K, E, L), B / C (B, K, N, L) -> (B*K, N, L), A, D and the step
    biases one direction's (the four directions share them: ``repeat(K)``). The same scan as
    the grouped call, without B and C copied out to every channel (the export route: an ONNX
    graph of the grouped form spends most of its time transposing those copies)."""
    B, KE, L = u.shape
    E = KE // K
    fold = {k: (v.reshape(B * K, E, L) if k == 'gap_delta' else v[:E])
            for k, v in kw.items() if isinstance(v, torch.Tensor)}
    y = scan(u.reshape(B * K, E, L), delta.reshape(B * K, E, L), A[:E],
             Bk.reshape(B * K, -1, L), Ck.reshape(B * K, -1, L), D[:E], None,
             **dict(kw, **fold))
    return y.reshape(B, KE, L)
