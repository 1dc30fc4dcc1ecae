"""Selective scan (Mamba S6) with three backends, and ToP hidden-state alignment by gap folding.

The math every backend computes (mamba-ssm's ``selective_scan_ref``; here
:func:`selective_scan_ref`, the ground truth of the tests)::

    delta = softplus(delta + delta_bias)          # if delta_softplus
    h_0 = 0
    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t
    y_t = <C_t, h_t> + D * u_t
    y_t = y_t * silu(z_t)                         # if z is given

Shapes follow ``mamba-ssm``: ``u, delta, z`` (batch, E, L); ``A`` (E, N) real; ``B, C``
(batch, N, L), or the grouped form (batch, G, N, L) with E divisible by G (group g serves the
channels ``g * E // G ... (g + 1) * E // G - 1``); ``D, delta_bias`` (E,).

Precision: everything is computed in float32 (float64 inputs stay float64, for tests), whatever
the input dtype; the output is cast back to ``u.dtype``. The last state is returned in the
compute dtype (float32 for float32/bf16/fp16 inputs).

Backends (chosen by :func:`selective_scan_fn`, see :mod:`amvim_mm.ops.backends`):

* ``cuda``: ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (public function only);
* ``cpu``: :func:`~amvim_mm.ops.cpu_ops.selective_scan_cpu`, the compiled CPU kernel
  (inference only);
* ``torch``: :func:`selective_scan_torch`, a parallel associative scan (any device, autograd);
* ``reference``: :func:`selective_scan_ref`, the sequential loop (the ground truth).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from . import backends, cpu_ops
from .mamba_scan import mamba_even_length

__all__ = [
    'selective_scan_ref', 'selective_scan_torch', 'selective_scan_fn', 'aligned_selective_scan',
    'gap_deltas_from_mask', 'kept_indices', 'removal_masked_scan'
]

ScanOut = Union[Tensor, Tuple[Tensor, Tensor]]

# ----------------------------------------------------------------------------------------------
# input checks and preparation
# ----------------------------------------------------------------------------------------------
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for every input dtype except float64 (kept, for precise tests)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_shapes(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                  z: Optional[Tensor], delta_bias: Optional[Tensor]) -> None:
    """Raise ``ValueError`` naming the offending shapes when the inputs do not fit together."""
    if u.dim() != 3:
        raise ConfigError(f'u must have shape (batch, E, L); got {tuple(u.shape)}')
    bsz, dim, length = u.shape
    if delta.shape != u.shape:
        raise ConfigError(
            f'delta must have the shape of u {tuple(u.shape)}; got {tuple(delta.shape)}')
    if A.dim() != 2 or A.shape[0] != dim:
        raise ConfigError(f'A must have shape (E={dim}, N); got {tuple(A.shape)}')
    if A.is_complex():
        raise ConfigError('complex A is not supported; A must be real (A = -exp(A_log))')
    dstate = A.shape[1]
    for name, t in (('B', B), ('C', C)):
        if t.dim() == 3:
            ok = t.shape == (bsz, dstate, length)
        elif t.dim() == 4:
            ok = (t.shape[0] == bsz and t.shape[2:] == (dstate, length) and t.shape[1] > 0
                  and dim % t.shape[1] == 0)
        else:
            ok = False
        if not ok:
            raise ConfigError(
                f'{name} must have shape (batch={bsz}, N={dstate}, L={length}) or '
                f'(batch, G, N, L) with E={dim} divisible by G; got {tuple(t.shape)} '
                f'(u {tuple(u.shape)}, A {tuple(A.shape)})')
    for name, t in (('D', D), ('delta_bias', delta_bias)):
        if t is not None and t.shape != (dim, ):
            raise ConfigError(f'{name} must have shape (E={dim},); got {tuple(t.shape)}')
    if z is not None and z.shape != u.shape:
        raise ConfigError(f'z must have the shape of u {tuple(u.shape)}; got {tuple(z.shape)}')


def _expand_bc(t: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """B or C as (batch, E or 1, N, L) of ``dtype``, broadcasting against (batch, E, N, L)."""
    t = t.to(dtype)
    if t.dim() == 3:
        return t.unsqueeze(1)
    groups = t.shape[1]
    if groups == 1:
        return t
    return t.repeat_interleave(dim // groups, dim=1)


def export_softplus(x: Tensor) -> Tensor:
    """``relu(x) + log(1 + exp(-|x|))`` while an export records (ONNX Runtime's ``Softplus``
    is far slower: benchmarks/README.md), else ``F.softplus``; equal to float rounding."""
    if not runtime.exporting():
        return F.softplus(x)
    return torch.relu(x) + torch.log(1 + torch.exp(-x.abs()))


def _step_sizes(delta: Tensor, delta_bias: Optional[Tensor], delta_softplus: bool,
                ct: torch.dtype) -> Tensor:
    """``softplus(delta + delta_bias)`` (each part optional) in the compute dtype."""
    dt = delta.to(ct)
    if delta_bias is not None:
        dt = dt + delta_bias.to(ct)[:, None]
    return export_softplus(dt) if delta_softplus else dt


def _prepare(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
             z: Optional[Tensor], delta_bias: Optional[Tensor], delta_softplus: bool):
    """Checks, upcasts, and computes the per-step (a_t, b_t) factors of shape (b, E, N, L)."""
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    ct = _compute_dtype(u.dtype)
    dim = u.shape[1]
    uf = u.to(ct)
    dt = _step_sizes(delta, delta_bias, delta_softplus, ct)
    Bf = _expand_bc(B, dim, ct)
    Cf = _expand_bc(C, dim, ct)
    # a_t = exp(delta_t * A) in (0, 1] for A <= 0; b_t = delta_t * B_t * u_t
    a = torch.exp(dt.unsqueeze(2) * A.to(ct)[None, :, :, None])
    b = (dt * uf).unsqueeze(2) * Bf
    return ct, uf, a, b, Cf


def _finish(y: Tensor, uf: Tensor, D: Optional[Tensor], z: Optional[Tensor], ct: torch.dtype,
            out_dtype: torch.dtype) -> Tensor:
    """``(y + D * u) * silu(z)`` in the compute dtype, cast to ``out_dtype``."""
    if D is not None:
        y = y + uf * D.to(ct)[:, None]
    if z is not None:
        y = y * F.silu(z.to(ct))
    return y.to(out_dtype)


# ----------------------------------------------------------------------------------------------
# reference: the sequential loop
# ----------------------------------------------------------------------------------------------
def selective_scan_ref(u: Tensor,
                       delta: Tensor,
                       A: Tensor,
                       B: Tensor,
                       C: Tensor,
                       D: Optional[Tensor] = None,
                       z: Optional[Tensor] = None,
                       delta_bias: Optional[Tensor] = None,
                       delta_softplus: bool = False,
                       return_last_state: bool = False) -> ScanOut:
    """The selective scan as a plain sequential loop over L (the ground truth for tests).

    Args:
        u, delta: (batch, E, L) input and (raw) step size.
        A: (E, N) real state matrix (diagonal), normally negative.
        B, C: (batch, N, L) or (batch, G, N, L) input-dependent projections.
        D: optional (E,) skip connection.
        z: optional (batch, E, L) gate: the output is multiplied by ``silu(z)``.
        delta_bias: optional (E,) added to ``delta`` before the softplus.
        delta_softplus: apply ``softplus`` to ``delta + delta_bias``.
        return_last_state: also return the final state ``h_L`` (batch, E, N) in the compute dtype.

    Returns:
        ``y`` (batch, E, L) of ``u.dtype``, or ``(y, h_L)`` when ``return_last_state``.
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    ct = _compute_dtype(u.dtype)
    bsz, dim, length = u.shape
    uf = u.to(ct)
    dt = _step_sizes(delta, delta_bias, delta_softplus, ct)
    # (batch, E, L, N) factors, so that every step reads contiguous rows of N
    a = torch.exp(dt.unsqueeze(-1) * A.to(ct)[:, None, :])
    b = (dt * uf).unsqueeze(-1) * _expand_bc(B, dim, ct).transpose(-1, -2)
    Cf = _expand_bc(C, dim, ct).transpose(-1, -2).contiguous()  # (batch, 1 or E, L, N)
    h = uf.new_zeros(bsz, dim, A.shape[1])
    ys = []
    for t in range(length):
        h = a[:, :, t] * h + b[:, :, t]
        ys.append((h * Cf[:, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1) if ys else uf.new_zeros(bsz, dim, 0)
    out = _finish(y, uf, D, z, ct, u.dtype)
    return (out, h) if return_last_state else out


# ----------------------------------------------------------------------------------------------
# torch: parallel associative scan
# ----------------------------------------------------------------------------------------------
def _log_step_scan(a: Tensor, b: Tensor, dim: int = -1) -> Tuple[Tensor, Tensor]:
    """Inclusive Hillis-Steele scan of the affine maps ``h -> a * h + b`` along ``dim``.

    Step k combines every element with the one ``s = 2**k`` before it:
    ``a_t <- a_t * a_{t-s}``, ``b_t <- a_t * b_{t-s} + b_t``; elements with ``t < s`` are
    combined with the identity (1, 0), i.e. left unchanged. Only products of factors in
    (0, 1] appear, so nothing overflows however long the sequence or strong the decay.
    Returns ``(prod_{s<=t} a_s, h_t)`` for ``h_{-1} = 0``. Out-of-place (autograd-safe).
    """
    length = a.shape[dim]
    s = 1
    while s < length:
        a_hi, b_hi = a.narrow(dim, s, length - s), b.narrow(dim, s, length - s)
        a_lo, b_lo = a.narrow(dim, 0, length - s), b.narrow(dim, 0, length - s)
        b = torch.cat([b.narrow(dim, 0, s), torch.addcmul(b_hi, a_hi, b_lo)], dim=dim)
        a = torch.cat([a.narrow(dim, 0, s), a_hi * a_lo], dim=dim)
        s *= 2
    return a, b


def _auto_chunk(length: int) -> int:
    """Chunk length for :func:`selective_scan_torch`: about sqrt(L), between 8 and 64."""
    return int(min(64, max(8, math.ceil(math.sqrt(length)))))


def _time_major(x: Tensor, nchunks: int, chunk: int) -> Tensor:
    """(batch, X, L_padded) -> (chunk, nchunks, batch, X): position ``c * chunk + t`` at [t, c].

    Contiguous copy (small tensors): elementwise ops give their outputs the memory layout of
    their inputs, and the big (chunk, nc, batch, E, N) tensors must be time-major in memory.
    """
    return x.reshape(x.shape[0], x.shape[1], nchunks, chunk).permute(3, 2, 0, 1).contiguous()


def _bc_time_major(t: Tensor, dim: int, pad: int, nchunks: int, chunk: int,
                   dtype: torch.dtype) -> Tensor:
    """B or C as (chunk, nchunks, batch, 1 or E, N) of ``dtype``, L padded with zeros."""
    t = _expand_bc(t, dim, dtype)  # (batch, 1 or E, N, L)
    if pad:
        t = F.pad(t, (0, pad))
    bsz, g, n, _ = t.shape
    return t.reshape(bsz, g, n, nchunks, chunk).permute(4, 3, 0, 1, 2).contiguous()


def selective_scan_torch(u: Tensor,
                         delta: Tensor,
                         A: Tensor,
                         B: Tensor,
                         C: Tensor,
                         D: Optional[Tensor] = None,
                         z: Optional[Tensor] = None,
                         delta_bias: Optional[Tensor] = None,
                         delta_softplus: bool = False,
                         return_last_state: bool = False,
                         chunk_size: Optional[int] = None,
                         method: str = 'chunked') -> ScanOut:
    """The selective scan in plain PyTorch, parallel over L (any device, autograd, no overflow).

    Same arguments and results as :func:`selective_scan_ref`, plus the algorithm choice. The
    recurrence is a chain of affine maps ``h -> a_t * h + b_t`` with ``a_t = exp(delta_t * A)``
    in (0, 1] and ``b_t = delta_t * B_t * u_t`` (batch, E, N per step). Both methods multiply
    only factors in (0, 1] (never ``exp(-cumsum(delta * A))``), so nothing overflows for long
    sequences (L = 4096) or strong decays (``A <= 0``, as ``A = -exp(A_log)``). When autograd
    records (grad mode on and an input requires grad) every op is out-of-place; otherwise the
    chunked steps write into buffers.

    ``method='chunked'`` (default): L is cut into ``nc`` chunks of ``chunk_size`` steps
    (default about sqrt(L), 8..64; L padded with identity steps ``(1, 0)``), laid out
    time-major as (chunk, nc, batch, E, N) so that every step is one contiguous block.
    Pass 1 runs the ``chunk_size`` steps of all chunks at once (each op on nc * batch * E * N
    numbers) from a zero state, giving every chunk's end state and decay product; the chunk
    summaries are composed across chunks by the log-step scan (:func:`_log_step_scan`, a
    tensor ``chunk_size`` times smaller); pass 2 reruns the chunk steps from the true entry
    states and contracts each step with C. Work O(L), ``2 * chunk_size`` Python-level steps.

    ``method='logstep'``: one Hillis-Steele scan over the whole L (log2(L) passes over the
    (batch, E, N, L) tensor, O(L log L) work).

    Choice (``tools/benchmark_scan.py`` for the Vim-T shape; timings in
    ``benchmarks/scan_cpu.json`` and benchmarks/README.md): the scan is memory-bound on the
    CPU. ``logstep`` moves log2(L) times the bytes and was slower than the sequential
    reference, and its autograd keeps log2(L) full-size tensors. ``chunked`` moves about as
    many bytes as the reference but in large multi-threaded ops and few Python steps: faster
    than the reference, forward and backward. Also tried and dropped: log-step inside chunks
    with a carry across chunks, and (batch, E, N, L)-major layouts (strided steps).
    ``logstep`` stays as an option.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ConfigError(f'chunk_size must be a positive int or None; got {chunk_size}')
    if method not in ('chunked', 'logstep'):
        raise ConfigError(f'method must be "chunked" or "logstep"; got {method!r}')
    if method == 'logstep':
        ct, uf, a, b, Cf = _prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
        if u.shape[-1] == 0:
            y, h_last = uf.new_zeros(u.shape), uf.new_zeros(*u.shape[:2], A.shape[1])
        else:
            _, h = _log_step_scan(a, b)
            y, h_last = (h * Cf).sum(2), h[..., -1]
        out = _finish(y, uf, D, z, ct, u.dtype)
        return (out, h_last) if return_last_state else out
    return _scan_chunked(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                         return_last_state, chunk_size)


def _scan_chunked(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                  D: Optional[Tensor], z: Optional[Tensor], delta_bias: Optional[Tensor],
                  delta_softplus: bool, return_last_state: bool, chunk_size: Optional[int]
                  ) -> ScanOut:
    """:func:`selective_scan_torch`'s ``method='chunked'``."""
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    ct = _compute_dtype(u.dtype)
    export = runtime.exporting()
    bsz, dim, length = u.shape
    if export:   # the chunk plan is unrolled for the export's length; the batch stays traced
        dim, length = runtime.static_int(dim), runtime.static_int(length)
    dstate = A.shape[1]
    uf = u.to(ct)
    if length == 0:
        out = _finish(uf.new_zeros(u.shape), uf, D, z, ct, u.dtype)
        return (out, uf.new_zeros(bsz, dim, dstate)) if return_last_state else out
    dt = _step_sizes(delta, delta_bias, delta_softplus, ct)
    chunk = min(chunk_size or _auto_chunk(length), length)
    nchunks = -(-length // chunk)
    pad = nchunks * chunk - length
    du = dt * uf
    if pad:  # identity steps: a = exp(0) = 1, b = 0
        dt, du = F.pad(dt, (0, pad)), F.pad(du, (0, pad))
    # (chunk, nc, batch, E, N): contiguous per step t. exp_ on the fresh product is
    # autograd-safe (mul saves its inputs, exp_ its result)
    dt_tm = _time_major(dt, nchunks, chunk)  # (chunk, nc, batch, E)
    a = (dt_tm.unsqueeze(-1) * A.to(ct)).exp_()
    b = _time_major(du, nchunks, chunk).unsqueeze(-1) * _bc_time_major(
        B, dim, pad, nchunks, chunk, ct)
    Cl = _bc_time_major(C, dim, pad, nchunks, chunk, ct)  # (chunk, nc, batch, 1|E, N)
    # without autograd, the steps write into buffers (no allocation per step)
    inplace = not export and not (torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (u, delta, A, B, C, D, z, delta_bias)))
    hs, h_end = _chunk_passes(a, b, torch.exp(dt_tm.sum(0).unsqueeze(-1) * A.to(ct)), chunk,
                              inplace)
    # contract with C: (..., E, N) @ (..., N, 1), or a product-sum for grouped C
    if Cl.shape[3] == 1:
        y = torch.matmul(hs, Cl.transpose(-1, -2)).squeeze(-1)
    else:
        y = (hs * Cl).sum(-1)  # (chunk, nc, batch, E)
    y = y.permute(2, 3, 1, 0).reshape(bsz, dim, nchunks * chunk)[..., :length]
    out = _finish(y, uf, D, z, ct, u.dtype)
    return (out, h_end[-1]) if return_last_state else out


def _chunk_passes(a: Tensor, b: Tensor, p: Tensor, chunk: int, inplace: bool
                  ) -> Tuple[Tensor, Tensor]:
    """The chunked scan's two passes over time-major ``a``, ``b`` (chunk, nc, batch, E, N)
    with ``p`` (nc, batch, E, N) each chunk's decay product: every step's state (chunk, nc,
    batch, E, N) and the true state at every chunk end (nc, batch, E, N). ``inplace``: no
    autograd (the states overwrite ``b``)."""
    # per-step views via unbind: its backward is one stack (indexing a[t] would add a
    # full-size zero tensor per step to the backward, quadratic in the chunk length)
    a_t, b_t = a.unbind(0), b.unbind(0)
    # pass 1: every chunk from a zero state -> local end state; its decay product in closed
    # form exp(A * sum(delta)) (exponent <= 0: no overflow)
    h = b_t[0].clone() if inplace else b_t[0]
    for t in range(1, chunk):
        h = torch.addcmul(b_t[t], a_t[t], h, out=h) if inplace else torch.addcmul(
            b_t[t], a_t[t], h)
    # compose the chunk summaries across chunks: the true state at every chunk end
    _, h_end = _log_step_scan(p, h, dim=0)  # (nc, batch, E, N)
    h = torch.cat([torch.zeros_like(h_end[:1]), h_end[:-1]], dim=0)  # entry states
    # pass 2: rerun the chunk steps from the entry states (in place: h_t overwrites b_t)
    if inplace:
        for t in range(chunk):
            h = torch.addcmul(b_t[t], a_t[t], h, out=b_t[t])
        return b, h_end
    hs = []
    for t in range(chunk):
        h = torch.addcmul(b_t[t], a_t[t], h)
        hs.append(h)
    return torch.stack(hs, dim=0), h_end


# ----------------------------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------------------------
def _cpu_kernel_misfit(*tensors: Optional[Tensor]) -> Optional[str]:
    """Why the compiled CPU kernel cannot take these inputs (``None`` if it can): it has no
    backward, computes in float32 and takes B / C groups of whole vectors of channels."""
    present = [t for t in tensors if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in present):
        return 'it has no backward (an input requires grad); use "torch" for training'
    if any(t.dtype == torch.float64 for t in present):
        return 'it computes in float32 (float64 inputs)'
    if cpu_ops.tracing():
        return 'a trace or compile is recording (the kernel has no meta implementation)'
    u, B = tensors[0], tensors[3]
    if B.dim() == 4 and not cpu_ops.grouping_fits(u.shape[1], B.shape[1]):
        return (f'it takes B / C groups of a multiple of {cpu_ops.vector_width()} channels '
                f'(E {u.shape[1]}, {B.shape[1]} groups)')
    return None


def selective_scan_fn(u: Tensor,
                      delta: Tensor,
                      A: Tensor,
                      B: Tensor,
                      C: Tensor,
                      D: Optional[Tensor] = None,
                      z: Optional[Tensor] = None,
                      delta_bias: Optional[Tensor] = None,
                      delta_softplus: bool = False,
                      return_last_state: bool = False,
                      backend: Optional[str] = None) -> ScanOut:
    """The selective scan on the chosen backend (same arguments as :func:`selective_scan_ref`).

    ``backend``: ``None`` (use the environment variable ``AMVIM_SCAN_BACKEND``, default
    ``auto``), ``'auto'`` (``cuda`` for CUDA tensors when mamba-ssm imports; for CPU tensors
    ``cpu`` when the compiled kernel is built and the call records no autograd graph, else
    ``torch``), ``'cuda'``, ``'cpu'``, ``'torch'`` or ``'reference'``. An unknown name raises
    ``ValueError``; ``'cuda'`` without mamba-ssm or with CPU tensors, ``'cpu'`` without the
    built kernel or under autograd raise ``RuntimeError``. The choice is logged once per
    backend (logger ``amvim_mm``, level INFO).
    """
    name = backends.resolve_scan_backend(
        u.is_cuda, backend, None if u.is_cuda else _cpu_kernel_misfit(u, delta, A, B, C, D, z,
                                                                     delta_bias))
    backends.log_choice_once('selective_scan', name)
    if name in ('cuda', 'cpu'):
        _check_shapes(u, delta, A, B, C, D, z, delta_bias)
        if name == 'cuda':
            return mamba_even_length(backends.mamba_selective_scan()[0], u, delta, A, B, C, D,
                                     z, delta_bias, delta_softplus, return_last_state)
        return cpu_ops.selective_scan_cpu(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                          return_last_state)
    impl = selective_scan_torch if name == 'torch' else selective_scan_ref
    return impl(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias,
                delta_softplus=delta_softplus, return_last_state=return_last_state)


# ----------------------------------------------------------------------------------------------
# ToP hidden-state alignment by gap folding
# ----------------------------------------------------------------------------------------------
def aligned_selective_scan(u: Tensor,
                           delta: Tensor,
                           A: Tensor,
                           B: Tensor,
                           C: Tensor,
                           D: Optional[Tensor] = None,
                           z: Optional[Tensor] = None,
                           delta_bias: Optional[Tensor] = None,
                           gap_delta: Optional[Tensor] = None,
                           backend: Optional[str] = None) -> Tensor:
    """Scan the kept tokens as if the pruned ones were still there with zero input.

    ToP-ViM's hidden-state alignment: in this path's order, a pruned position ``g`` contributes
    the step ``(exp(delta_g * A), 0)``. Consecutive steps with zero input compose into one decay
    ``exp((sum_g delta_g) * A)``, so for the kept token ``k`` that follows the gap ``G``::

        d_k  = softplus(delta_k + delta_bias)
        d'_k = d_k + sum_{g in G} delta_g          (= d_k + gap_delta_k)
        u'_k = u_k * d_k / d'_k                    (so that d'_k * u'_k = d_k * u_k)

    and the scan of ``(u', d')`` with ``delta_softplus=False, D=None, z=None`` gives exactly the
    full-length scan read at the kept positions; ``(y + D * u) * silu(z)`` is added outside.
    Works on every backend, the CUDA kernel included, with no kernel change.

    Args:
        u, delta, z: (batch, E, L_kept) kept tokens in this path's order; ``delta`` is the RAW
            (pre-softplus) step size.
        A, B, C, D, delta_bias: as in :func:`selective_scan_ref` (B, C over the kept tokens).
        gap_delta: (batch, E, L_kept) (or broadcastable) sum of the softplus'ed deltas of the
            pruned positions immediately preceding each kept token in this path's order (0 where
            there is no gap); see :func:`gap_deltas_from_mask`. ``None`` means no gaps.
        backend: as in :func:`selective_scan_fn`.

    Returns:
        ``y`` (batch, E, L_kept) of ``u.dtype``. The scan itself runs in float32 (float64 for
        float64 inputs): ``u'``, ``d'``, ``B`` and ``C`` are passed to the backend upcast, so a
        bf16 model does not round the folded step sizes to bf16.
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    ct = _compute_dtype(u.dtype)
    uf = u.to(ct)
    d = delta.to(ct)
    if delta_bias is not None:
        d = d + delta_bias.to(ct)[:, None]
    d = F.softplus(d)
    if gap_delta is None:
        d2, u2 = d, uf
    else:
        try:
            torch.broadcast_shapes(gap_delta.shape, u.shape)
        except RuntimeError:
            raise ConfigError(f'gap_delta must broadcast to the shape of u {tuple(u.shape)}; '
                              f'got {tuple(gap_delta.shape)}') from None
        d2 = d + gap_delta.to(ct)
        # d' >= d >= 0; d' == 0 only when d == 0, where u' does not matter (d' * u' = 0)
        u2 = uf * (d / d2.clamp_min(torch.finfo(ct).tiny))
    y = selective_scan_fn(u2, d2, A.to(ct), B.to(ct), C.to(ct), None, None, None,
                          delta_softplus=False, return_last_state=False, backend=backend)
    return _finish(y.to(ct), uf, D, z, ct, u.dtype)


def removal_masked_scan(u: Tensor,
                        delta: Tensor,
                        A: Tensor,
                        B: Tensor,
                        C: Tensor,
                        mask: Tensor,
                        D: Optional[Tensor] = None,
                        z: Optional[Tensor] = None,
                        delta_bias: Optional[Tensor] = None,
                        backend: Optional[str] = None) -> Tensor:
    """The scan with **removal** masks: a step whose mask is 0 is the identity.

    ``delta_t <- m_t * softplus(delta_t + delta_bias)`` and ``u_t <- m_t * u_t``: a removed step
    has ``exp(0 * A) = 1`` and no input, so every kept step sees exactly the scan of the
    sequence with the removed tokens deleted (physical pruning), and padding a shorter sequence
    with removed steps anywhere (start, middle or end, in either scan direction) leaves its
    outputs unchanged. This is how a learned reducer's hard masks enter a scan in training
    (the gradient reaches ``mask`` through both products: a straight-through estimator gives
    the predictor its signal) and how variable-length batches can be scanned exactly. (ToP's
    **alignment** semantics, a removed step that still decays the state, is the other exact
    choice: zero the token's features before ``x_proj``, see :func:`aligned_selective_scan`.)

    Args:
        u, delta, z, A, B, C, D, delta_bias: as in :func:`selective_scan_ref` (``delta`` raw,
            pre-softplus).
        mask: (batch, L) keep mask (1 kept, 0 removed; float for a straight-through gradient,
            or bool).

    Returns:
        ``y`` (batch, E, L) of ``u.dtype``; removed positions carry no ``D * u`` term and their
        outputs are not meaningful (the state passes through them unchanged).
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    if mask.dim() != 2 or mask.shape != (u.shape[0], u.shape[-1]):
        raise ConfigError(f'mask must be (batch, L) = {(u.shape[0], u.shape[-1])}, got '
                          f'{tuple(mask.shape)}')
    ct = _compute_dtype(u.dtype)
    m = mask.to(ct)[:, None, :]
    d = _step_sizes(delta, delta_bias, True, ct) * m
    uf = u.to(ct) * m
    y = selective_scan_fn(uf, d, A.to(ct), B.to(ct), C.to(ct), None, None, None,
                          delta_softplus=False, return_last_state=False, backend=backend)
    return _finish(y.to(ct), uf, D, z, ct, u.dtype)


def kept_indices(keep_mask: Tensor) -> Tensor:
    """Positions of the kept tokens, ascending, as a (batch, K) long tensor.

    ``keep_mask`` is (batch, L) bool. Every sample must keep the same number K of tokens
    (``ValueError`` otherwise), which is how the reducers of this project prune.
    """
    if keep_mask.dim() != 2 or keep_mask.dtype != torch.bool:
        raise ConfigError(f'keep_mask must be a (batch, L) bool tensor; got {keep_mask.dtype} '
                          f'{tuple(keep_mask.shape)}')
    counts = keep_mask.sum(1)
    if counts.numel() and not bool((counts == counts[0]).all()):
        raise ConfigError('every sample must keep the same number of tokens; kept counts per '
                          f'sample: {counts.tolist()}')
    k = int(counts[0]) if counts.numel() else 0
    pos = torch.arange(keep_mask.shape[1], device=keep_mask.device).expand_as(keep_mask)
    return pos[keep_mask].view(keep_mask.shape[0], k)


def gap_deltas_from_mask(keep_mask: Tensor, pruned_delta: Tensor) -> Tensor:
    """Per kept token, the sum of the pruned deltas of the gap just before it (one path).

    Args:
        keep_mask: (batch, L_full) bool, in THIS path's order (flip it for a reversed path),
            True where the token is kept. Every sample must keep the same number K of tokens
            (the count may differ between calls, not between samples of one batch):
            ``ValueError`` otherwise.
        pruned_delta: softplus'ed step size of every position, broadcastable to
            (batch, E, L_full), e.g. (E,) ``softplus(dt_bias)`` (the project's default) or a
            full (batch, E, L_full) tensor in this path's order; values at kept positions are
            ignored.

    Returns:
        (batch, E, K) in the dtype of ``pruned_delta`` (at least float32): entry ``j`` is the
        sum of ``pruned_delta`` over the pruned positions between kept token ``j - 1`` (or the
        start) and kept token ``j``, summed exactly in position order (no cumsum differences).
        Pruned positions after the last kept token affect no kept output and are dropped.
    """
    if keep_mask.dim() != 2 or keep_mask.dtype != torch.bool:
        raise ConfigError(f'keep_mask must be a (batch, L) bool tensor; got {keep_mask.dtype} '
                          f'{tuple(keep_mask.shape)}')
    bsz, length = keep_mask.shape
    if pruned_delta.dim() == 1:
        pruned_delta = pruned_delta[:, None]
    try:
        shape = torch.broadcast_shapes(pruned_delta.shape, (bsz, 1, length))
    except RuntimeError:
        raise ConfigError(f'pruned_delta {tuple(pruned_delta.shape)} does not broadcast to '
                          f'(batch={bsz}, E, L={length}) of keep_mask {tuple(keep_mask.shape)}'
                          ) from None
    if len(shape) != 3:
        raise ConfigError(f'pruned_delta must broadcast to (batch, E, L); got '
                          f'{tuple(pruned_delta.shape)}')
    k = kept_indices(keep_mask).shape[1]
    dtype = torch.promote_types(pruned_delta.dtype, torch.float32)
    vals = (pruned_delta.to(dtype) * (~keep_mask).to(dtype)[:, None, :]).expand(shape)
    # gap id of position t = number of kept tokens strictly before t (kept token j has id j,
    # with a zero value); pruned positions after the last kept token get id K (dropped)
    keep_l = keep_mask.long()
    seg = (keep_l.cumsum(1) - keep_l)[:, None, :].expand(shape)
    out = vals.new_zeros(shape[0], shape[1], k + 1).scatter_add(2, seg, vals)
    return out[..., :k]
