"""The mLSTM cell of Vision-LSTM (ViL): the parallel (quadratic) form and a chunkwise form.

For one head, queries ``q``, keys ``k``, values ``v`` (S, DH) and gate pre-activations ``i``
(input) and ``f`` (forget) over the S steps, with ``F_t = sum_{s <= t} logsigmoid(f_s)``:

    log D[t, j] = F_t - F_j + i_j  (j <= t, else -inf),   m_t = max_j log D[t, j]
    C[t, j]     = (q_t . k_j / sqrt(DH)) exp(log D[t, j] - m_t)
    h_t         = sum_j C[t, j] v_j / (max(|sum_j C[t, j]|, exp(-m_t)) + eps)

This is the official ViL's ``parallel_stabilized_simple`` (row-wise stabilisation): an
exponential input gate, a sigmoid forget gate multiplied up in log space, a causal mask, the
row maximum ``m_t`` subtracted before ``exp`` so that no exponent is positive.

* :func:`mlstm_parallel`: the formula above as written, memory (B, NH, S, S).
* :func:`mlstm_chunkwise`: the same ``h`` with memory linear in S. The sequence is cut into
  chunks of ``chunk`` steps; inside a chunk the parallel form, across chunks a recurrent state
  ``(C, n, m)`` (C = sum_j w_j k_j v_j^T, n = sum_j w_j k_j, stored divided by ``exp(m)``,
  ``m`` the exact running maximum of the log weights), so every row gets the same ``m_t`` as in
  the parallel form and hence the same normaliser.
* :func:`mlstm_triton`: the parallel form as one fused Triton kernel (:mod:`._mlstm_kernels`),
  nothing S x S in memory; inference only (no backward). It runs on CUDA tensors, and on CPU
  tensors in Triton's interpreter when ``TRITON_INTERPRET=1`` is set before Python starts
  (tests); :func:`mlstm_parallel` is its reference.
* the compiled CPU cell (:func:`amvim_mm.ops.cpu_ops.mlstm`, ``csrc/cpu_mlstm.cpp``): the
  parallel form in row blocks, the gate weights, mask and row sums in one loop between two
  matrix products; float32 CPU inference; :func:`mlstm_parallel` is its reference.
* :func:`mlstm`: picks one of them (see its docstring).

All accumulate in fp32 (fp64 stays fp64) and return the dtype of ``q``. Gate pre-activations
are (B, NH, S, 1), as in the official code.
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import ConfigError
from . import cpu_ops
from .triton_loader import jit_kernels

__all__ = ['mlstm', 'mlstm_parallel', 'mlstm_chunkwise', 'mlstm_triton', 'PARALLEL_MAX_LEN',
           'CUDA_PARALLEL_MAX_LEN', 'DEFAULT_CHUNK', 'KERNEL_MAX_DH', 'kernel_misfit',
           'cpu_kernel_misfit']

# Automatic choice of :func:`mlstm` without the kernel: the quadratic form up to two chunks'
# worth of steps, beyond it the chunkwise form with DEFAULT_CHUNK steps per chunk. On CPU (fp32,
# DH 96) the chunkwise form with 64-step chunks was as fast as the parallel one at S ~ 200 and
# much faster at long sequences, where the elementwise work on the S x S matrix dominates the
# parallel form (timings: benchmarks/README.md, issue 38). On CUDA (training, fp64) the
# parallel form up to CUDA_PARALLEL_MAX_LEN steps (a 16 x 16 grid): there the chunk loop's
# many small launches likely cost more than the S x S passes; not yet measured.
DEFAULT_CHUNK = 64
PARALLEL_MAX_LEN = 2 * DEFAULT_CHUNK
CUDA_PARALLEL_MAX_LEN = 256
# The fused kernel: 16/32-bit floats, head dims up to KERNEL_MAX_DH (padded to a power of two
# inside). Launch (rows and keys per block, warps, pipeline stages) per input dtype: chosen so
# that sm_90 code for DH 96 (padded to 128) keeps everything in registers (ptxas, no spills);
# not yet timed.
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KERNEL_MAX_DH = 256
KERNEL_LAUNCH = {torch.float16: (64, 8, 3), torch.bfloat16: (64, 8, 3), torch.float32: (32, 4, 2)}


def _check(q: Tensor, k: Tensor, v: Tensor, igate: Tensor, fgate: Tensor) -> None:
    """One-line :class:`ConfigError` for inputs the cell cannot use."""
    names = (('q', q), ('k', k), ('v', v), ('igate_preact', igate), ('fgate_preact', fgate))
    for name, t in names:
        if not isinstance(t, Tensor) or t.dim() != 4 or not t.is_floating_point():
            desc = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ConfigError(f'mlstm: {name} must be a 4-D floating tensor, got {desc}')
    shape = tuple(q.shape)
    if tuple(k.shape) != shape or tuple(v.shape[:3]) != shape[:3]:
        raise ConfigError(f'mlstm: q, k (B, NH, S, DH) and v (B, NH, S, DHV) disagree: '
                          f'q {shape}, k {tuple(k.shape)}, v {tuple(v.shape)}')
    for name, t in names[3:]:
        if tuple(t.shape) != shape[:3] + (1,):
            raise ConfigError(f'mlstm: {name} must be (B, NH, S, 1) = {shape[:3] + (1,)}, '
                              f'got {tuple(t.shape)}')
    if len({t.device for _, t in names}) != 1:
        raise ConfigError('mlstm: q, k, v and the gates must be on one device')


def _compute_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _normalise(num: Tensor, nsum: Tensor, m: Tensor, eps: float) -> Tensor:
    """``num / (max(|nsum|, exp(-m)) + eps)``, the official normaliser."""
    return num / (torch.maximum(nsum.abs(), torch.exp(-m)) + eps)


def mlstm_parallel(q: Tensor, k: Tensor, v: Tensor, igate_preact: Tensor, fgate_preact: Tensor,
                   eps: float = 1e-6) -> Tensor:
    """The mLSTM cell in parallel stabilised form (the official ``parallel_stabilized_simple``).

    q, k (B, NH, S, DH), v (B, NH, S, DHV), gates (B, NH, S, 1) -> h (B, NH, S, DHV) in the
    dtype of ``q``; memory quadratic in S.
    """
    _check(q, k, v, igate_preact, fgate_preact)
    out, ct = q.dtype, _compute_dtype(q)
    q, k, v = q.to(ct), k.to(ct), v.to(ct)
    S, DH = q.shape[-2], q.shape[-1]
    cum = torch.cumsum(F.logsigmoid(fgate_preact.to(ct)), dim=-2)          # (B, NH, S, 1)
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    log_d = cum - cum.transpose(-2, -1) + igate_preact.to(ct).transpose(-2, -1)
    log_d = log_d.masked_fill(~causal, float('-inf'))                     # (B, NH, S, S)
    m = log_d.amax(dim=-1, keepdim=True)                                   # (B, NH, S, 1)
    c = (q @ (k / math.sqrt(DH)).transpose(-2, -1)) * torch.exp(log_d - m)
    h = _normalise(c @ v, c.sum(dim=-1, keepdim=True), m, eps)
    return h.to(out)


def _check_chunk(chunk) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f'mlstm: chunk must be a positive int, got {chunk!r}')
    return chunk


def _chunked(x: Tensor, nc: int, size: int) -> Tensor:
    """(B, NH, S, D) -> (B, NH, nc, size, D), zero-padded at the end."""
    pad = nc * size - x.shape[-2]
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(x.shape[0], x.shape[1], nc, size, x.shape[-1])


def _chunk_states(k: Tensor, v: Tensor, b: Tensor, ig: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The recurrent state in front of every chunk: C (B, NH, NC, DH, DHV), n (B, NH, NC, DH),
    m (B, NH, NC); C and n hold the true sums divided by exp(m), m the exact maximum of the log
    weights of all earlier steps (-inf before the first chunk). The last chunk's own summary is
    never needed."""
    k, v, b, ig = k[:, :, :-1], v[:, :, :-1], b[:, :, :-1], ig[:, :, :-1]
    a = b[..., -1:] - b + ig                       # log weight of step j at its chunk's end
    m_loc = a.amax(dim=-1)                         # (B, NH, NC - 1)
    kw = k * torch.exp(a - m_loc.unsqueeze(-1)).unsqueeze(-1)
    kv_loc = kw.transpose(-2, -1) @ v              # (B, NH, NC - 1, DH, DHV)
    n_loc = kw.sum(dim=-2)                         # (B, NH, NC - 1, DH)
    g = b[..., -1]                                 # log decay over a whole chunk
    B, NH, _, _, DH = k.shape
    cs = [k.new_zeros(B, NH, DH, v.shape[-1])]
    ns = [k.new_zeros(B, NH, DH)]
    ms = [k.new_full((B, NH), -math.inf)]
    for i in range(b.shape[2]):
        m_new = torch.maximum(g[:, :, i] + ms[-1], m_loc[:, :, i])
        decay = torch.exp(g[:, :, i] + ms[-1] - m_new)
        scale = torch.exp(m_loc[:, :, i] - m_new)
        cs.append(decay[..., None, None] * cs[-1] + scale[..., None, None] * kv_loc[:, :, i])
        ns.append(decay[..., None] * ns[-1] + scale[..., None] * n_loc[:, :, i])
        ms.append(m_new)
    return torch.stack(cs, dim=2), torch.stack(ns, dim=2), torch.stack(ms, dim=2)


def mlstm_chunkwise(q: Tensor, k: Tensor, v: Tensor, igate_preact: Tensor, fgate_preact: Tensor,
                    eps: float = 1e-6, chunk: int = DEFAULT_CHUNK) -> Tensor:
    """The mLSTM cell chunk by chunk: equal to :func:`mlstm_parallel` (to rounding), memory
    O(S * chunk + S / chunk * DH * DHV) per head instead of O(S^2).

    Inside a chunk of ``chunk`` steps the parallel form; the steps before it enter through the
    recurrent state ``(C, n, m)`` at the chunk's start, weighted by the chunk's own cumulative
    forget gate. Row ``t``'s stabiliser is the maximum over both parts, i.e. the parallel form's
    ``m_t``. Any S (the last chunk is padded), S < chunk (one chunk) and chunk 1 (the recurrent
    form) are allowed.
    """
    _check(q, k, v, igate_preact, fgate_preact)
    # S as a Python int: traced, the ceil division below became a truncating ONNX Div (one
    # chunk too few); the length is fixed at export anyway, the batch stays symbolic
    S = runtime.static_int(q.shape[-2])
    size = min(_check_chunk(chunk), S)
    out, ct = q.dtype, _compute_dtype(q)
    B, NH, _, DH = q.shape
    nc = -(-S // size)
    qc, vc = _chunked(q.to(ct), nc, size), _chunked(v.to(ct), nc, size)
    kc = _chunked(k.to(ct) / math.sqrt(DH), nc, size)
    ig = _chunked(igate_preact.to(ct), nc, size).squeeze(-1)            # (B, NH, NC, L)
    b = torch.cumsum(_chunked(F.logsigmoid(fgate_preact.to(ct)), nc, size).squeeze(-1), dim=-1)
    c_st, n_st, m_st = _chunk_states(kc, vc, b, ig)
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    log_d = (b.unsqueeze(-1) - b.unsqueeze(-2) + ig.unsqueeze(-2)).masked_fill(~causal, -math.inf)
    log_inter = b + m_st.unsqueeze(-1)                                  # (B, NH, NC, L)
    m = torch.maximum(log_d.amax(dim=-1), log_inter)
    c = (qc @ kc.transpose(-2, -1)) * torch.exp(log_d - m.unsqueeze(-1))
    w_inter = torch.exp(log_inter - m).unsqueeze(-1)
    num = c @ vc + w_inter * (qc @ c_st)
    nsum = c.sum(dim=-1, keepdim=True) + w_inter * (qc @ n_st.unsqueeze(-1))
    h = _normalise(num, nsum, m.unsqueeze(-1), eps)
    return h.reshape(B, NH, nc * size, -1)[:, :, :S].to(out)


def _kernel(interpret: bool):
    return jit_kernels('_mlstm_kernels', ('mlstm_fwd_kernel', ), 'mlstm_triton', interpret)[0]

@functools.lru_cache(maxsize=None)
def _triton_ok() -> bool:
    try:
        _kernel(False)
    except Exception:   # no triton: the PyTorch forms
        return False
    return True


def _gate_rows(igate: Tensor, fgate: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(F, i, m), each (B, NH, S) fp32 contiguous: F the cumulative log forget gate (the
    parallel form's ``cum``), i the input gate, ``m_t = F_t + max_{j <= t}(i_j - F_j)`` the row
    maximum of the log weights (the parallel form's ``m``, to rounding)."""
    cum = torch.cumsum(F.logsigmoid(fgate.to(torch.float32)), dim=-2).squeeze(-1).contiguous()
    ig = igate.to(torch.float32).squeeze(-1).contiguous()
    return cum, ig, cum + torch.cummax(ig - cum, dim=-1).values


def mlstm_triton(q: Tensor, k: Tensor, v: Tensor, igate_preact: Tensor, fgate_preact: Tensor,
                 eps: float = 1e-6, block: Optional[int] = None) -> Tensor:
    """:func:`mlstm_parallel` as one fused Triton kernel: h (B, NH, S, DHV) in ``q``'s dtype,
    memory linear in S (no S x S matrix), no backward (inputs must not record a graph).

    q, k, v fp16 / bf16 / fp32 (k, v are cast to ``q``'s dtype), any strides; gates of any
    float dtype (taken in fp32). fp32 products are IEEE unless
    ``torch.backends.cuda.matmul.allow_tf32`` (PyTorch's own setting for fp32 matmuls); 16-bit
    inputs meet in the tensor cores with fp32 accumulation, the weights rounded to the inputs'
    dtype before they multiply ``v`` (as in flash attention). ``block``: rows and keys per
    block, a power of two >= 16 (default: ``KERNEL_LAUNCH``'s; tests use small blocks).
    """
    import triton
    _check(q, k, v, igate_preact, fgate_preact)
    if q.dtype not in KERNEL_DTYPES:
        raise ConfigError(f'mlstm_triton: q must be fp16, bf16 or fp32, got {q.dtype}')
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, igate_preact,
                                                                 fgate_preact)):
        raise ConfigError('mlstm_triton has no backward: call it under torch.no_grad() or use '
                          'mlstm_parallel / mlstm_chunkwise')
    default, warps, stages = KERNEL_LAUNCH[q.dtype]
    block = block or default
    if block < 16 or block & (block - 1):
        raise ConfigError(f'mlstm_triton: block must be a power of two >= 16, got {block}')
    B, NH, S, DH = q.shape
    DHV = v.shape[-1]
    h = torch.empty(B, NH, S, DHV, dtype=q.dtype, device=q.device)
    if h.numel() == 0:
        return h
    k, v = k.to(q.dtype), v.to(q.dtype)
    cum, ig, m = _gate_rows(igate_preact, fgate_preact)
    # fp32: IEEE products unless PyTorch allows TF32; 16-bit operands: tensor cores either way
    ieee = q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32
    _kernel(not q.is_cuda)[(triton.cdiv(S, block) * B * NH, )](
        q, k, v, cum, ig, m, h, *q.stride(), *k.stride(), *v.stride(), NH, B * NH, S, DH, DHV,
        1.0 / math.sqrt(DH), eps, BLOCK_M=block, BLOCK_N=block,
        BLOCK_D=max(16, triton.next_power_of_2(DH)), BLOCK_DV=max(16, triton.next_power_of_2(DHV)),
        DOT_PRECISION='ieee' if ieee else 'tf32', num_warps=warps, num_stages=stages)
    return h


def kernel_misfit(device: str, dtype: torch.dtype, head_dim: int, grad: bool,
                  exporting: bool) -> Optional[str]:
    """Why :func:`mlstm` cannot take the fused kernel (None: it takes it): CUDA, a kernel
    dtype, head dims up to ``KERNEL_MAX_DH``, no autograd graph recorded (``grad``), not an
    export, Triton importable. The planner asks this for ViL's blocks."""
    if device != 'cuda':
        return 'not CUDA'
    if dtype not in KERNEL_DTYPES:
        return f'{dtype} is not a kernel dtype'
    if exporting:
        return 'an export records'
    if head_dim > KERNEL_MAX_DH:
        return f'head dim {head_dim} > {KERNEL_MAX_DH}'
    if grad:
        return 'grad recorded (no backward)'
    return None if _triton_ok() else 'no Triton'


def cpu_kernel_misfit(device: str, dtype: torch.dtype, grad: bool, exporting: bool
                      ) -> Optional[str]:
    """Why :func:`mlstm` cannot take the compiled CPU cell (None: it takes it): a CPU
    tensor, float32, no autograd graph recorded, no export / trace / compile recording
    (``exporting``, or :func:`amvim_mm.ops.cpu_ops.tracing`), the library built
    (:func:`amvim_mm.ops.cpu_ops.status`). The planner asks this for ViL's blocks."""
    if device != 'cpu':
        return 'not CPU'
    if dtype != torch.float32:
        return f'{dtype} is not float32'
    if exporting or cpu_ops.tracing():
        return 'an export, trace or compile records'
    if grad:
        return 'grad recorded (no backward)'
    ok, why = cpu_ops.status()
    return None if ok else why


def mlstm(q: Tensor, k: Tensor, v: Tensor, igate_preact: Tensor, fgate_preact: Tensor,
          eps: float = 1e-6, chunk: Optional[int] = None, kernel: Optional[bool] = None,
          cpu: Optional[bool] = None) -> Tensor:
    """The mLSTM cell, fused, parallel or chunkwise (same result to rounding).

    ``chunk=None`` (automatic): :func:`mlstm_triton` for CUDA tensors of a kernel dtype
    (fp16 / bf16 / fp32, head dims up to ``KERNEL_MAX_DH``) that record no autograd graph
    (inference) when Triton imports, any S; otherwise :func:`mlstm_parallel` for S <=
    ``PARALLEL_MAX_LEN`` steps (``CUDA_PARALLEL_MAX_LEN`` on CUDA), else :func:`mlstm_chunkwise`
    with ``DEFAULT_CHUNK`` (64) steps per chunk. An int ``chunk``: always the chunkwise form
    with that chunk length. Float32 CPU inference takes the compiled CPU cell
    (:func:`cpu_kernel_misfit`) before the PyTorch forms. ``kernel`` / ``cpu``: the planner's
    route (True: the fused kernel / the compiled CPU cell; False: not; None: asked here).
    """
    if chunk is None:
        tensors = (q, k, v, igate_preact, fgate_preact)
        _check(*tensors)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        if kernel is None:
            kernel = kernel_misfit(q.device.type, q.dtype, max(q.shape[-1], v.shape[-1]), grad,
                                   runtime.exporting()) is None
        if kernel:
            return mlstm_triton(*tensors, eps)
        if cpu is None:
            cpu = cpu_kernel_misfit(q.device.type, q.dtype, grad, runtime.exporting()) is None
        if cpu:
            return cpu_ops.mlstm(*tensors, eps)
        limit = CUDA_PARALLEL_MAX_LEN if q.is_cuda else PARALLEL_MAX_LEN
        if q.shape[-2] <= limit:
            return mlstm_parallel(*tensors, eps)
        chunk = DEFAULT_CHUNK
    return mlstm_chunkwise(q, k, v, igate_preact, fgate_preact, eps, chunk)
