"""The inputs of PlainMamba's ToP-aligned scan (``PlainMamba2D._aligned_scan``).

With ToP's hidden-state alignment each direction scans its survivors as the official
full-length pass with zero input at the absent cells would. In that pass step ``t`` of a
direction takes delta, B, C of RASTER cell ``t`` (the official first quirk) and the dt bias
twice (the second quirk); an absent cell's ``dt`` is the bias itself. The zero-input steps
between two kept steps fold into the later one's step size
(:func:`~amvim_mm.ops.selective_scan.aligned_selective_scan`): the folded scan takes

* ``d'_j = softplus(delta_j + b) + gap_j`` and ``u'_j = u_j * softplus(delta_j + b) / d'_j``,
  ``delta_j`` the ``dt`` of raster cell ``s_j`` (kept step ``j`` at full-grid step ``s_j``);
* ``gap_j``: ``'bias'``: the step sizes of the raster cells strictly between ``s_{j-1}`` and
  ``s_j`` (``softplus(dt_c + b)`` at a present cell, ``softplus(b + b)`` at an absent one);
  ``'token'``: ``(s_j - s_{j-1} - 1) * softplus(delta_j + b)``.

:func:`aligned_inputs_torch` forms ``delta`` and ``gap`` with PyTorch ops (the CPU path and the
reference; :func:`~amvim_mm.ops.selective_scan.aligned_selective_scan` folds them);
:func:`aligned_scan` writes ``d'`` and ``u'`` with one Triton kernel
(:mod:`._plain_aligned_kernels`) and runs the folded scan. The kernel runs on CUDA tensors, and
on CPU tensors in Triton's interpreter when ``TRITON_INTERPRET=1`` is set before Python starts
(tests); :func:`use_kernels` decides, :func:`override_kernels` forces either path (tests).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm.errors import ConfigError
from .triton_loader import jit_kernels
from .cross_scan import exporting
from .selective_scan import _finish, selective_scan_fn

__all__ = ['ALIGN_MODES', 'aligned_inputs', 'aligned_inputs_torch', 'aligned_scan', 'at_steps',
           'kernel_misfit', 'override_kernels', 'snake_gap_tables', 'step_lookup',
           'use_kernels']

#: ``ctx.align``: how a gap's zero-input steps size their decay
ALIGN_MODES = ('bias', 'token')
BLOCK_T, BLOCK_E = 64, 32
_forced = threading.local()


def step_lookup(pos: Tensor, steps: Tensor, cells: Optional[int] = None
                ) -> Tuple[Tensor, Tensor]:
    """The stored survivor at raster cell ``steps[b, k, j]`` (the cell whose delta, B, C kept
    step ``j`` takes): (idx, here), both (B, K, L); ``pos`` (B, L) raster-ascending cells of the
    stored survivors; ``idx`` is meaningless where ``here`` is False. ``cells``: the grid's
    cell count M (every step < M + 1): one scatter and one gather through a (B, M + 1) table
    instead of a binary search (the same answers where ``here``; ONNX has no search op)."""
    B, K, L = steps.shape
    flat = steps.reshape(B, K * L)
    if cells is not None:
        slot = pos.new_zeros(B, cells + 1).scatter(       # survivor j + 1 at its cell, else 0
            1, pos, torch.arange(1, L + 1, device=pos.device, dtype=pos.dtype).expand(B, L))
        found = torch.gather(slot, 1, flat)
        return (found - 1).clamp(min=0).view(B, K, L), (found > 0).view(B, K, L)
    idx = torch.searchsorted(pos, flat).clamp(max=L - 1)
    here = (torch.gather(pos, 1, idx) == flat).view(B, K, L)
    return idx.view(B, K, L), here


def at_steps(t: Tensor, idx: Tensor, here: Tensor, absent) -> Tensor:
    """(B, L, X) per stored survivor -> (B, K, X, L) at the kept steps' raster cells
    (:func:`step_lookup`), ``absent`` (a number or broadcastable tensor) where no survivor is."""
    B, K, L = idx.shape
    X = t.shape[-1]
    g = torch.gather(t, 1, idx.reshape(B, K * L, 1).expand(-1, -1, X))
    g = g.view(B, K, L, X).transpose(2, 3)
    return torch.where(here.unsqueeze(2), g, absent)


def aligned_inputs_torch(dt: Tensor, bias: Tensor, steps: Tensor, pos: Tensor, idx: Tensor,
                         here: Tensor, align: str, cells: Optional[int] = None
                         ) -> Tuple[Tensor, Tensor]:
    """``delta`` (raw, the second bias not yet added) and ``gap`` (B, K*E, L) of the folded
    scan with PyTorch ops. ``dt`` (B, L, E) the stored survivors' ``dt_proj`` outputs (one
    bias); ``bias`` (K*E,) the dt bias per direction; ``steps`` (B, K, L) the full-grid step of
    each kept step; ``pos``, ``idx``, ``here`` as in :func:`step_lookup`.

    Nothing full-length is formed: a gap's present cells are summed by a scatter-add (no
    prefix-sum differences) and its absent cells count ``softplus(2 b)`` each. ``cells``: the
    grid's cell count M; each survivor's gap is then read from a (B, K, M) table of the kept
    steps (a scatter and a count) instead of a binary search: the same integers, in operators
    ONNX has."""
    B, K, L = steps.shape
    E = dt.shape[-1]
    b1 = bias[:E]
    delta = at_steps(dt, idx, here, b1.view(1, 1, E, 1)).reshape(B, K * E, L)  # absent: dt = b
    prev = torch.cat([steps.new_full((B, K, 1), -1), steps[..., :-1]], -1)
    skipped = (steps - prev - 1).to(dt.dtype)                             # (B, K, L)
    if align == 'token':
        own = F.softplus(delta + bias[None, :, None]).view(B, K, E, L)
        return delta, (skipped.unsqueeze(2) * own).reshape(B, K * E, L)
    # survivor i (raster cell pos_i) lies in the gap before the first kept step after it; the
    # kept step at its own cell, or none after it, is no gap (slot L)
    seg = _gap_slots(steps, pos) if cells is None else _gap_slots_table(steps, pos, cells)
    d = F.softplus(dt + b1).transpose(1, 2)                               # (B, E, L)
    present = d.new_zeros(B, K, E, L + 1).scatter_add_(
        3, seg.unsqueeze(2).expand(B, K, E, L), d.unsqueeze(1).expand(B, K, E, L))
    n_present = skipped.new_zeros(B, K, L + 1).scatter_add_(2, seg, torch.ones_like(skipped))
    absent = (skipped - n_present[..., :L]).unsqueeze(2)
    gap = present[..., :L] + absent * F.softplus(b1 + b1).view(1, 1, E, 1)
    return delta, gap.reshape(B, K * E, L)


def _gap_slots(steps: Tensor, pos: Tensor) -> Tensor:
    """(B, K, L): the kept step whose gap holds survivor ``i``'s cell (its delta), found by a
    binary search; ``L`` where the cell is a kept step's own or lies after the last one."""
    B, K, L = steps.shape
    flat_steps = steps.reshape(B * K, L)
    flat_pos = pos.unsqueeze(1).expand(B, K, L).reshape(B * K, L)
    seg = torch.searchsorted(flat_steps, flat_pos)
    own_step = torch.gather(flat_steps, 1, seg.clamp(max=L - 1)) == flat_pos
    return torch.where(own_step | (seg >= L), torch.full_like(seg, L), seg).view(B, K, L)


def _gap_slots_table(steps: Tensor, pos: Tensor, cells: int) -> Tensor:
    """:func:`_gap_slots` from a (B, K, M) table of the kept steps: the number of kept steps
    before survivor ``i``'s cell (an exclusive running count), ``L`` where the cell is a kept
    step's own or follows the last one."""
    B, K, L = steps.shape
    kept = steps.new_zeros(B, K, cells).scatter(2, steps, torch.ones_like(steps))
    at = pos.unsqueeze(1).expand(B, K, L)
    seg = torch.gather(kept.cumsum(2) - kept, 2, at)
    own_step = torch.gather(kept, 2, at) > 0
    return torch.where(own_step | (seg >= L), torch.full_like(seg, L), seg)


def _kernels(interpret: bool):
    return jit_kernels('_plain_aligned_kernels', ('plain_aligned_kernel', ),
                       "PlainMamba's aligned-scan kernel", interpret)[0]

@functools.lru_cache(maxsize=None)
def _available(device_type: str) -> bool:
    try:
        _kernels(device_type != 'cuda')
    except Exception:   # no triton, or CPU tensors without the interpreter
        return False
    return device_type != 'cuda' or torch.cuda.is_available()


@contextlib.contextmanager
def override_kernels(on: Optional[bool]) -> Iterator[None]:
    """Within the block :func:`use_kernels` answers ``on`` (None: decide as usual) for fp32
    inputs that record no autograd graph (tests compare the two paths in one process)."""
    old = getattr(_forced, 'on', None)
    _forced.on = on
    try:
        yield
    finally:
        _forced.on = old


def kernel_misfit(device: str, dtype: torch.dtype, grad: bool, exporting: bool
                  ) -> Optional[str]:
    """Why :func:`aligned_scan` (the kernel) cannot take the aligned scan's inputs (None: it
    can): ``dtype`` the mixer's compute dtype (float64 stays in PyTorch; ``dt`` is float32
    otherwise), no autograd graph (``grad``: the kernel has no backward), not while an export
    traces the model, and CUDA tensors or Triton's interpreter (:func:`override_kernels`
    forces the answer for fp32 inputs outside autograd, tests)."""
    if dtype == torch.float64:
        return 'float64'
    if exporting:
        return 'an export records'
    if grad:
        return 'grad recorded (no backward)'
    forced = getattr(_forced, 'on', None)
    if forced is not None:
        return None if forced else 'switched off (override_kernels)'
    return None if _available(device) else 'no Triton kernel here'


def use_kernels(u: Tensor, dt: Tensor) -> bool:
    """:func:`kernel_misfit` on the tensors of a direct call (the kernel reads a float32
    ``dt``)."""
    if dt.dtype != torch.float32:
        return False
    grad = torch.is_grad_enabled() and (u.requires_grad or dt.requires_grad)
    return kernel_misfit(u.device.type, u.dtype, grad, exporting()) is None


def _slot_table(pos: Tensor, M: int) -> Tensor:
    """(B, M) int32: the stored index of the survivor at raster cell c, -1 where none is."""
    B, L = pos.shape
    ar = torch.arange(L, device=pos.device, dtype=torch.int32)
    return torch.full((B, M), -1, device=pos.device, dtype=torch.int32).scatter_(
        1, pos, ar.expand(B, L))


def _launch(u: Optional[Tensor], dt: Tensor, b1: Tensor, steps: Tensor, slot: Tensor, M: int,
            align: str, d2: Tensor, u2: Optional[Tensor], strides: Tuple[int, int, int],
            block_t: Optional[int]) -> None:
    """The kernel writing ``d2`` (and ``u2`` when given) at ``strides`` (per direction row
    ``b * K + k``, per kept step, per channel)."""
    import triton
    if align not in ALIGN_MODES:
        raise ConfigError(f'aligned_inputs: align must be one of {ALIGN_MODES}, got {align!r}')
    B, K, L = steps.shape
    E = dt.shape[-1]
    ar = torch.arange(L, device=dt.device, dtype=torch.int32)
    jtab = torch.full((B, K, M), -1, device=dt.device, dtype=torch.int32).scatter_(
        2, steps, ar.expand(B, K, L))
    block_t = block_t or min(BLOCK_T, triton.next_power_of_2(M))
    block_e = min(BLOCK_E, triton.next_power_of_2(E))
    n_eb = triton.cdiv(E, block_e)
    _kernels(not dt.is_cuda)[(B * K * n_eb, )](
        d2 if u is None else u.contiguous(), dt.float().contiguous(), b1.float().contiguous(),
        slot, jtab, steps.long().contiguous(), d2, d2 if u2 is None else u2, L, M, E, K, n_eb,
        *strides, GAP_TOKEN=align == 'token', BLOCK_T=block_t, BLOCK_E=block_e,
        WRITE_U=u2 is not None)


def aligned_inputs(u: Tensor, dt: Tensor, b1: Tensor, steps: Tensor, pos: Tensor, M: int,
                   align: str, block_t: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """``(d', u')`` (B, K*E, L) fp32 of the folded scan, written by the Triton kernel.

    u (B, K, E, L) the directions' kept steps; dt (B, L, E) fp32 the stored survivors'
    ``dt_proj`` outputs; b1 (E,) the dt bias; steps (B, K, L) the full-grid step of each kept
    step (ascending); pos (B, L) the survivors' raster cells (ascending); M = H * W;
    ``block_t``: full-grid steps per block of the kernel's walk (a power of 2; tests)."""
    B, K, E, L = u.shape
    d2 = torch.empty(B, K * E, L, device=u.device, dtype=torch.float32)
    u2 = torch.empty_like(d2)
    _launch(u, dt, b1, steps, _slot_table(pos, M), M, align, d2, u2, (E * L, 1, L), block_t)
    return d2, u2


def snake_gap_tables(pos: Tensor, steps: Tensor, M: int, below: bool = True
                     ) -> Tuple[Tensor, Optional[Tensor]]:
    """The snake-scan kernel's aligned inputs (:func:`~amvim_mm.ops.plain_scan.snake_scan`):
    ``q`` (B, K, L) int32, the stored survivor at each kept step's raster cell ``s_j`` (-1:
    absent), and ``below`` (B, K, L) int32, the number of survivors at raster cells below
    ``s_j``, from which the kernel finds the survivors inside each 'bias' gap (``below=False``:
    None; 'token' gaps need only the steps). pos (B, L) the survivors' raster cells
    (ascending, the storage order); steps (B, K, L) the full-grid step of each kept step;
    M = H * W."""
    B, K, L = steps.shape
    flat = steps.reshape(B, K * L)
    q = torch.gather(_slot_table(pos, M), 1, flat).view(B, K, L)
    if not below:
        return q, None
    return q, torch.searchsorted(pos, flat, out_int32=True).view(B, K, L)


def aligned_scan(u: Tensor, dt: Tensor, bias: Tensor, steps: Tensor, pos: Tensor, M: int,
                 A: Tensor, Bk: Tensor, Ck: Tensor, D: Optional[Tensor], align: str,
                 backend: Optional[str] = None) -> Tensor:
    """PlainMamba's aligned scan on the kernel's ``(d', u')``: ``y + D * u`` (B, K*E, L) of
    ``u.dtype``, as :func:`~amvim_mm.ops.selective_scan.aligned_selective_scan` returns it on
    :func:`aligned_inputs_torch`'s ``delta`` and ``gap``. ``bias`` (K*E,) the dt bias per
    direction (each direction's the same); Bk, Ck (B, K, N, L); other arguments as in
    :func:`aligned_inputs`."""
    B, K, E, L = u.shape
    ct = torch.float32
    d2, u2 = aligned_inputs(u, dt, bias[:E], steps, pos, M, align)
    y = selective_scan_fn(u2, d2, A.to(ct), Bk.to(ct), Ck.to(ct), None, None, None,
                          delta_softplus=False, backend=backend)
    return _finish(y.to(ct), u.reshape(B, K * E, L).to(ct), D, None, ct, u.dtype)
