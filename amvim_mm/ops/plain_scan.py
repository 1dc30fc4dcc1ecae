"""PlainMamba's four snake-direction scans in one Triton kernel (:func:`snake_scan`).

The unfused mixer forms each direction's ``u`` in its order (a cross-scan copy), ``delta``, B
and C per direction, runs mamba-ssm's grouped scan and sums the four outputs back in storage
order (a cross-merge). mamba-ssm's kernel costs about the same for any sequence up to its chunk
length (128 steps), so a reduced sequence of 42-117 tokens saves little there. The kernel here
walks each direction's L steps, reading ``u`` of the visited token, dt, B and C of the step's
token (the official index pairing, or ToP's aligned survivor) straight from the mixer's
projections and summing the directions in storage order, so its cost follows L.

:func:`snake_scan_misfit` says why not (the planner asks it): CUDA tensors (or Triton's interpreter on CPU tensors when the
fused path is forced, tests), no autograd graph recorded (the kernel has no backward), not
while exporting, the scan backend left automatic and the fused path not switched off
(``AMVIM_FUSED_MIXER=0`` / ``runtime.override(fused_mixer=False)``), and on automatic enough
programs to fill the GPU (below that mamba-ssm's kernel is faster).
:func:`~amvim_mm.models.plain_mamba.mixer.PlainMamba2D._scan` stays the reference.
"""
from __future__ import annotations

import functools
from typing import Iterable, Optional, Tuple

import torch
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from .triton_loader import jit_kernels
from .backends import requested_backend
from .scan_choice import TARGET_PROGRAMS

__all__ = ['SNAKE_CONFIG', 'snake_config', 'snake_scan', 'snake_scan_available',
           'snake_scan_misfit', 'use_snake_scan']

#: (BLOCK_E, num_warps): channels and warps per program, measured on an H200
#: (benchmarks/README.md); ``AMVIM_SNAKE_SCAN_CONFIG`` overrides it
SNAKE_CONFIG = (64, 2)


def snake_config(E: int) -> Tuple[int, int]:
    """(BLOCK_E, num_warps) of the kernel for inner width E (BLOCK_E at most E's power of 2)."""
    block_e, warps = runtime.settings().snake_config or SNAKE_CONFIG
    if block_e < 1 or block_e & (block_e - 1) or warps < 1:
        raise ConfigError(f'snake scan config ({block_e}, {warps}): BLOCK_E must be a power '
                          'of 2 and num_warps >= 1')
    return min(block_e, 1 << max(E - 1, 0).bit_length()), warps


def _kernel(interpret: bool):
    return jit_kernels('_plain_scan_kernels', ('plain_scan_kernel', ),
                       "PlainMamba's snake-scan kernel", interpret)[0]


@functools.lru_cache(maxsize=None)
def snake_scan_available(device_type: str) -> bool:
    """Whether the kernel can run on tensors of ``device_type`` (CPU: the interpreter)."""
    try:
        _kernel(device_type != 'cuda')
    except Exception:   # no triton, or CPU tensors without the interpreter
        return False
    return device_type != 'cuda' or torch.cuda.is_available()


def snake_scan_misfit(device: str, dtype: torch.dtype, grad: bool, exporting: bool,
                      batch: int, d_inner: int, d_state: int, scan_backend: Optional[str]
                      ) -> Optional[str]:
    """Why PlainMamba's mixer cannot run :func:`snake_scan` (None: it runs it). ``device``: the
    input's device type; ``dtype``: the mixer's input dtype; ``grad``: autograd records
    through the mixer (the kernel has no backward); ``exporting``: an export traces the model;
    ``batch``, ``d_inner``, ``d_state``: the call's sizes (the state a power of 2, the kernel's
    state block); ``scan_backend``: the mixer's argument. On automatic
    (``AMVIM_FUSED_MIXER`` unset) the kernel needs CUDA and enough programs to fill the GPU
    (below that mamba-ssm's kernel is faster); forced on, CPU tensors take Triton's
    interpreter (tests)."""
    if dtype == torch.float64:
        return 'float64'
    if exporting:
        return 'an export records'
    if d_state & (d_state - 1):
        return 'd_state is not a power of 2'
    if grad:
        return 'grad recorded (no backward)'
    if requested_backend(scan_backend) != 'auto':
        return 'a scan backend was requested'
    fused = runtime.settings().fused_mixer
    if fused is False:
        return f'{runtime.variable_of("fused_mixer")}=0'
    if device != 'cuda' and not fused:
        return 'not CUDA'
    if not snake_scan_available(device):
        return 'no Triton kernel here'
    if not fused and batch * -(-d_inner // snake_config(d_inner)[0]) < TARGET_PROGRAMS:
        return 'too few programs: the mamba-ssm kernel is faster'
    return None


def use_snake_scan(x: Tensor, d_inner: int, d_state: int, scan_backend: Optional[str],
                   params: Iterable[Tensor] = ()) -> bool:
    """Whether :func:`snake_scan_misfit` lets PlainMamba's mixer run :func:`snake_scan` on
    ``x`` (its (B, L, C) input); ``params``: the mixer's parameters (a direct call's facts;
    a forward's plan asks :func:`snake_scan_misfit` itself)."""
    grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))
    return snake_scan_misfit(x.device.type, x.dtype, grad, runtime.exporting(), x.shape[0],
                             d_inner, d_state, scan_backend) is None


def snake_scan(xc: Tensor, dt: Tensor, x_dbl: Tensor, perm: Tensor, codes: Tensor,
               dir_bs: Tensor, A: Tensor, dt_bias: Tensor, D: Tensor, dt_rank: int,
               q: Optional[Tensor] = None, steps: Optional[Tensor] = None,
               below: Optional[Tensor] = None, align: Optional[str] = None) -> Tensor:
    """The four directions' summed scan outputs, ``sum_k y_k + D * u`` (B, L, E) fp32 in
    storage order (before the gate), as the unfused ``_scan`` / ``_aligned_scan`` followed by
    the cross-merge give them.

    xc (B, L, E) the conv output (u); dt (B, L, E) ``dt_proj``'s output (its bias once);
    x_dbl (B, L, R + 2N) ``x_proj``'s output; perm (K, B or 1, L) the stored token each
    direction visits at each step; codes (K, L) or (B, K, L) the steps' direction codes;
    dir_bs (5, N) ``direction_Bs``; A (E, N) negative; dt_bias (E,) (applied again here);
    D (E,); ``dt_rank`` R. Without ``align`` step ``j`` takes token ``j``'s dt, B, C and decays
    with its own step size. ToP's alignment (``align`` 'bias' or 'token'): q (B, K, L) the
    stored token whose dt, B, C step ``j`` takes (-1: an absent cell), steps (B, K, L) the
    full-grid step of each kept step, ``below`` (B, K, L) the number of survivors at raster
    cells below each kept step's ('bias'; both from
    :func:`~amvim_mm.ops.plain_aligned.snake_gap_tables`; the survivors stored in raster
    order).
    """
    B, L, E = xc.shape
    K = perm.shape[0]
    N = dir_bs.shape[-1]
    gap = {None: 0, 'bias': 1, 'token': 2}.get(align)
    if gap is None:
        raise ConfigError(f"snake_scan: align must be None, 'bias' or 'token', got {align!r}")
    if gap and (q is None or steps is None or (gap == 1 and below is None)):
        raise ValueError(f'snake_scan: align={align!r} takes q, steps (and below for bias)')
    if gap == 1 and below.shape != q.shape:      # the kernel reads below with q's strides
        raise ValueError(f'snake_scan: below {tuple(below.shape)} must match q '
                         f'{tuple(q.shape)}')
    xc, dt, x_dbl = xc.contiguous(), dt.contiguous(), x_dbl.contiguous()
    perm = perm.contiguous()
    codes = codes.contiguous()
    code_b = codes.stride(0) if codes.dim() == 3 else 0
    code_k = codes.stride(1) if codes.dim() == 3 else codes.stride(0)
    out = torch.empty(B, L, E, device=xc.device, dtype=torch.float32)
    q = q.to(torch.int32).contiguous() if gap else perm
    steps = steps.long().contiguous() if gap else perm
    below = below.to(torch.int32).contiguous() if gap == 1 else q   # strides of q
    block_e, warps = snake_config(E)
    grid = (B, -(-E // block_e))
    _kernel(not xc.is_cuda)[grid](
        xc, dt, x_dbl, perm, codes, q, steps, below, dir_bs.float().contiguous(),
        A.float().contiguous(), dt_bias.float().contiguous(), D.float().contiguous(), out,
        L, E, dt_rank, xc.stride(0), xc.stride(1), dt.stride(0), dt.stride(1),
        x_dbl.stride(0), x_dbl.stride(1), perm.stride(0), perm.stride(1) if perm.shape[1] > 1
        else 0, code_k, code_b, q.stride(0) if gap else 0, q.stride(1) if gap else 0,
        steps.stride(0) if gap else 0, steps.stride(1) if gap else 0,
        out.stride(0), out.stride(1),
        K=K, N=N, BLOCK_E=block_e, HAS_Q=gap > 0, GAP=gap, num_warps=warps)
    return out
