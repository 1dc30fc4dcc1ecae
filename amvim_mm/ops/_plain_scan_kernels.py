"""Triton kernel of :mod:`amvim_mm.ops.plain_scan` (undecorated: that module compiles it, or wraps
it for Triton's interpreter on CPU tensors; the helpers it calls are decorated).

PlainMamba's four snake directions, each a selective scan with the official quirks: step ``j``
of direction ``k`` takes ``u`` of the token the direction visits there (``perm[k, b, j]``) and
``delta``, B, C of the token stored at index ``q_j`` (``j`` itself, the first quirk; with ToP's
alignment the survivor at raster cell ``s_j`` or none), B plus the direction's learned bias
``dirB[code]``, the dt bias applied a second time (the second quirk) and ``D * u``. The four
directions' outputs are summed at the visited tokens.
"""
import triton
import triton.language as tl

from ._fused_mixer_kernels import softplus

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _step_operands(xc_ptr, dt_ptr, xd_ptr, pm_row, cd_row, q_row, st_row, lo_row, out_ptr, b,
                   j, more, s_before, offs_e, offs_n, me, dtb, s_xb, s_xl, s_tb, s_tl, s_db,
                   s_dl, s_ob, s_ol, R, N: tl.constexpr, HAS_Q: tl.constexpr,
                   GAP: tl.constexpr, ACCUMULATE: tl.constexpr):
    """The operands of step ``j`` (masked by ``more``): visited token, u, raw dt (one bias),
    B's row, C's row, the direction code, whether a survivor is at the step's cell, its
    full-grid step ``s_j``, the number of full-grid steps strictly between ``s_before`` and
    ``s_j`` (``GAP`` > 0), (``GAP`` 1) the number of survivors at raster cells below ``s_j``,
    the output already at the token (``ACCUMULATE``)."""
    t = tl.load(pm_row + j, mask=more, other=0)
    u = tl.load(xc_ptr + b * s_xb + t * s_xl + offs_e, mask=me & more, other=0.)
    if HAS_Q:
        q = tl.load(q_row + j, mask=more, other=-1)
        present = q >= 0
        q = tl.maximum(q, 0)
    else:
        q = j
        present = more
    dt = tl.load(dt_ptr + b * s_tb + q * s_tl + offs_e, mask=me & present, other=0.)
    dt = tl.where(present, dt.to(tl.float32), dtb)       # an absent cell: dt_proj(0) = bias
    bv = tl.load(xd_ptr + b * s_db + q * s_dl + R + offs_n, mask=present, other=0.)
    cv = tl.load(xd_ptr + b * s_db + q * s_dl + R + N + offs_n, mask=present, other=0.)
    code = tl.load(cd_row + j, mask=more, other=0)
    if GAP > 0:
        sj = tl.load(st_row + j, mask=more, other=0)
    else:
        sj = t * 0 + s_before                   # unused; a tensor like the loaded steps
    skipped = sj - s_before - 1
    if GAP == 1:
        below = tl.load(lo_row + j, mask=more, other=0)
    else:
        below = skipped * 0
    if ACCUMULATE:
        prev = tl.load(out_ptr + b * s_ob + t * s_ol + offs_e, mask=me & more, other=0.)
    else:
        prev = dt
    return t, u, dt, bv, cv, code, present, sj, skipped, below, prev


def plain_scan_kernel(xc_ptr, dt_ptr, xd_ptr, perm_ptr, code_ptr, q_ptr, steps_ptr, lo_ptr,
                      dirb_ptr, a_ptr, dtb_ptr, d_ptr, out_ptr, L, E, R, s_xb, s_xl, s_tb, s_tl,
                      s_db, s_dl, s_pk, s_pb, s_ck, s_cb, s_qb, s_qk, s_sb, s_sk, s_ob, s_ol,
                      K: tl.constexpr, N: tl.constexpr, BLOCK_E: tl.constexpr,
                      HAS_Q: tl.constexpr, GAP: tl.constexpr):
    """One program: sample b, channels [eb * BLOCK_E, ...); walks the K directions one after
    the other, each step by step, and sums their outputs into ``out`` (the first direction
    writes, the others add: deterministic, no atomics).

    xc (B, L, E) the conv output in storage order (u); dt (B, L, E) ``dt_proj``'s output (one
    bias); xd (B, L, R + 2N) ``x_proj``'s output (B at R, C at R + N); perm (K, B or 1, L) the
    stored token each step visits; code (K, L) or (B, K, L) each step's direction code;
    q (B, K, L) int32 (``HAS_Q``) the stored token whose dt, B, C step j takes, -1 for none (an
    absent cell: dt = bias, B = 0 + dirB, C = 0), else step j takes token j's. ToP's alignment
    (``GAP`` 1 'bias' / 2 'token', 0 none): steps (B, K, L) int64 the full-grid step of each
    kept step; lo (B, K, L) int32, strides as q ('bias'): the number of survivors (stored in
    raster order) at raster cells below ``s_j``. The decay takes ``delta + gap``, the input
    term ``delta``; a 'bias' gap sums the step sizes of the raster cells strictly between
    ``s_{j-1}`` and ``s_j`` (the steps take the raster cells' step sizes, the first quirk): the
    survivors there, stored indices ``[a_j, lo_j)`` with ``a_j = lo_{j-1}`` plus one when a
    survivor sits at ``s_{j-1}``, summed one by one in fp32 (no prefix-sum differences; a
    survivor lies in at most one gap, so a direction reads at most L more rows of dt), and
    ``softplus(2 b)`` for each absent cell; a 'token' gap is ``count * delta``.
    dirb (5, N); A (E, N) fp32 (negative); dtb, D (E,). out (B, L, E) fp32.
    """
    b = tl.program_id(0).to(tl.int64)
    eb = tl.program_id(1)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    me = offs_e < E
    a2 = tl.load(a_ptr + offs_e[:, None] * N + offs_n[None, :], mask=me[:, None],
                 other=0.).to(tl.float32) * LOG2E
    dtb = tl.load(dtb_ptr + offs_e, mask=me, other=0.).to(tl.float32)
    dsk = tl.load(d_ptr + offs_e, mask=me, other=0.).to(tl.float32)
    absent_step = softplus(dtb + dtb)             # an absent cell's step size ('bias')
    for k in tl.static_range(K):
        pm_row = perm_ptr + k * s_pk + b * s_pb
        cd_row = code_ptr + k * s_ck + b * s_cb
        q_row = q_ptr + b * s_qb + k * s_qk
        lo_row = lo_ptr + b * s_qb + k * s_qk
        st_row = steps_ptr + b * s_sb + k * s_sk
        h = tl.zeros((BLOCK_E, N), dtype=tl.float32)
        # step 0's operands (s_{-1} = -1); each iteration prefetches the next step's
        t_n, u_n, dt_n, b_n, c_n, cd_n, pr_n, s_n, g_n, lo_n, p_n = _step_operands(
            xc_ptr, dt_ptr, xd_ptr, pm_row, cd_row, q_row, st_row, lo_row, out_ptr, b, 0,
            L > 0, -1, offs_e, offs_n, me, dtb, s_xb, s_xl, s_tb, s_tl, s_db, s_dl, s_ob, s_ol,
            R, N, HAS_Q, GAP, k > 0)
        first = lo_n * 0                  # a_j: the first survivor after s_{j-1}
        for j in range(L):
            t, u, dt, bv, cv, cd, pres, sj, gd, lo, prev = (t_n, u_n, dt_n, b_n, c_n, cd_n,
                                                            pr_n, s_n, g_n, lo_n, p_n)
            t_n, u_n, dt_n, b_n, c_n, cd_n, pr_n, s_n, g_n, lo_n, p_n = _step_operands(
                xc_ptr, dt_ptr, xd_ptr, pm_row, cd_row, q_row, st_row, lo_row, out_ptr, b,
                j + 1, j + 1 < L, sj, offs_e, offs_n, me, dtb, s_xb, s_xl, s_tb, s_tl, s_db,
                s_dl, s_ob, s_ol, R, N, HAS_Q, GAP, k > 0)
            u = u.to(tl.float32)
            bv = bv.to(tl.float32) + tl.load(dirb_ptr + cd * N + offs_n).to(tl.float32)
            delta = softplus(dt + dtb)                        # the bias again (second quirk)
            if GAP == 1:
                gap = (gd - (lo - first)).to(tl.float32) * absent_step
                for i in range(first, lo):              # the survivors inside the gap
                    x = tl.load(dt_ptr + b * s_tb + i * s_tl + offs_e, mask=me, other=0.)
                    gap += softplus(x.to(tl.float32) + dtb)
                dA = delta + gap
                first = lo + pres.to(lo.dtype)
            elif GAP == 2:
                dA = delta + gd.to(tl.float32) * delta
            else:
                dA = delta
            h = tl.exp2(dA[:, None] * a2) * h + (delta * u)[:, None] * bv[None, :]
            y = tl.sum(h * cv.to(tl.float32)[None, :], axis=1) + dsk * u
            if k > 0:
                y += prev
            tl.store(out_ptr + b * s_ob + t * s_ol + offs_e, y, mask=me)
        tl.debug_barrier()          # the next direction reads what this one wrote
