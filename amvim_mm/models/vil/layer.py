"""The blocks of Vision-LSTM (ViL, Alkin et al., ICLR 2025): the mLSTM layer, the pre-norm
block and v2's block pair, with the official module and parameter names (a released file loads
1:1).

One layer on normed tokens ``x`` (D channels, inner width E = 2D, 4 cell heads)::

    u, z = proj_up(x).chunk(2)                 E each
    c    = silu(conv(u))                       v2: depthwise conv2d k3 on the patch grid
                                               v1: causal depthwise conv1d k4 along the path
    q, k = q_proj(c), k_proj(c); v = v_proj(u) headwise 4 x 4 blocks
    h    = outnorm(mLSTM(q, k, v))              in the traversal's order (the scan order)
    out  = proj_down((h + learnable_skip * c) * silu(z))

**Traversals are scan orders.** The official layer of direction 'bottom right' flips the
sequence on entry and back on exit. Here each block carries a scan-order dict (``path``,
:mod:`amvim_mm.models.layout.scan_orders`): ``dict(order='raster')`` (from the top left) and
``dict(order='raster', reverse=True)`` (from the bottom right, exactly the flip); the sequence
moves into that order and back through :meth:`ScanContext.path_index`, so a reduced (shorter,
per-sample) sequence and any other order (AMViL's windows) run the same code.

**v2's conv on the grid.** The official flipped sub-block reshapes its *flipped* sequence into
an h x w grid: that is the true grid rotated by 180 degrees, and a convolution of the rotated
grid with kernel K equals (rotated back) the convolution of the true grid with K rotated by 180
degrees. So the conv runs on the patch grid in token order (``grid_depthwise_conv``: absent
cells of a reduced sequence are zero), with the kernel rotated in the sub-block at the flipped
position (``rotate_kernel``), whatever that sub-block's scan order is. v1's causal conv1d runs
along the path's order (the present tokens of a reduced sequence).

**Token importance** (ToP, EViT): the ViL analogue of the clipped SSM output is the clipped mLSTM
cell output (after its output norm, before the skip and the gate), summed over channels and
over the block's traversals (v2: both sub-blocks), in token order.

**Masked training forward** (a learned pruning reducer's ``keep``): a dropped token enters the
conv as zero (the absent cell of inference), and the mLSTM skips it exactly: its input gate is
-1e4 (no write) and its forget gate +1e4 (``logsigmoid`` 0: no decay), so a kept token's cell
output equals that of the sequence without the dropped tokens; a dropped token keeps its stream.
"""
from __future__ import annotations

import math
import types
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from amvim_mm.ops.mlstm import mlstm
from ..layout.grid_conv import grid_depthwise_conv
from ..layout.scan_context import ScanContext
from ..execution import CPU, TRITON, BlockPlan, PlannedBlock
from ..layout.scan_orders import normalize_order
from ..skeleton.drop import DropPath

__all__ = ['ResidualLayerNorm', 'MultiHeadLayerNorm', 'HeadwiseLinear', 'MatrixLSTMCell',
           'CausalConv1d', 'ViLLayer', 'ViLBlock', 'ViLBlockPair']

#: gate pre-activations of a masked-out token: no write (exp(-1e4) = 0), no decay
MASKED_IGATE, MASKED_FGATE = -1e4, 1e4


class ResidualLayerNorm(nn.Module):
    """The official ``LayerNorm``: the weight is stored as an offset from 1 (``1 + weight``),
    the bias is optional (absent from the state dict when off)."""

    def __init__(self, dim: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim, ), 1 + self.weight, self.bias, self.eps)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class MultiHeadLayerNorm(ResidualLayerNorm):
    """The cell's output norm: a LayerNorm per head (a group norm with one group per head)
    on (B, S, NH * DH) channel-last tokens."""

    def __init__(self, dim: int, num_heads: int, bias: bool = True) -> None:
        super().__init__(dim, bias)
        self.num_heads = num_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.dim)
        out = F.group_norm(flat, self.num_heads, 1 + self.weight, self.bias, self.eps)
        return out.view_as(x)


class HeadwiseLinear(nn.Module):
    """The official ``LinearHeadwiseExpand``: a block-diagonal linear map, ``weight``
    (blocks, out, in) acting on consecutive channel blocks, optional bias."""

    def __init__(self, dim: int, num_blocks: int, bias: bool) -> None:
        super().__init__()
        d = dim // num_blocks
        self.num_blocks = num_blocks
        self.weight = nn.Parameter(torch.empty(num_blocks, d, d))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(*shape[:-1], self.num_blocks, -1)
        x = torch.einsum('...hi,hoi->...ho', x, self.weight).reshape(shape)
        return x if self.bias is None else x + self.bias


class CausalConv1d(nn.Module):
    """Causal depthwise conv1d over (B, S, C) tokens (official name: ``conv1d.conv``)."""

    def __init__(self, dim: int, kernel_size: int, bias: bool = True) -> None:
        super().__init__()
        self.pad = kernel_size - 1
        self.conv = nn.Conv1d(dim, dim, kernel_size, padding=self.pad, groups=dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.transpose(1, 2))
        return (y[..., :-self.pad] if self.pad else y).transpose(1, 2)


class MatrixLSTMCell(nn.Module):
    """Gates from ``[q, k, v]`` (linear 3E -> heads, bias), the mLSTM (``amvim_mm.ops.mlstm``)
    per head, and the output norm per head."""

    def __init__(self, dim: int, num_heads: int, norm_bias: bool) -> None:
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.igate = nn.Linear(3 * dim, num_heads)
        self.fgate = nn.Linear(3 * dim, num_heads)
        self.outnorm = MultiHeadLayerNorm(dim, num_heads, bias=norm_bias)

    def forward(self, qkv: torch.Tensor, keep: Optional[torch.Tensor] = None,
                kernel: Optional[str] = None) -> torch.Tensor:
        """(B, S, 3E) ``[q, k, v]`` in the traversal's order -> (B, S, E) normed cell output;
        ``keep`` (B, S) bool: tokens the cell sees (the others are skipped exactly);
        ``kernel``: the plan's route (``'triton'``: the fused kernel, ``'cpu'``: the compiled
        CPU cell, ``'torch'``: the PyTorch forms; None: the op decides)."""
        B, S, _ = qkv.shape
        ig = self.igate(qkv).transpose(1, 2).unsqueeze(-1)         # (B, NH, S, 1)
        fg = self.fgate(qkv).transpose(1, 2).unsqueeze(-1)
        if keep is not None:
            k4 = keep[:, None, :, None]
            ig = torch.where(k4, ig, ig.new_tensor(MASKED_IGATE))
            fg = torch.where(k4, fg, fg.new_tensor(MASKED_FGATE))
        heads = qkv.view(B, S, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        h = mlstm(heads[0], heads[1], heads[2], ig, fg,                 # (B, NH, S, DH)
                  kernel=None if kernel is None else kernel == TRITON,
                  cpu=None if kernel is None else kernel == CPU)
        return self.outnorm(h.transpose(1, 2).reshape(B, S, self.dim))

    def reset_parameters(self) -> None:
        self.outnorm.reset_parameters()
        nn.init.zeros_(self.fgate.weight)
        with torch.no_grad():
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, self.num_heads))
        nn.init.zeros_(self.igate.weight)
        nn.init.normal_(self.igate.bias, mean=0.0, std=0.1)


class ViLLayer(nn.Module):
    """The official ``ViLLayer`` (module docstring). ``conv_kind`` ``'2d'`` (v2: ``conv``, a
    depthwise Conv2d) or ``'causal1d'`` (v1: ``conv1d.conv``)."""

    def __init__(self, dim: int, conv_kind: str, conv_kernel_size: int, proj_bias: bool,
                 norm_bias: bool, expansion: int = 2, qkv_block_size: int = 4,
                 conv_bias: bool = True) -> None:
        super().__init__()
        E = expansion * dim
        self.dim, self.inner_dim, self.conv_kind = dim, E, conv_kind
        self.proj_up = nn.Linear(dim, 2 * E, bias=proj_bias)
        self.q_proj = HeadwiseLinear(E, E // qkv_block_size, proj_bias)
        self.k_proj = HeadwiseLinear(E, E // qkv_block_size, proj_bias)
        self.v_proj = HeadwiseLinear(E, E // qkv_block_size, proj_bias)
        if conv_kind == '2d':
            self.conv = nn.Conv2d(E, E, conv_kernel_size, padding=conv_kernel_size // 2,
                                  groups=E, bias=conv_bias)
        else:
            self.conv1d = CausalConv1d(E, conv_kernel_size, bias=conv_bias)
        # the official cell has qkv_block_size heads
        self.mlstm_cell = MatrixLSTMCell(E, qkv_block_size, norm_bias)
        self.learnable_skip = nn.Parameter(torch.ones(E))
        self.proj_down = nn.Linear(E, dim, bias=proj_bias)

    def reset_parameters(self) -> None:
        """The official initialisation (``init_weights='original'``)."""
        small = math.sqrt(2 / (5 * self.dim))
        nn.init.normal_(self.proj_up.weight, std=small)
        nn.init.normal_(self.proj_down.weight, std=2 / math.sqrt(self.dim))
        for lin in (self.proj_up, self.proj_down):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        nn.init.ones_(self.learnable_skip)
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, std=small)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        conv = self.conv if self.conv_kind == '2d' else self.conv1d.conv
        conv.reset_parameters()
        self.mlstm_cell.reset_parameters()

    def _grid_conv(self, u: torch.Tensor, ctx: ScanContext, rotate: bool) -> torch.Tensor:
        conv = self.conv
        if rotate:   # the flipped sub-block: the kernel rotated by 180 degrees
            conv = types.SimpleNamespace(weight=conv.weight.flip(-1, -2), bias=conv.bias,
                                         padding=conv.padding, groups=conv.groups,
                                         kernel_size=conv.kernel_size)
        return grid_depthwise_conv(u, ctx, conv)

    def forward(self, x: torch.Tensor, ctx: ScanContext, path, rotate: bool = False,
                keep: Optional[torch.Tensor] = None, importance: bool = False,
                kernel: Optional[str] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(B, L, D) normed tokens in token order -> (output (B, L, D), the (B, L) importance
        when asked for); ``path``: the traversal's scan order (a dict or its normalised key);
        ``rotate``: the conv2d's kernel rotated (the flipped sub-block); ``keep``: the masked
        training forward's (B, L) mask; ``kernel``: the mLSTM's route in the plan (None: the
        op decides)."""
        idx = ctx.path_index(path)
        seq = self.conv_kind != '2d'       # v1: the whole layer in the path's order
        keep_p = None if keep is None else idx.to_path(keep.unsqueeze(-1)).squeeze(-1).bool()
        if seq:
            x = idx.to_path(x)
        u, z = self.proj_up(x).chunk(2, dim=-1)
        uc = u
        if keep is not None:     # a dropped token enters the conv as an absent cell (zero)
            uc = u * (keep_p if seq else keep.bool()).unsqueeze(-1).to(u.dtype)
        c = F.silu(self.conv1d(uc) if seq else self._grid_conv(uc, ctx, rotate))
        qkv = torch.cat([self.q_proj(c), self.k_proj(c), self.v_proj(u)], dim=-1)
        h = self.mlstm_cell(qkv if seq else idx.to_path(qkv), keep_p, kernel)
        if not seq:
            h = idx.to_tokens(h)
        imp = h.float().clamp_min(0).sum(-1).detach() if importance else None
        y = self.proj_down((h + self.learnable_skip * c) * F.silu(z))
        if seq:
            y = idx.to_tokens(y)
            imp = None if imp is None else idx.to_tokens(imp.unsqueeze(-1)).squeeze(-1)
        return y, imp

    def flops(self, L: int) -> int:
        """MACs on ``L`` tokens: the projections, the conv, the gates and the mLSTM's parallel
        form (QK^T and CV: 2 L^2 E; the gate matrix's element-wise work not counted)."""
        D, E = self.dim, self.inner_dim
        conv = self.conv if self.conv_kind == '2d' else self.conv1d.conv
        f = L * D * 2 * E + L * E * conv.weight[0].numel()
        f += 3 * L * E * self.q_proj.weight.shape[-1] + 2 * L * 3 * E * self.mlstm_cell.num_heads
        return f + 2 * L * L * E + L * E * D


def _kernel(route: Optional[BlockPlan]) -> Optional[str]:
    """The mLSTM's route in a block's plan (None without a plan: the op decides)."""
    return None if route is None else route.mixer.route


class ViLBlock(PlannedBlock, nn.Module):
    """``x + drop_path(layer(norm(x)))`` with the traversal ``path`` (a scan-order dict) and
    v2's kernel rotation (``rotate_kernel``: the sub-block at the flipped position)."""

    def __init__(self, dim: int, path: dict, rotate_kernel: bool, drop_path: float,
                 norm_bias: bool, **layer_kwargs) -> None:
        super().__init__()
        self.path, self.rotate_kernel = dict(path), rotate_kernel
        self.path_key = normalize_order(self.path)     # validated once
        self.norm = ResidualLayerNorm(dim, bias=norm_bias)
        self.layer = ViLLayer(dim, norm_bias=norm_bias, **layer_kwargs)
        self.drop_path = DropPath(drop_path)

    def merge_metric(self, x: torch.Tensor) -> torch.Tensor:
        """ToMe's similarity features of this block's input: its normalised input."""
        return self.norm(x)

    def mix(self, x: torch.Tensor, ctx: ScanContext, keep: Optional[torch.Tensor] = None,
            importance: bool = False, kernel: Optional[str] = None
            ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """-> (the block's output, the importance when asked for); ``kernel``: the mLSTM's
        route in the forward's plan (None: the op decides)."""
        y, imp = self.layer(self.norm(x), ctx, self.path_key, self.rotate_kernel, keep,
                            importance, kernel)
        if keep is None:
            return x + (self.drop_path(y) if self.training else y), imp
        return torch.where(keep.bool().unsqueeze(-1), x + self.drop_path(y), x), imp

    def forward(self, x: torch.Tensor, ctx: ScanContext, keep: Optional[torch.Tensor] = None,
                route: Optional[BlockPlan] = None) -> torch.Tensor:
        """``route``: this block's part of the forward's execution plan (None: the ops
        decide for the call)."""
        x, imp = self.mix(x, ctx, keep, ctx.want_importance, _kernel(route))
        if imp is not None:
            ctx.importance = imp
        return x

    def flops(self, L: int) -> int:
        return self.layer.flops(L)


class ViLBlockPair(PlannedBlock, nn.Module):
    """v2's block: ``rowwise_from_top_left`` then ``rowwise_from_bot_right`` (official names;
    each a :class:`ViLBlock` with its own path). ``norm`` / ``merge_metric``: the first
    sub-block's (the pair's input norm, ToMe's metric)."""

    def __init__(self, first: ViLBlock, second: ViLBlock) -> None:
        super().__init__()
        self.rowwise_from_top_left = first
        self.rowwise_from_bot_right = second

    @property
    def norm(self) -> nn.Module:
        return self.rowwise_from_top_left.norm

    def merge_metric(self, x: torch.Tensor) -> torch.Tensor:
        return self.rowwise_from_top_left.merge_metric(x)

    def forward(self, x: torch.Tensor, ctx: ScanContext, keep: Optional[torch.Tensor] = None,
                route: Optional[BlockPlan] = None) -> torch.Tensor:
        """``route``: the pair's part of the forward's execution plan (both traversals take
        it; None: the ops decide for the call)."""
        want, kernel = ctx.want_importance, _kernel(route)
        x, imp0 = self.rowwise_from_top_left.mix(x, ctx, keep, want, kernel)
        x, imp1 = self.rowwise_from_bot_right.mix(x, ctx, keep, want, kernel)
        if want:
            ctx.importance = imp0 + imp1
        return x

    def flops(self, L: int) -> int:
        return self.rowwise_from_top_left.flops(L) + self.rowwise_from_bot_right.flops(L)
