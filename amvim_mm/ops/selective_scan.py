"""Selective scan (Mamba S6) with three backends, and ToP hidden-state alignment by gap folding.

The math every backend computes (``docs``: /work/shared/spec/models.md, "Selective scan")::

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
* ``torch``: :func:`selective_scan_torch`, a parallel associative scan (any device, autograd);
* ``reference``: :func:`selective_scan_ref`, the sequential loop (the ground truth).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import backends

__all__ = [
    'selective_scan_ref', 'selective_scan_torch', 'selective_scan_fn', 'aligned_selective_scan',
    'gap_deltas_from_mask', 'kept_indices'
]

ScanOut = Union[Tensor, Tuple[Tensor, Tensor]]

#: default chunk length of :func:`selective_scan_torch` (see its docstring for the measurement).
DEFAULT_CHUNK_SIZE = 64


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
        raise ValueError(f'u must have shape (batch, E, L); got {tuple(u.shape)}')
    bsz, dim, length = u.shape
    if delta.shape != u.shape:
        raise ValueError(
            f'delta must have the shape of u {tuple(u.shape)}; got {tuple(delta.shape)}')
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f'A must have shape (E={dim}, N); got {tuple(A.shape)}')
    if A.is_complex():
        raise ValueError('complex A is not supported; A must be real (A = -exp(A_log))')
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
            raise ValueError(
                f'{name} must have shape (batch={bsz}, N={dstate}, L={length}) or '
                f'(batch, G, N, L) with E={dim} divisible by G; got {tuple(t.shape)} '
                f'(u {tuple(u.shape)}, A {tuple(A.shape)})')
    for name, t in (('D', D), ('delta_bias', delta_bias)):
        if t is not None and t.shape != (dim, ):
            raise ValueError(f'{name} must have shape (E={dim},); got {tuple(t.shape)}')
    if z is not None and z.shape != u.shape:
        raise ValueError(f'z must have the shape of u {tuple(u.shape)}; got {tuple(z.shape)}')


def _expand_bc(t: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """B or C as a (batch, E or 1, N, L) tensor of ``dtype`` that broadcasts against (b, E, N, L)."""
    t = t.to(dtype)
    if t.dim() == 3:
        return t.unsqueeze(1)
    groups = t.shape[1]
    if groups == 1:
        return t
    return t.repeat_interleave(dim // groups, dim=1)


def _prepare(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
             z: Optional[Tensor], delta_bias: Optional[Tensor], delta_softplus: bool):
    """Checks, upcasts, and computes the per-step (a_t, b_t) factors of shape (b, E, N, L)."""
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    ct = _compute_dtype(u.dtype)
    dim = u.shape[1]
    uf = u.to(ct)
    dt = delta.to(ct)
    if delta_bias is not None:
        dt = dt + delta_bias.to(ct)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
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
    ct, uf, a, b, Cf = _prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    bsz, dim, length = u.shape
    h = uf.new_zeros(bsz, dim, A.shape[1])
    ys = []
    for t in range(length):
        h = a[..., t] * h + b[..., t]
        ys.append((h * Cf[..., t]).sum(-1))
    y = torch.stack(ys, dim=-1) if ys else uf.new_zeros(bsz, dim, 0)
    out = _finish(y, uf, D, z, ct, u.dtype)
    return (out, h) if return_last_state else out


# ----------------------------------------------------------------------------------------------
# torch: parallel associative scan
# ----------------------------------------------------------------------------------------------
def _log_step_scan(a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor]:
    """Inclusive Hillis-Steele scan of the affine maps ``h -> a * h + b`` along the last dim.

    Step k combines every element with the one ``s = 2**k`` before it:
    ``a_t <- a_t * a_{t-s}``, ``b_t <- a_t * b_{t-s} + b_t``; elements with ``t < s`` are
    combined with the identity (1, 0), i.e. left unchanged. Only products of factors in
    (0, 1] appear, so nothing overflows however long the sequence or strong the decay.
    Returns ``(prod_{s<=t} a_s, h_t)`` for ``h_{-1} = 0``. Out-of-place (autograd-safe).
    """
    length = a.shape[-1]
    s = 1
    while s < length:
        a_hi, b_hi = a[..., s:], b[..., s:]
        b = torch.cat([b[..., :s], torch.addcmul(b_hi, a_hi, b[..., :-s])], dim=-1)
        a = torch.cat([a[..., :s], a_hi * a[..., :-s]], dim=-1)
        s *= 2
    return a, b


def _chunked_scan(a: Tensor, b: Tensor, chunk: int) -> Tuple[Tensor, Tensor]:
    """Two-level scan: log-step scan inside chunks of ``chunk`` steps, then the chunk-end
    states are carried across chunks (a log-step scan over the chunk summaries), then each
    chunk's local states get ``prod(a) * h_carry`` added. Returns ``h`` (..., L) and ``h_L``.
    """
    length = a.shape[-1]
    if length <= chunk:
        _, h = _log_step_scan(a, b)
        return h, h[..., -1]
    nchunks = -(-length // chunk)
    pad = nchunks * chunk - length
    if pad:  # pad with the identity step (1, 0): changes no state
        a = F.pad(a, (0, pad), value=1.0)
        b = F.pad(b, (0, pad), value=0.0)
    lead = a.shape[:-1]
    a = a.reshape(*lead, nchunks, chunk)
    b = b.reshape(*lead, nchunks, chunk)
    pa, hb = _log_step_scan(a, b)  # local: state from h = 0 at each chunk start
    # carry: the state at the end of every chunk, from the chunk summaries (pa[-1], hb[-1])
    _, h_end = _log_step_scan(pa[..., -1], hb[..., -1])  # (..., nchunks)
    h_in = F.pad(h_end[..., :-1], (1, 0), value=0.0)  # state entering each chunk
    h = torch.addcmul(hb, pa, h_in.unsqueeze(-1)).reshape(*lead, nchunks * chunk)
    return h[..., :length], h_end[..., -1]


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
                         chunk_size: Optional[int] = DEFAULT_CHUNK_SIZE) -> ScanOut:
    """The selective scan as a parallel associative scan in PyTorch (any device, autograd).

    Same arguments and results as :func:`selective_scan_ref`. The recurrence is a chain of
    affine maps ``h -> a_t * h + b_t`` with ``a_t = exp(delta_t * A)`` in (0, 1] and
    ``b_t = delta_t * B_t * u_t``, both (batch, E, N, L). They are composed by a log-step
    (Hillis-Steele) scan that multiplies only factors in (0, 1]: unlike the closed form with
    ``exp(-cumsum(delta * A))``, nothing overflows for long sequences (L = 4096) or strong
    decays. Then ``y = sum_N C * h + D * u`` and ``y * silu(z)``.

    Chunking (``chunk_size``): the scan runs inside chunks of ``chunk_size`` steps (log2 of it
    passes over the (b, E, N, L) tensor instead of log2(L)), the chunk-end states are scanned
    across chunks (a tensor ``chunk_size`` times smaller), and one fused multiply-add carries
    them into every chunk. Measured on 2 CPU cores (torch 2.14, fp32, forward, E=384, N=16):
    64 is the best or within noise of the best for L = 197 (Vim-T) and clearly best for long
    sequences (L = 4096: fewer full-size passes, less autograd memory); ``None`` or a value
    ``>= L`` scans the whole sequence in one log-step scan.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f'chunk_size must be a positive int or None; got {chunk_size}')
    ct, uf, a, b, Cf = _prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    bsz, dim, length = u.shape
    if length == 0:
        y = uf.new_zeros(bsz, dim, 0)
        h_last = uf.new_zeros(bsz, dim, A.shape[1])
    else:
        h, h_last = _chunked_scan(a, b, chunk_size if chunk_size else length)
        y = (h * Cf).sum(2)
    out = _finish(y, uf, D, z, ct, u.dtype)
    return (out, h_last) if return_last_state else out


# ----------------------------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------------------------
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
    ``auto``), ``'auto'`` (``cuda`` for CUDA tensors when mamba-ssm imports, else ``torch``),
    ``'cuda'``, ``'torch'`` or ``'reference'``. An unknown name raises ``ValueError``;
    ``'cuda'`` without mamba-ssm or with CPU tensors raises ``RuntimeError``. The choice is
    logged once per backend (logger ``amvim_mm``, level INFO).
    """
    name = backends.resolve_scan_backend(u.is_cuda, backend)
    backends.log_choice_once('selective_scan', name)
    if name == 'cuda':
        fn = backends.mamba_selective_scan()[0]
        _check_shapes(u, delta, A, B, C, D, z, delta_bias)
        return fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
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
            raise ValueError(f'gap_delta must broadcast to the shape of u {tuple(u.shape)}; '
                             f'got {tuple(gap_delta.shape)}') from None
        d2 = d + gap_delta.to(ct)
        # d' >= d >= 0; d' == 0 only when d == 0, where u' does not matter (d' * u' = 0)
        u2 = uf * (d / d2.clamp_min(torch.finfo(ct).tiny))
    y = selective_scan_fn(u2, d2, A.to(ct), B.to(ct), C.to(ct), None, None, None,
                          delta_softplus=False, return_last_state=False, backend=backend)
    return _finish(y.to(ct), uf, D, z, ct, u.dtype)


def kept_indices(keep_mask: Tensor) -> Tensor:
    """Positions of the kept tokens, ascending, as a (batch, K) long tensor.

    ``keep_mask`` is (batch, L) bool. Every sample must keep the same number K of tokens
    (``ValueError`` otherwise), which is how the reducers of this project prune.
    """
    if keep_mask.dim() != 2 or keep_mask.dtype != torch.bool:
        raise ValueError(f'keep_mask must be a (batch, L) bool tensor; got {keep_mask.dtype} '
                         f'{tuple(keep_mask.shape)}')
    counts = keep_mask.sum(1)
    if counts.numel() and not bool((counts == counts[0]).all()):
        raise ValueError('every sample must keep the same number of tokens; kept counts per '
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
        raise ValueError(f'keep_mask must be a (batch, L) bool tensor; got {keep_mask.dtype} '
                         f'{tuple(keep_mask.shape)}')
    bsz, length = keep_mask.shape
    if pruned_delta.dim() == 1:
        pruned_delta = pruned_delta[:, None]
    try:
        shape = torch.broadcast_shapes(pruned_delta.shape, (bsz, 1, length))
    except RuntimeError:
        raise ValueError(f'pruned_delta {tuple(pruned_delta.shape)} does not broadcast to '
                         f'(batch={bsz}, E, L={length}) of keep_mask {tuple(keep_mask.shape)}'
                         ) from None
    if len(shape) != 3:
        raise ValueError(f'pruned_delta must broadcast to (batch, E, L); got '
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
