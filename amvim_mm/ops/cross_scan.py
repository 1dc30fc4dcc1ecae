"""VMamba's cross-scan and cross-merge: one pass each on CUDA.

:func:`cross_scan` turns the (B, L, E) channel-last tokens of an H x W grid (raster order) into
the four directions' sequences (B, 4, E, L): row-major, column-major, and both reversed (the
official ``CrossScan``). :func:`cross_merge` maps four such sequences back to raster order and
sums them into (B, L, E) channel-last (the official ``CrossMerge``; fp32 accumulation). Each is
the other's adjoint, so each one's backward is the other.

A reduced sequence (token reduction: any present tokens, per-sample) passes its directions as
a :class:`DirectionIndex`: ``perm[k, b, p]`` the token at position ``p`` of direction ``k`` and
``inv`` its inverse (B may be 1: shared by the batch).

On CUDA tensors both are Triton kernels (:mod:`._cross_scan_kernels`) that read every element
once and write it once per direction (a gather-and-stack in PyTorch ops makes several passes
and copies); elsewhere, and as the reference the kernels are tested against,
:func:`cross_scan_ref` / :func:`cross_merge_ref` (index gathers). ``TRITON_INTERPRET=1`` runs
the kernels on CPU tensors (tests). While a model is exported (:func:`exporting`) the PyTorch
ops run, the full grid's by transposes and flips (:func:`cross_scan_grid`,
:func:`cross_merge_grid`: no index constant in the graph).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from .triton_loader import jit_kernels

K = 4
BLOCK_L, BLOCK_E = 64, 32


class DirectionIndex(NamedTuple):
    """The four directions of a reduced sequence: ``perm`` (4, B or 1, L) long, the token at
    each path position, and ``inv`` (4, B or 1, L) int32, the path position of each token."""

    perm: Tensor
    inv: Tensor

    @classmethod
    def from_perm(cls, perm: Tensor) -> 'DirectionIndex':
        perm = perm.long()
        inv = torch.empty_like(perm)
        ar = torch.arange(perm.shape[-1], device=perm.device).expand_as(perm)
        inv.scatter_(2, perm, ar)
        return cls(perm, inv.to(torch.int32).contiguous())


@functools.lru_cache(maxsize=64)
def direction_indices(H: int, W: int, device) -> Tensor:
    """(4, L) long: the raster token at each path position of each direction."""
    L = H * W
    col = torch.arange(L).view(H, W).t().reshape(-1)            # column-major: token w*H+h
    raster = torch.arange(L)
    return torch.stack([raster, col, raster.flip(0), col.flip(0)]).to(device)


@functools.lru_cache(maxsize=64)
def _inverse_indices(H: int, W: int, device) -> Tensor:
    """(4, L) long: the path position of each raster token in each direction."""
    return torch.argsort(direction_indices(H, W, device), dim=1)


def cross_scan_grid(x: Tensor, H: int, W: int) -> Tensor:
    """:func:`cross_scan_ref` of the full grid by transposes and flips (the official
    ``CrossScan``), no index tensor: the export route (a slice with step -1 in ONNX in place of
    a gather through a constant index)."""
    B, L, E = x.shape
    row = x.transpose(1, 2)                                                 # (B, E, L)
    col = row.reshape(B, E, H, W).transpose(2, 3).reshape(B, E, L)
    return torch.stack([row, col, row.flip(-1), col.flip(-1)], 1)


def cross_merge_grid(ys: Tensor, H: int, W: int) -> Tensor:
    """:func:`cross_merge_ref` of the full grid by flips and a transpose (the official
    ``CrossMerge``; fp32 sum of the directions in their order 0..3, output ``ys.dtype``)."""
    B, _, E, L = ys.shape
    acc = torch.promote_types(ys.dtype, torch.float32)
    y = ys.to(acc)
    col = y[:, 1].reshape(B, E, W, H).transpose(2, 3).reshape(B, E, L)
    col3 = y[:, 3].flip(-1).reshape(B, E, W, H).transpose(2, 3).reshape(B, E, L)
    return (((y[:, 0] + col) + y[:, 2].flip(-1)) + col3).transpose(1, 2).to(ys.dtype)


def cross_scan_ref(x: Tensor, H: int, W: int, index: Optional[DirectionIndex] = None
                   ) -> Tensor:
    """(B, L, E) -> (B, 4, E, L) with PyTorch ops (reference; autograd)."""
    B, L, E = x.shape
    perm = direction_indices(H, W, x.device)[:, None] if index is None else index.perm
    perm = perm.permute(1, 0, 2)[:, :, None, :].expand(B, K, E, L)        # (B, K, E, L)
    return x.transpose(1, 2)[:, None].expand(B, K, E, L).gather(3, perm)


def cross_merge_ref(ys: Tensor, H: int, W: int, index: Optional[DirectionIndex] = None
                    ) -> Tensor:
    """(B, 4, E, L) -> (B, L, E) with PyTorch ops (reference; fp32 sum, output ``ys.dtype``)."""
    B, _, E, L = ys.shape
    inv = _inverse_indices(H, W, ys.device)[:, None] if index is None else index.inv.long()
    inv = inv.permute(1, 0, 2)[:, :, None, :].expand(B, K, E, L)
    acc = torch.promote_types(ys.dtype, torch.float32)      # fp32 (fp64 stays fp64)
    tok = ys.to(acc).gather(3, inv)
    return tok.sum(1).transpose(1, 2).to(ys.dtype)


def _kernels(interpret: bool):
    return jit_kernels('_cross_scan_kernels', ('cross_scan_kernel', 'cross_merge_kernel'),
                       'the cross-scan kernels', interpret)

def _launch(kernel: int, src: Tensor, dst: Tensor, H: int, W: int, E: int,
            index: Optional[DirectionIndex]) -> Tensor:
    import triton
    B, L = dst.shape[0], (H * W if index is None else index.inv.shape[-1])
    n_lb = triton.cdiv(L, BLOCK_L)
    if index is None:
        inv, bstride, kstride = src, 0, 0               # unused (HAS_INDEX=False)
    else:
        inv = index.inv
        bstride = L if inv.shape[1] > 1 else 0
        kstride = inv.shape[1] * L
    _kernels(not src.is_cuda)[kernel][(B * n_lb, triton.cdiv(E, BLOCK_E))](
        src, dst, inv, H, W, L, E, n_lb, bstride, kstride, HAS_INDEX=index is not None,
        BLOCK_L=BLOCK_L, BLOCK_E=BLOCK_E)
    return dst


def _scan_kernel(x: Tensor, H: int, W: int, index: Optional[DirectionIndex]) -> Tensor:
    B, L, E = x.shape
    xs = torch.empty(B, K, E, L, device=x.device, dtype=x.dtype)
    return _launch(0, x.contiguous(), xs, H, W, E, index)


def _merge_kernel(ys: Tensor, H: int, W: int, index: Optional[DirectionIndex]) -> Tensor:
    B, _, E, L = ys.shape
    y = torch.empty(B, L, E, device=ys.device, dtype=ys.dtype)
    return _launch(1, ys.contiguous(), y, H, W, E, index)


class _CrossScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, H, W, index):
        ctx.args = (H, W, index)
        return _scan_kernel(x, H, W, index)

    @staticmethod
    def backward(ctx, g):
        return _merge_kernel(g, *ctx.args), None, None, None


class _CrossMerge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ys, H, W, index):
        ctx.args = (H, W, index)
        return _merge_kernel(ys, H, W, index)

    @staticmethod
    def backward(ctx, g):
        return _scan_kernel(g, *ctx.args), None, None, None


def exporting() -> bool:
    """Whether an export records the forward (:func:`amvim_mm.runtime.exporting`) or a
    ``torch.jit`` trace / script does: the Triton kernels have no ONNX or TorchScript form, so
    the PyTorch ops run instead."""
    return runtime.exporting() or torch.jit.is_tracing() or torch.jit.is_scripting()


def kernel_misfit(device: str, exporting_now: bool) -> Optional[str]:
    """Why the Triton cross-scan / cross-merge cannot take tensors on ``device`` (None: they
    can; the automatic choice of :func:`cross_scan`, and the planner's): CUDA, not while an
    export records, Triton importable."""
    if exporting_now:
        return 'an export records'
    if device != 'cuda':
        return 'not CUDA'
    return None if _triton_ok() else 'no Triton'


def _use_kernels(t: Tensor, kernels: Optional[bool]) -> bool:
    if kernels is not None:
        return kernels and not exporting()
    return kernel_misfit(t.device.type, exporting()) is None


@functools.lru_cache(maxsize=None)
def _triton_ok() -> bool:
    try:
        _kernels(False)
    except Exception:   # no triton: the PyTorch reference
        return False
    return True


def _check(shape: Tuple[int, ...], L: int, H: int, W: int, name: str,
           index: Optional[DirectionIndex]) -> None:
    if index is None and L != H * W:
        raise ConfigError(f'{name}: {L} tokens do not fill a {H} x {W} grid (shape {shape})')
    if index is not None and (index.inv.shape[0] != K or index.inv.shape[-1] != L):
        raise ConfigError(f'{name}: a direction index of shape {tuple(index.inv.shape)} does '
                          f'not fit {L} tokens (shape {shape})')


def cross_scan(x: Tensor, H: int, W: int, index: Optional[DirectionIndex] = None,
               kernels: Optional[bool] = None) -> Tensor:
    """(B, L, E) channel-last tokens -> (B, 4, E, L) in the four directions' orders.

    ``index``: None for the full H x W grid in raster order, else the directions of a reduced
    sequence. ``kernels``: None (Triton on CUDA, else PyTorch), True (Triton; CPU tensors need
    ``TRITON_INTERPRET=1``) or False (PyTorch); during an export always PyTorch
    (:func:`exporting`).
    """
    _check(tuple(x.shape), x.shape[1], H, W, 'cross_scan', index)
    if _use_kernels(x, kernels):
        return _CrossScan.apply(x, H, W, index)
    if index is None and exporting():
        return cross_scan_grid(x, H, W)
    return cross_scan_ref(x, H, W, index)


def cross_merge(ys: Tensor, H: int, W: int, index: Optional[DirectionIndex] = None,
                kernels: Optional[bool] = None) -> Tensor:
    """(B, 4, E, L) path-ordered -> (B, L, E) token order: the sum of the four directions
    (fp32 accumulation, output in ``ys.dtype``). ``index``, ``kernels`` as in
    :func:`cross_scan`."""
    if ys.dim() != 4 or ys.shape[1] != K:
        raise ConfigError(f'cross_merge takes (B, 4, E, L), got {tuple(ys.shape)}')
    _check(tuple(ys.shape), ys.shape[3], H, W, 'cross_merge', index)
    if _use_kernels(ys, kernels):
        return _CrossMerge.apply(ys, H, W, index)
    if index is None and exporting():
        return cross_merge_grid(ys, H, W)
    return cross_merge_ref(ys, H, W, index)
