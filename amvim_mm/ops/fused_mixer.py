"""Fused inference path of the Vim-family mixer: two Triton kernels for all scan paths at once.

The unfused mixer (:class:`amvim_mm.models.vim.mixer.BiMambaMixer`, the reference for
this file) works channel-first like the official code: per path a gather or flip of ``xz`` into
the path's order, a causal conv launch, a selective-scan launch, and a gather back. At Vim's shapes
(L = 197, E = 384) every one of these launches is far from the memory roofline
(benchmarks/README.md).

Here the sequence stays channel-last (B, L, C), as ``in_proj`` produces it, and a path is just an
int32 index array ``perm[p, b, i]`` (the token at position ``i`` of path ``p``), so a window-order
path costs the same as Vim's identity and flip:

1. ``xz = hidden @ in_proj.T`` (B, L, 2E);
2. ``conv_kernel`` (one launch, every path): ``xc[p, b, i] = silu(conv_p(x[b, perm[p, b, :]]))``
   in path order, reading the rows of ``x`` through ``perm`` (each row is contiguous);
3. ``x_dbl[p] = xc[p] @ x_proj_p.T`` (one batched matmul over the paths);
4. the scan (:func:`launch_scan`, every path in one launch): ``scan_kernel``, one program per
   (sample, block of channels, path), walks its path step by step with the state (channels x
   N) in registers; ``delta`` is ``dt_proj`` as one batched matmul (or, per width, formed in
   the kernel from the low-rank ``dt``), the output is gated by ``silu(z)`` read at the token's
   place and written into token order, path ``p`` into columns ``p * E ... (p + 1) * E - 1``;
5. ``out_proj`` over those P * E columns with its weight repeated per path and scaled by 1 / P:
   Vim's mean of the paths in the same matmul.

The sequential walk has only ``B * E / BLOCK_E * P`` programs (96 for batch 8 at E = 384 on a
132-SM H200): long sequences at small batches (segmentation at 512 px: L = 1025, detection at
1024 px: L = 4097) leave the GPU idle. The chunked scan splits each path into chunks of T steps:
pass 1 (``chunk_scan_kernel``, one program per sample, channel block, path and chunk) walks
every chunk from a zero state and keeps its end state and the sum of its step sizes; pass 2
(``chunk_carry_kernel``, sequential over the chunks, cheap) carries ``H_c = exp(A * sum
delta) * H_{c-1} + end_c``, the state before each chunk (:func:`chunk_initial_states`); pass 3
(``chunk_scan_kernel`` again) walks every chunk from its initial state, writing the outputs as
``scan_kernel`` does. About twice the arithmetic, ``ceil(L / T)`` times the programs. Which
scan runs, and whether the fused path beats the mamba-ssm kernels at all, comes from a table
measured per batch x E x L (:mod:`amvim_mm.ops.scan_choice`).

It computes exactly the mixer's math (fp32 state and accumulation; bf16 or fp32 storage like the
inputs), ToP's hidden-state alignment included (``gaps``: pruned positions before each kept
token decay the state with zero input; the scan kernels' ``HAS_GAPS``) and its importance score
(``importance``). This module is the inference path (no autograd): on CUDA when Triton imports
(and, automatically, where the table does not name the mamba-ssm kernels:
:func:`auto_prefers_fused`). Under autograd the same forward kernels run inside
:class:`~amvim_mm.ops.fused_mixer_autograd.FusedSSM`, which has backward kernels of its own.
Everything else runs the unfused path. On CPU tensors the same kernels run in Triton's
interpreter when ``TRITON_INTERPRET=1`` is set before Python starts (slow; for tests).
``fused_add_rmsnorm`` is the block's residual add + RMSNorm in one kernel, for the same
inference path (:mod:`amvim_mm.ops.fused_add_rmsnorm` has the trainable one).
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from .triton_loader import jit_kernels

from .scan_choice import auto_scan_chunk, scan_config

__all__ = ['fused_mixer_available', 'fused_mixer_forward', 'fused_add_rmsnorm', 'FUSED_ENV_VAR',
           'fused_requested', 'autocast_dtype', 'pack_mixer_weights', 'stack_mixer_params',
           'mixer_front', 'launch_scan', 'chunk_initial_states']

FUSED_ENV_VAR = runtime.variable_of('fused_mixer')
LOG2E = 1.4426950408889634


def fused_requested(setting: Optional[bool]) -> Optional[bool]:
    """Resolve the ``fused`` switch: argument > ``AMVIM_FUSED_MIXER`` (0/1, through
    :mod:`amvim_mm.runtime`) > ``None`` (auto)."""
    if setting is not None:
        return bool(setting)
    return runtime.settings().fused_mixer


def _kernels(interpret: bool):
    """(conv, scan, add_rmsnorm, merge_add_rmsnorm, chunk_scan, chunk_carry), compiled (or
    wrapped for the interpreter) once."""
    return jit_kernels('_fused_mixer_kernels', ('conv_kernel', 'scan_kernel', 'add_rmsnorm_kernel',
                                                'merge_add_rmsnorm_kernel', 'chunk_scan_kernel',
                                                'chunk_carry_kernel'),
                       'the fused mixer', interpret)

@functools.lru_cache(maxsize=None)
def fused_mixer_available(device_type: str = 'cuda') -> Tuple[bool, str]:
    """(usable, reason) for tensors on ``device_type`` (CPU: Triton's interpreter)."""
    try:
        _kernels(device_type != 'cuda')
    except Exception as e:  # ImportError (no triton), or a Triton without the interpreter
        return False, f'{type(e).__name__}: {e}'.splitlines()[0][:200]
    if device_type == 'cuda' and not torch.cuda.is_available():
        return False, 'CUDA is not available'
    return True, 'ok'


#: the conv kernel's (BLOCK_L, BLOCK_E)
CONV_BLOCK = (32, 64)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype on ``device_type`` when autocast is on there, else None."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def pack_mixer_weights(per_path, in_proj_weight: Tensor, out_proj_weight: Tensor,
                       compute_dtype: Optional[torch.dtype] = None) -> Tuple:
    """A mixer's parameters as :func:`fused_mixer_forward` takes them:
    ``(in_proj, stacked per-path tensors, out_proj_cat)``.

    ``per_path``: one ``(conv1d, x_proj, dt_proj, A_log, D)`` per path (modules and parameters,
    as ``BiMambaMixer.path_params`` gives them). ``out_proj_cat`` is ``out_proj`` repeated per
    path and scaled by 1 / P (Vim's mean of the paths). ``compute_dtype`` (the autocast dtype,
    if any): the matmul weights are cast once here instead of by autocast at every call. Zero
    padding for aligned GEMMs: the low rank ``R`` of ``dt`` is rounded up to a multiple of 8
    (zero rows in ``x_proj`` after its first ``R`` rows, zero columns in ``dt_proj``: the same
    ``delta``; with Vim-T's R = 12 the ``dt_proj`` GEMM ran a slow 2-element-aligned cuBLAS
    kernel), and ``x_proj``'s rows to a multiple of 8 (16-byte rows of ``x_dbl``; the kernels
    read ``B`` and ``C`` by offset).
    """
    with torch.no_grad():
        return stack_mixer_params(per_path, in_proj_weight, out_proj_weight, compute_dtype)


def stack_mixer_params(per_path, in_proj_weight: Tensor, out_proj_weight: Tensor,
                       compute_dtype: Optional[torch.dtype] = None) -> Tuple:
    """:func:`pack_mixer_weights` without ``no_grad``: the stacking, padding and ``out_proj``
    repetition are autograd ops, so the training path
    (:mod:`amvim_mm.ops.fused_mixer_autograd`) differentiates through them to the per-path
    parameters."""
    def mm(t):   # a matmul operand, in the dtype autocast would give it
        return t if compute_dtype is None else t.to(compute_dtype)

    P = len(per_path)
    x_proj = torch.stack([x.weight for _, x, *_ in per_path])              # (P, R+2N, E)
    dt_w = torch.stack([d.weight for _, _, d, *_ in per_path]).float()     # (P, E, R)
    R = dt_w.shape[-1]
    pad_r = -R % 8
    if pad_r:
        x_proj = torch.cat([x_proj[:, :R], x_proj.new_zeros(
            x_proj.shape[0], pad_r, x_proj.shape[2]), x_proj[:, R:]], 1)
        dt_w = F.pad(dt_w, (0, pad_r))
    pad = -x_proj.shape[1] % 8
    if pad:
        x_proj = F.pad(x_proj, (0, 0, 0, pad))
    stacked = (
        torch.stack([c.weight[:, 0] for c, *_ in per_path]),              # (P, E, K)
        torch.stack([c.bias for c, *_ in per_path]),                      # (P, E)
        mm(x_proj),                                                       # (P, R'+2N+pad, E)
        mm(dt_w),                                                         # (P, E, R')
        torch.stack([d.bias for _, _, d, *_ in per_path]).float(),        # (P, E)
        torch.stack([-torch.exp(a.float()) for *_, a, _ in per_path]),    # (P, E, N)
        torch.stack([d for *_, d in per_path]).float(),                   # (P, E)
    )
    # Vim's mean of the paths folded into out_proj: (Dm, P * E)
    out_cat = torch.cat([out_proj_weight] * P, 1) / P
    return mm(in_proj_weight), stacked, mm(out_cat)


def mixer_front(xz: Tensor, perm: Tensor, conv_weight: Tensor, conv_bias: Tensor,
                x_proj_weight: Tensor, dt_proj_weight: Tensor, with_delta: bool = False
                ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The mixer's steps before the scan, every path at once: ``xc`` (P, B, L, E) = silu of the
    causal conv in path order (one ``conv_kernel`` launch), ``x_dbl`` (P, B, L, W) =
    ``xc @ x_proj.T`` and ``delta`` (P, B, L, E) = ``dt_proj`` of its first R columns (before
    the bias), in ``xz``'s dtype; ``delta`` is None when the scan configuration forms it inside
    the sequential kernel, unless ``with_delta``. ``xz``: (B, L, 2E) channel-last; ``perm``:
    int32 (P, B or 1, L) contiguous."""
    import triton
    Bsz, L, _ = xz.shape
    P, E, K = conv_weight.shape
    R = dt_proj_weight.shape[-1]
    conv_k = _kernels(xz.device.type != 'cuda')[0]
    dtype = xz.dtype
    s_pb = perm.stride(1) if perm.shape[1] > 1 else 0
    xc = torch.empty(P, Bsz, L, E, device=xz.device, dtype=dtype)
    bl, be = CONV_BLOCK
    n_lb = triton.cdiv(L, bl)
    conv_k[(Bsz * n_lb, triton.cdiv(E, be), P)](
        xz, perm, conv_weight.contiguous(), conv_bias.contiguous(), xc, L, E, n_lb,
        xz.stride(0), xz.stride(1), perm.stride(0), s_pb, xc.stride(0), xc.stride(1),
        xc.stride(2), K=K, BLOCK_L=bl, BLOCK_E=be, num_warps=4)
    x_dbl = torch.matmul(xc.view(P, Bsz * L, E), x_proj_weight.to(dtype).transpose(1, 2))
    x_dbl = x_dbl.view(P, Bsz, L, -1)
    if x_dbl.stride(-1) != 1:
        x_dbl = x_dbl.contiguous()
    if scan_config(E)[2] and not with_delta:
        delta = None       # dt_proj runs inside the scan kernel
    else:   # dt_proj as one batched matmul over the paths, like the official code
        delta = torch.bmm(x_dbl.view(P, Bsz * L, -1)[..., :R],
                          dt_proj_weight.to(dtype).transpose(1, 2)).view(P, Bsz, L, E)
    return xc, x_dbl, delta


def fused_mixer_forward(hidden: Tensor, in_proj_weight: Tensor, out_proj_weight: Tensor,
                        conv_weight: Tensor, conv_bias: Tensor, x_proj_weight: Tensor,
                        dt_proj_weight: Tensor, dt_proj_bias: Tensor, A: Tensor, D: Tensor,
                        perm: Tensor, out_proj_cat: Optional[Tensor] = None,
                        chunk: Optional[int] = None, gaps: Optional[Tensor] = None,
                        gap_delta: str = 'bias', importance: bool = False
                        ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """The Vim-family mixer with ``P`` paths, fused (inference only, no autograd).

    Args:
        hidden: (B, L, Dm) normalised block input.
        in_proj_weight: (2E, Dm); out_proj_weight: (Dm, E).
        conv_weight: (P, E, K) depthwise causal conv weights; conv_bias: (P, E).
        x_proj_weight: (P, R + 2N (+ zero rows), E); dt_proj_weight: (P, E, R);
            dt_proj_bias: (P, E).
        A: (P, E, N) real (``-exp(A_log)``); D: (P, E).
        perm: (P, B or 1, L) int32, ``perm[p, b, i]`` = token at position ``i`` of path ``p``
            (each row a permutation of ``0..L-1``).
        out_proj_cat: (Dm, P * E) ``cat([out_proj_weight] * P, 1) / P`` (Vim's mean of the
            paths folded into the projection); built here when not given (callers cache it).
        chunk: the scan, as :func:`launch_scan` takes it (None: automatic).
        gaps: (P, B or 1, L) float, ToP's hidden-state alignment: ``gaps[p, b, i]`` pruned
            positions precede position ``i`` of path ``p`` (aligned with ``perm``); the scan
            runs as if they were there with zero input. None: no gaps.
        gap_delta: a pruned position's step size: 'bias' (``softplus(dt_proj_bias)``) or
            'token' (the following kept token's own), as ``BiMambaMixer.scan_path`` forms it.
        importance: also return ToP's importance score of every token.

    Returns:
        (B, L, Dm) in the dtype ``F.linear`` gives under the current autocast state; with
        ``importance``, also (B, L) fp32: the sum over the paths and channels of ``max(0, y)``,
        ``y`` each path's gated output at the token (before the paths' mean).
    """
    Bsz, L, _ = hidden.shape
    P, E, K = conv_weight.shape
    N = A.shape[-1]
    if perm.dim() != 3 or perm.shape[0] != P or perm.shape[1] not in (1, Bsz) or perm.shape[2] != L:
        raise ConfigError(f'perm must have shape (P={P}, 1 or B={Bsz}, L={L}); '
                          f'got {tuple(perm.shape)}')
    if N & (N - 1):
        raise ConfigError(f'the fused mixer needs a power-of-two d_state; got {N}')
    if gap_delta not in ('bias', 'token'):
        raise ConfigError(f"gap_delta must be 'bias' or 'token'; got {gap_delta!r}")
    if gaps is not None:
        gaps = _check_gaps(gaps, P, Bsz, L, hidden.device)
    xz = F.linear(hidden, in_proj_weight)                       # (B, L, 2E), channel-last
    if xz.stride(-1) != 1:
        xz = xz.contiguous()
    perm = perm.to(device=xz.device, dtype=torch.int32).contiguous()
    xc, x_dbl, delta = mixer_front(xz, perm, conv_weight, conv_bias, x_proj_weight,
                                   dt_proj_weight)
    y = torch.empty(Bsz, L, P * E, device=xz.device, dtype=x_dbl.dtype)
    launch_scan(xc, x_dbl, delta, xz[..., E:], perm, dt_proj_weight, dt_proj_bias, A, D, y,
                chunk=chunk, gaps=gaps, gap_token=gap_delta == 'token')
    if out_proj_cat is None:
        out_proj_cat = torch.cat([out_proj_weight] * P, dim=1) / P
    out = F.linear(y, out_proj_cat)
    if not importance:
        return out
    # clamping is exact in y's dtype; the sum accumulates in fp32
    return out, y.clamp_min(0).sum(-1, dtype=torch.float32)


def _scan_operands(xc: Tensor, x_dbl: Tensor, delta: Optional[Tensor], dt_proj_bias: Tensor,
                   A: Tensor, R: int):
    """Shapes and checked operands shared by the scan launches."""
    P, Bsz, L, E = xc.shape
    N = A.shape[-1]
    if x_dbl.shape[:3] != (P, Bsz, L) or x_dbl.shape[3] < R + 2 * N:
        raise ConfigError(f'x_dbl must be (P={P}, B={Bsz}, L={L}, >= R + 2N = {R + 2 * N}); '
                          f'got {tuple(x_dbl.shape)}')
    if delta is not None and delta.shape != xc.shape:
        raise ConfigError(f'delta must have the shape of xc {tuple(xc.shape)}; '
                          f'got {tuple(delta.shape)}')
    if A.shape != (P, E, N) or N & (N - 1):
        raise ConfigError(f'A must be (P={P}, E={E}, N) with N a power of two; '
                          f'got {tuple(A.shape)}')
    if xc.stride(-1) != 1 or x_dbl.stride(-1) != 1 or (delta is not None
                                                        and delta.stride(-1) != 1):
        raise ConfigError('xc, x_dbl and delta need unit stride along their last dimension')
    return P, Bsz, L, E, N, dt_proj_bias.float().contiguous(), A.float().contiguous()


def _check_gaps(gaps: Tensor, P: int, Bsz: int, L: int, device) -> Tensor:
    """ToP's gap counts (P, B or 1, L), checked, as fp32 contiguous on ``device``."""
    if gaps.dim() != 3 or gaps.shape[0] != P or gaps.shape[1] not in (1, Bsz) or \
            gaps.shape[2] != L:
        raise ConfigError(f'gaps must have shape (P={P}, 1 or B={Bsz}, L={L}); '
                          f'got {tuple(gaps.shape)}')
    return gaps.to(device=device, dtype=torch.float32).contiguous()


def _gap_args(gaps: Optional[Tensor], gap_token: bool, xc: Tensor) -> Tuple[Tuple, dict]:
    """The scan kernels' gap operands: ``((pointer, s_gp, s_gb), constexprs)`` for gaps
    matching ``xc`` (P, B, L, E) (None: no gaps)."""
    if gaps is None:
        return (xc, 0, 0), dict(HAS_GAPS=False, GAP_TOKEN=False)
    g = _check_gaps(gaps, *xc.shape[:3], xc.device)
    return (g, g.stride(0), g.stride(1) if g.shape[1] > 1 else 0), dict(
        HAS_GAPS=True, GAP_TOKEN=bool(gap_token))


def _chunk_passes_1_2(chunk_k, carry_k, xc, x_dbl, delta, dtb, A, R, chunk, block_e, warps,
                      gap_args):
    """Passes 1 and 2 of the chunked scan: (P, B, n_chunks, E, N) fp32 initial states."""
    import triton
    P, Bsz, L, E = xc.shape
    N = A.shape[-1]
    nc = triton.cdiv(L, chunk)
    if nc == 1:
        return torch.zeros(P, Bsz, 1, E, N, device=xc.device, dtype=torch.float32)
    states = torch.empty(P, Bsz, nc, E, N, device=xc.device, dtype=torch.float32)
    dsum = torch.empty(P, Bsz, nc - 1, E, device=xc.device, dtype=torch.float32)
    n_eb = triton.cdiv(E, block_e)
    (gap, s_gp, s_gb), gap_flags = gap_args
    # pass 1 over chunks 0 .. nc - 2 (the last chunk's end state starts no chunk)
    chunk_k[(Bsz * (nc - 1), n_eb, P)](
        xc, x_dbl, delta, xc, xc, dtb, A, dtb, xc, states, dsum, gap, L, E, R, nc - 1,
        *xc.stride()[:3], *x_dbl.stride()[:3], *delta.stride()[:3], 0, 0, 0, 0, 0, 0,
        *states.stride()[:3], *dsum.stride()[:3], s_gp, s_gb, N=N, BLOCK_E=block_e, T=chunk,
        OUTPUT=False, num_warps=warps, **gap_flags)
    carry_k[(Bsz, n_eb, P)](states, dsum, A, E, nc, *states.stride()[:3], *dsum.stride()[:3],
                            N=N, BLOCK_E=block_e, num_warps=warps)
    return states


def _scan_block(E: int) -> Tuple[int, int, bool]:
    """(BLOCK_E, num_warps, dt_in_kernel) of the scan kernels for width E."""
    import triton
    block_e, warps, dt_in_kernel = scan_config(E)
    return min(block_e, triton.next_power_of_2(E)), warps, dt_in_kernel


def chunk_initial_states(xc: Tensor, x_dbl: Tensor, delta: Tensor, dt_proj_bias: Tensor,
                         A: Tensor, R: int, chunk: int, gaps: Optional[Tensor] = None,
                         gap_token: bool = False) -> Tensor:
    """The state of every path's scan before the first step of each chunk of ``chunk`` steps.

    The scan is the fused mixer's (and Mamba's): along path p of sample b, at step i,
    ``delta_i = softplus(delta[p, b, i] + dt_proj_bias[p])`` (softplus as mamba: x > 20 -> x)
    and ``h_i = exp(delta_i * A[p]) * h_{i-1} + delta_i * xc[p, b, i, :, None] * B_i[None, :]``
    with ``B_i = x_dbl[p, b, i, R:R + N]`` and ``h_{-1} = 0``. Chunk c holds steps
    ``c * chunk .. min((c + 1) * chunk, L) - 1``. With ``gaps`` (ToP's alignment) the decay
    ``exp(delta_i * A)`` becomes ``exp(delta'_i * A)``, ``delta'_i = delta_i + gaps[p, b, i] *
    s`` with ``s = delta_i`` (``gap_token``) or ``softplus(dt_proj_bias[p])``.

    Args:
        xc: (P, B, L, E) the conv output in path order (the scan's ``u``).
        x_dbl: (P, B, L, R' + 2N (+ pad)) ``x_proj`` output in path order; ``B`` starts at
            column ``R``, ``C`` at ``R + N``.
        delta: (P, B, L, E) ``dt_proj`` output before its bias (no softplus).
        dt_proj_bias: (P, E). A: (P, E, N) real (``-exp(A_log)``), N a power of two.
        R: the column where ``B`` starts in ``x_dbl`` (the padded low rank R').
        chunk: the chunk length T >= 1.
        gaps: (P, B or 1, L) pruned positions before each path position, or None.
        gap_token: a pruned position's step size is the following token's (else the bias's).

    Returns:
        (P, B, ceil(L / chunk), E, N) fp32: ``out[p, b, c] = h_{c * chunk - 1}`` (zero for
        c = 0). Computed in two launches (no autograd): every chunk but the last walked from a
        zero state in parallel (its end state and the sum of its step sizes), then one carry
        over the chunks per (sample, channel block, path): ``H_c = exp(A * sum_{c-1} delta) *
        H_{c-1} + end_{c-1}``. Runs the Triton kernels (CUDA, or the interpreter on CPU
        tensors with ``TRITON_INTERPRET=1``); the accumulation is fp32 whatever the inputs'
        dtype (bf16 / fp32).
    """
    if chunk < 1:
        raise ConfigError(f'chunk must be >= 1; got {chunk}')
    *_, E, _, dtb, A32 = _scan_operands(xc, x_dbl, delta, dt_proj_bias, A, R)
    gap_args = _gap_args(gaps, gap_token, xc)
    _, _, _, _, chunk_k, carry_k = _kernels(xc.device.type != 'cuda')
    block_e, warps, _ = _scan_block(E)
    return _chunk_passes_1_2(chunk_k, carry_k, xc, x_dbl, delta, dtb, A32, R, chunk, block_e,
                             warps, gap_args)


def _check_scan_io(perm: Tensor, y: Tensor, z: Tensor, P: int, Bsz: int, L: int, E: int
                   ) -> Tuple[Tensor, int]:
    """``launch_scan``'s perm (as int32 contiguous, with its batch stride: 0 when shared), y
    and z, checked."""
    perm = perm.to(device=y.device, dtype=torch.int32).contiguous()
    if perm.dim() != 3 or perm.shape[0] != P or perm.shape[1] not in (1, Bsz) or \
            perm.shape[2] != L:
        raise ConfigError(f'perm must have shape (P={P}, 1 or B={Bsz}, L={L}); '
                          f'got {tuple(perm.shape)}')
    if y.shape != (Bsz, L, P * E) or y.stride(-1) != 1 or z.stride(-1) != 1:
        raise ConfigError(f'y must be (B, L, P * E) = {(Bsz, L, P * E)} and y, z need unit '
                          f'stride along the last dimension; got y {tuple(y.shape)}')
    return perm, perm.stride(1) if perm.shape[1] > 1 else 0


def launch_scan(xc: Tensor, x_dbl: Tensor, delta: Optional[Tensor], z: Tensor, perm: Tensor,
                dt_proj_weight: Tensor, dt_proj_bias: Tensor, A: Tensor, D: Tensor, y: Tensor,
                chunk: Optional[int] = None, gaps: Optional[Tensor] = None,
                gap_token: bool = False) -> Tensor:
    """The fused mixer's scan of every path, gated, into token order: fills and returns ``y``.

    ``y[b, perm[p, b, i], p * E + e] = (C_i . h_i[e] + D[p, e] * xc[p, b, i, e]) *
    silu(z[b, perm[p, b, i], e])`` with the state ``h`` of :func:`chunk_initial_states`.

    Args:
        xc: (P, B, L, E) conv output in path order. x_dbl: (P, B, L, R' + 2N (+ pad)).
        delta: (P, B, L, E) ``dt_proj`` output before its bias, or None: formed here as one
            batched matmul ``x_dbl[..., :R'] @ dt_proj_weight^T`` (or, with a scan
            configuration that says so, inside the sequential kernel).
        z: (B, L, E) the gate in token order (any strides with unit stride along E, e.g.
            ``xz[..., E:]``). perm: (P, B or 1, L) int32 token at each path position.
        dt_proj_weight: (P, E, R'); dt_proj_bias: (P, E); A: (P, E, N); D: (P, E).
        y: (B, L, P * E) output (unit stride along the last dimension).
        chunk: which scan: None (automatic: :func:`auto_scan_chunk`, i.e.
            ``AMVIM_FUSED_SCAN_CHUNK`` or :func:`auto_scan_choice`), 0 (the sequential kernel:
            one program per sample, channel block and path walks all L steps) or T > 0 (the
            chunked scan: passes 1 and 2 of :func:`chunk_initial_states`, then every chunk of
            T steps walked in parallel from its initial state, writing the outputs). The
            chunked scan does about twice the sequential one's arithmetic but has
            ``ceil(L / T)`` times its programs: faster where the sequential grid leaves the GPU
            idle (long sequences, small batches).
        gaps, gap_token: ToP's hidden-state alignment, as :func:`chunk_initial_states` takes
            them (gaps (P, B or 1, L) in path order, any float dtype; None: no gaps).
    """
    import triton
    P, Bsz, L, E = xc.shape
    R = dt_proj_weight.shape[-1]
    block_e, warps, dt_in_kernel = _scan_block(E)
    if chunk is None:
        chunk = auto_scan_chunk(Bsz, E, L, P)
    if chunk < 0:
        raise ConfigError(f'chunk must be None, 0 (sequential) or >= 1; got {chunk}')
    if chunk and dt_in_kernel:
        raise ConfigError('the chunked scan reads delta (dt_in_kernel=0); the scan '
                          f'configuration {scan_config(E)} computes it in the kernel')
    if delta is None and not (dt_in_kernel and not chunk):
        delta = torch.bmm(x_dbl.reshape(P, Bsz * L, -1)[..., :R],
                          dt_proj_weight.to(x_dbl.dtype).transpose(1, 2)).view(P, Bsz, L, E)
    *_, dtb, A32 = _scan_operands(xc, x_dbl, delta, dt_proj_bias, A, R)
    perm, s_pb = _check_scan_io(perm, y, z, P, Bsz, L, E)
    gap_args = _gap_args(gaps, gap_token, xc)
    (gap, s_gp, s_gb), gap_flags = gap_args
    D32 = D.float().contiguous()
    _, scan_k, _, _, chunk_k, carry_k = _kernels(xc.device.type != 'cuda')
    if delta is None:
        delta = x_dbl      # unused (dt_proj in the kernel)
    if not chunk:
        scan_k[(Bsz, triton.cdiv(E, block_e), P)](
            xc, x_dbl, delta, z, perm, dt_proj_weight.contiguous(), dtb, A32, D32, y, gap, L,
            E, R, *xc.stride()[:3], *x_dbl.stride()[:3], *delta.stride()[:3], z.stride(0),
            z.stride(1), perm.stride(0), s_pb, y.stride(0), y.stride(1), s_gp, s_gb,
            N=A.shape[-1], BLOCK_E=block_e, BLOCK_R=max(triton.next_power_of_2(R), 2),
            DT_IN_KERNEL=dt_in_kernel, num_warps=warps, **gap_flags)
        return y
    states = _chunk_passes_1_2(chunk_k, carry_k, xc, x_dbl, delta, dtb, A32, R, chunk,
                               block_e, warps, gap_args)
    nc = states.shape[2]
    chunk_k[(Bsz * nc, triton.cdiv(E, block_e), P)](
        xc, x_dbl, delta, z, perm, dtb, A32, D32, y, states, states, gap, L, E, R, nc,
        *xc.stride()[:3], *x_dbl.stride()[:3], *delta.stride()[:3], z.stride(0), z.stride(1),
        perm.stride(0), s_pb, y.stride(0), y.stride(1), *states.stride()[:3], 0, 0, 0, s_gp,
        s_gb, N=A.shape[-1], BLOCK_E=block_e, T=chunk, OUTPUT=True, num_warps=warps,
        **gap_flags)
    return y


def fused_add_rmsnorm(hidden: Tensor, residual: Optional[Tensor], weight: Tensor, eps: float,
                      out_dtype: Optional[torch.dtype] = None, merge=None
                      ) -> Tuple[Tensor, Tensor]:
    """The Vim block's ``residual = residual + hidden; normed = RMSNorm(residual)`` in one pass.

    ``residual`` (fp32) may be None (block 0: the residual is ``hidden``). Returns ``(normed,
    residual)``: the new fp32 residual and the normalised input of the mixer in ``out_dtype``
    (default: the autocast dtype when autocast is on, else the norm weight's dtype, as
    :class:`~amvim_mm.models.vim.norm.RMSNorm` gives). Inference only (no autograd).

    ``merge``: a :class:`~amvim_mm.ops.token_merge.MergePlan` (a ToMe step planned before this
    block): the summed stream is merged in the same pass, so both outputs have the plan's new
    length (:func:`~amvim_mm.ops.token_merge.apply_merge_plan` is the PyTorch equivalent).
    """
    import triton
    *lead, D = hidden.shape
    h = hidden.contiguous()
    r = residual.contiguous() if residual is not None else h
    if out_dtype is None:
        out_dtype = autocast_dtype(hidden.device.type) or weight.dtype
    _, _, k, merge_k, *_ = _kernels(hidden.device.type != 'cuda')
    block_d = triton.next_power_of_2(D)
    if merge is None:
        res = torch.empty(h.shape, device=h.device, dtype=torch.float32)
        out = torch.empty(h.shape, device=h.device, dtype=out_dtype)
        M = h.numel() // D
        block_m = 8
        k[(triton.cdiv(M, block_m), )](h, r, weight, out, res, M, D, float(eps),
                                       HAS_RES=residual is not None, BLOCK_M=block_m,
                                       BLOCK_D=block_d, num_warps=4)
        return out, res
    B, L, _ = h.shape
    L_new, R = merge.rows.shape[1], merge.removed.shape[1]
    res = torch.empty(B, L_new, D, device=h.device, dtype=torch.float32)
    out = torch.empty(B, L_new, D, device=h.device, dtype=out_dtype)
    block_m = 8
    n_blocks = triton.cdiv(L_new, block_m)
    merge_k[(B * n_blocks, )](h, r, weight, out, res, merge.rows, merge.row_coef, merge.removed,
                              merge.rem_tgt, merge.rem_coef, L, L_new, D, R, n_blocks,
                              float(eps), HAS_RES=residual is not None, BLOCK_M=block_m,
                              BLOCK_D=block_d, BLOCK_R=max(triton.next_power_of_2(R), 2),
                              num_warps=4)
    return out, res
