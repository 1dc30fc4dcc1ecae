"""Triton kernel of :func:`amvim_mm.ops.mlstm.mlstm_triton` (undecorated: that module compiles
it, or wraps it for Triton's interpreter on CPU tensors).

The mLSTM cell's parallel stabilised form in one pass over the keys, nothing S x S in memory.
With ``F`` the cumulative log forget gate, ``i`` the input gate pre-activations and the row
stabiliser ``m_t = F_t + max_{j <= t} (i_j - F_j)`` (a prefix maximum, formed before the
launch), every weight ``exp(F_t - F_j + i_j - m_t)`` has a non-positive exponent, so no online
maximum (as in flash attention) is needed: a program sums ``W = (q k^T / sqrt(DH)) * weight``
(causal) times ``v`` and the row sums of ``W`` over the key blocks ``j <= t``, and divides by
``max(|row sum|, exp(-m_t)) + eps`` at the end.
"""
import triton.language as tl


def mlstm_fwd_kernel(q_ptr, k_ptr, v_ptr, f_ptr, i_ptr, m_ptr, h_ptr,
                     sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                     NH, BH, S, DH, DHV, scale, eps,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_DV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One program per (row block, batch x head); the row blocks with the most keys first.

    q, k (B, NH, S, DH), v (B, NH, S, DHV) one 16/32-bit float dtype, any strides (elements);
    f (cumulative log forget gate), i (input gate), m (row stabiliser) (B * NH, S) fp32
    contiguous; h (B * NH, S, DHV) contiguous, written in its own dtype. Accumulation in fp32;
    the weights meet ``v`` in ``v``'s dtype (the tensor cores' input)."""
    pid = tl.program_id(0)
    n_mb = tl.cdiv(S, BLOCK_M)
    mb = n_mb - 1 - pid // BH
    bh = (pid % BH).to(tl.int64)            # int64 offsets: B * NH * S * DH may pass 2^31
    b, h = bh // NH, bh % NH
    t = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    mt = t < S
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + t[:, None] * sq_s + d[None, :] * sq_d,
                mask=mt[:, None] & (d < DH)[None, :], other=0.)
    gate = bh * S
    f_t = tl.load(f_ptr + gate + t, mask=mt, other=0.)
    m_t = tl.load(m_ptr + gate + t, mask=mt, other=0.)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    nsum = tl.zeros((BLOCK_M, ), dtype=tl.float32)
    for j0 in range(0, tl.minimum((mb + 1) * BLOCK_M, S), BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        mj = j < S
        k = tl.load(k_base + j[None, :] * sk_s + d[:, None] * sk_d,
                    mask=mj[None, :] & (d < DH)[:, None], other=0.)      # (BLOCK_D, BLOCK_N)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION) * scale
        f_j = tl.load(f_ptr + gate + j, mask=mj, other=0.)
        i_j = tl.load(i_ptr + gate + j, mask=mj, other=0.)
        log_d = (f_t[:, None] - f_j[None, :]) + i_j[None, :]
        keep = (j[None, :] <= t[:, None]) & mj[None, :] & mt[:, None]
        w = qk * tl.exp(tl.where(keep, log_d - m_t[:, None], float('-inf')))
        nsum += tl.sum(w, 1)
        v = tl.load(v_base + j[:, None] * sv_s + dv[None, :] * sv_d,
                    mask=mj[:, None] & (dv < DHV)[None, :], other=0.)
        acc = tl.dot(w.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    den = tl.maximum(tl.abs(nsum), tl.exp(-m_t)) + eps
    out = acc / den[:, None]
    tl.store(h_ptr + (gate + t)[:, None] * DHV + dv[None, :], out.to(h_ptr.dtype.element_ty),
             mask=mt[:, None] & (dv < DHV)[None, :])
