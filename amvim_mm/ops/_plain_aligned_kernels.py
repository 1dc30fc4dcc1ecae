"""Triton kernel of :mod:`amvim_mm.ops.plain_aligned` (undecorated: that module compiles it, or
wraps it for Triton's interpreter on CPU tensors; the helpers it calls are decorated).

PlainMamba's aligned scan folds, for every kept step ``j`` of a direction (at full-grid step
``s_j``), the zero-input steps ``t`` in ``(s_{j-1}, s_j)`` into its step size. Step ``t`` takes
delta of RASTER cell ``t`` (the official first quirk), so with ``f(t) = softplus(dt_t + b)``
(``dt_t`` the stored survivor's at a present raster cell, ``b`` at an absent one; ``+ b`` the
second application of the bias)::

    d'_j = f(s_j) + sum_{s_{j-1} < t < s_j} f(t)     ('bias')
    d'_j = f(s_j) + (s_j - s_{j-1} - 1) * f(s_j)      ('token')
    u'_j = u_j * f(s_j) / d'_j

A program walks its direction's full-grid steps in order, ``BLOCK_T`` at a time: ``f`` of a
block is computed in parallel and summed per gap by a segmented scan (a segment starts after
each kept step), the open gap's sum carried into the next block; no prefix-sum differences.
"""
import triton
import triton.language as tl

from ._fused_mixer_kernels import softplus

TINY = tl.constexpr(1.1754943508222875e-38)     # torch.finfo(torch.float32).tiny: d' = 0 guard


@triton.jit
def _segment_sum(fa, va, fb, vb):
    """Combine of a segmented sum: ``fb`` marks that the right part starts a segment."""
    return fa | fb, tl.where(fb != 0, vb, va + vb)


@triton.jit
def _cell_steps(dt_ptr, slot_ptr, b, t0, e, me, b1, L, M, E, BLOCK_T: tl.constexpr):
    """Full-grid steps ``t`` in ``[t0, t0 + BLOCK_T)``, their mask and ``f(t)`` (BLOCK_T,
    BLOCK_E) fp32: the step size of raster cell t (the stored survivor's dt there, else the
    bias, plus the bias again)."""
    t = t0 + tl.arange(0, BLOCK_T)
    mt = t < M
    slot = tl.load(slot_ptr + b * M + t, mask=mt, other=-1)
    here = slot >= 0
    dt = tl.load(dt_ptr + (b * L + tl.maximum(slot, 0))[:, None] * E + e[None, :],
                 mask=here[:, None] & me[None, :], other=0.).to(tl.float32)
    return t, mt, softplus(tl.where(here[:, None], dt, b1[None, :]) + b1[None, :])


def plain_aligned_kernel(u_ptr, dt_ptr, b1_ptr, slot_ptr, jtab_ptr, steps_ptr, d2_ptr, u2_ptr,
                         L, M, E, K, n_eb, s_ok, s_oj, s_oe, GAP_TOKEN: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, WRITE_U: tl.constexpr):
    """One program per (sample b, direction k, block of channels).

    u (B, K, E, L) any float dtype, the direction's kept steps in order; dt (B, L, E) fp32, the
    stored survivors' ``dt_proj`` outputs (one bias); b1 (E,) fp32; slot (B, M) int32, the
    stored index of raster cell c or -1; jtab (B, K, M) int32, the kept index of full-grid step
    t or -1; steps (B, K, L) int64, the full-grid step of kept step j. Writes d', u' (B, K*E, L)
    fp32."""
    pid = tl.program_id(0)
    bk = (pid // n_eb).to(tl.int64)                      # b * K + k; int64 offsets
    b = bk // K
    e = (pid % n_eb) * BLOCK_E + tl.arange(0, BLOCK_E)
    me = e < E
    b1 = tl.load(b1_ptr + e, mask=me, other=0.)
    row = (bk * E + e[None, :]) * L                     # (b, k * E + e, 0) of u, d', u'
    carry = tl.zeros((BLOCK_E, ), dtype=tl.float32)     # the open gap's sum
    for t0 in range(0, M, BLOCK_T):
        t, mt, f = _cell_steps(dt_ptr, slot_ptr, b, t0, e, me, b1, L, M, E, BLOCK_T)
        j = tl.load(jtab_ptr + bk * M + t, mask=mt, other=-1)
        kept = j >= 0
        if GAP_TOKEN:
            prev = tl.load(steps_ptr + bk * L + j - 1, mask=kept & (j > 0), other=-1)
            d2 = f + (t - prev - 1).to(tl.float32)[:, None] * f
        else:
            after = tl.load(jtab_ptr + bk * M + t - 1, mask=mt & (t > 0), other=-1) >= 0
            start = (t == 0) | after                    # a gap (segment) starts here
            v = tl.where(mt[:, None], f, 0.)
            v += tl.where(((t == t0) & ~start)[:, None], carry[None, :], 0.)
            flag = tl.broadcast_to(start[:, None], (BLOCK_T, BLOCK_E)).to(tl.int32)
            _, d2 = tl.associative_scan((flag, v), 0, _segment_sum)
            carry = tl.sum(tl.where((t == t0 + BLOCK_T - 1)[:, None], d2, 0.), 0)
        mk = kept[:, None] & me[None, :]
        jj = tl.maximum(j, 0).to(tl.int64)[:, None]
        off = bk * s_ok + jj * s_oj + e[None, :] * s_oe
        tl.store(d2_ptr + off, d2, mask=mk)
        if WRITE_U:
            u = tl.load(u_ptr + row + jj, mask=mk, other=0.).to(tl.float32)
            tl.store(u2_ptr + off, u * tl.math.div_rn(f, tl.maximum(d2, TINY)), mask=mk)

