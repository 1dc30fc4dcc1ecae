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
* :func:`mlstm`: picks one of the two (see its docstring).

All three accumulate in fp32 (fp64 stays fp64) and return the dtype of ``q``. Gate
pre-activations are (B, NH, S, 1), as in the official code.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from amvim_mm.errors import ConfigError

__all__ = ['mlstm', 'mlstm_parallel', 'mlstm_chunkwise', 'PARALLEL_MAX_LEN', 'DEFAULT_CHUNK']

# Automatic choice of :func:`mlstm`: the quadratic form up to this many steps, beyond it the
# chunkwise form with DEFAULT_CHUNK steps per chunk.
PARALLEL_MAX_LEN = 1024
DEFAULT_CHUNK = 64


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
