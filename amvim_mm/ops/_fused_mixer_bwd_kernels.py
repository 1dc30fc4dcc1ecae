"""Triton kernels of the fused mixer's training path (:mod:`amvim_mm.ops.fused_mixer_autograd`):
the scan's backward and the causal conv's backward.

Undecorated like :mod:`._fused_mixer_kernels` (the autograd module compiles them or wraps them
for Triton's interpreter); helpers they call are decorated here.

The scan's backward works on chunks of ``T`` steps as (T, BLOCK_E, N) tiles: within a chunk the
states come from an associative scan (``h_i = a_i h_{i-1} + b_i``) started from the chunk's
initial state (:func:`amvim_mm.ops.fused_mixer.chunk_initial_states`, recomputed), and the state gradients from the reverse scan
``dh_i = a_{i+1} dh_{i+1} + g_i`` carried in from the next chunk; so the backward recomputes the
states instead of storing one per step (only one (E, N) state per chunk, transient).
"""
import triton
import triton.language as tl



@triton.jit
def _affine(a1, b1, a2, b2):
    """Composition of ``h -> a1 h + b1`` then ``h -> a2 h + b2`` (the scans' combine)."""
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _softplus(raw):
    """``delta`` as the forward kernel forms it: softplus with mamba's x > 20 -> x, log1p of
    exp(x) computed accurately (Kahan)."""
    ex = tl.exp(tl.minimum(raw, 20.))
    w1 = 1. + ex
    lp = tl.where(w1 == 1., ex, tl.log(w1) * (ex / (w1 - 1.)))
    return tl.where(raw > 20., raw, lp)


@triton.jit
def _chunk_inputs(xc_row, xd_row, dl_row, i, mi, offs_e, me, offs_n, R, s_cl, s_dl, s_ll, dtb,
                  a2, N: tl.constexpr):
    """One chunk's scan inputs as tiles: ``u`` (T, E), ``raw`` (T, E) = dt + bias, ``d`` =
    delta (0 outside the sequence: the state passes unchanged), ``B`` (T, N), and the decay
    ``exp(d A)`` and input ``d u B`` as (T, E, N) tiles."""
    m2 = mi[:, None] & me[None, :]
    u = tl.load(xc_row + i[:, None] * s_cl + offs_e[None, :], mask=m2, other=0.).to(tl.float32)
    raw = tl.load(dl_row + i[:, None] * s_ll + offs_e[None, :], mask=m2,
                  other=0.).to(tl.float32) + dtb[None, :]
    d = tl.where(m2, _softplus(raw), 0.)
    bv = tl.load(xd_row + i[:, None] * s_dl + R + offs_n[None, :], mask=mi[:, None],
                 other=0.).to(tl.float32)
    decay = tl.exp2(d[:, :, None] * a2[None, :, :])
    inp = (d * u)[:, :, None] * bv[:, None, :]
    return u, raw, d, bv, decay, inp


@triton.jit
def _row(x, offs_t, t):
    """Row ``t`` of a (T, E, N) tile as (E, N)."""
    return tl.sum(tl.where((offs_t == t)[:, None, None], x, 0.), axis=0)


def scan_bwd_kernel(xc_ptr, xd_ptr, dl_ptr, z_ptr, perm_ptr, dy_ptr, dtb_ptr, a_ptr, d_ptr,
                    st_ptr, dxc_ptr, dbc_ptr, ddl_ptr, dz_ptr, part_ptr, L, E, R, n_chunks,
                    s_cp, s_cb, s_cl, s_dp, s_db, s_dl, s_lp, s_lb, s_ll, s_zb, s_zl, s_pp,
                    s_pb, s_yb, s_yl, N: tl.constexpr, T: tl.constexpr,
                    BLOCK_E: tl.constexpr):
    """Program (sample b, channel block, path p): the gated scan's backward, chunks last to first.

    Forward (per channel e, state n, path position i, token t = perm[p, b, i]):
    ``d_i = softplus(dl_i + dtb)``, ``h_i = exp(d_i A) h_{i-1} + d_i u_i B_i``,
    ``s_i = <h_i, C_i> + D u_i``, ``y[b, t, p E + e] = s_i silu(z_t)``. Given ``dy``:
    ``g_i = dy silu(z)``; ``dh_i = exp(d_{i+1} A) dh_{i+1} + g_i C_i``; writes ``du`` into
    ``dxc`` (path order), ``dB``/``dC`` added atomically into ``dbc`` (P, B, L, 2N) fp32 (a sum
    over channel blocks), d(dt) into ``ddl`` (path order), ``dz`` of this path into
    ``dz[p]`` (token order, fp32), and this sample's sums for A, D and the dt bias into
    ``part[p, b]`` (E, N + 2) fp32. ``exp(d_i A) h_{i-1}`` is formed as ``h_i - d_i u_i B_i``.
    """
    b = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    offs_t = tl.arange(0, T)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    me = offs_e < E
    a_raw = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :], mask=me[:, None],
                    other=0.).to(tl.float32)
    a2 = a_raw * 1.4426950408889634
    dtb = tl.load(dtb_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    dsk = tl.load(d_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    xc_row = xc_ptr + p * s_cp + b * s_cb
    xd_row = xd_ptr + p * s_dp + b * s_db
    dl_row = dl_ptr + p * s_lp + b * s_lb
    pm_row = perm_ptr + p * s_pp + b * s_pb
    nb = tl.num_programs(0)
    st_row = st_ptr + (p * nb + b) * n_chunks * E * N
    dxc_row = dxc_ptr + p * s_cp + b * s_cb
    ddl_row = ddl_ptr + p * s_lp + b * s_lb
    dbc_row = dbc_ptr + (p * nb + b) * L * 2 * N
    dz_row = dz_ptr + (p * nb + b) * L * E
    carry = tl.zeros((BLOCK_E, N), dtype=tl.float32)      # exp(d_first A) dh_first, next chunk
    acc_a = tl.zeros((BLOCK_E, N), dtype=tl.float32)
    acc_d = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    for cc in range(n_chunks):
        c = n_chunks - 1 - cc
        i = c * T + offs_t
        mi = i < L
        m2 = mi[:, None] & me[None, :]
        u, raw, d, bv, decay, inp = _chunk_inputs(xc_row, xd_row, dl_row, i, mi, offs_e, me,
                                                  offs_n, R, s_cl, s_dl, s_ll, dtb, a2, N)
        cv = tl.load(xd_row + i[:, None] * s_dl + R + N + offs_n[None, :], mask=mi[:, None],
                     other=0.).to(tl.float32)
        h0 = tl.load(st_row + (c * E + offs_e[:, None]) * N + offs_n[None, :], mask=me[:, None],
                     other=0.)
        pa, sb = tl.associative_scan((decay, inp), 0, _affine)
        h = pa * h0[None, :, :] + sb                                    # h_i, (T, E, N)
        tok = tl.load(pm_row + i, mask=mi, other=0)
        zv = tl.load(z_ptr + b * s_zb + tok[:, None] * s_zl + offs_e[None, :], mask=m2,
                     other=0.).to(tl.float32)
        gy = tl.load(dy_ptr + b * s_yb + tok[:, None] * s_yl + p * E + offs_e[None, :],
                     mask=m2, other=0.).to(tl.float32)
        s = tl.sum(h * cv[:, None, :], axis=2) + dsk[None, :] * u
        sig = 1. / (1. + tl.exp(-zv))
        g = gy * zv * sig                                               # d s_i
        dzv = gy * s * sig * (1. + zv * (1. - sig))
        tl.store(dz_row + tok[:, None] * E + offs_e[None, :], dzv, mask=m2)
        # decay of the next step within the chunk (the last row's comes with the carry)
        i1 = i + 1
        m1 = (i1 < L) & (offs_t < T - 1)
        raw1 = tl.load(dl_row + i1[:, None] * s_ll + offs_e[None, :],
                       mask=m1[:, None] & me[None, :], other=0.).to(tl.float32) + dtb[None, :]
        d1 = tl.where(m1[:, None] & me[None, :], _softplus(raw1), 0.)
        decay1 = tl.exp2(d1[:, :, None] * a2[None, :, :])
        q, sg = tl.associative_scan((decay1, g[:, :, None] * cv[:, None, :]), 0, _affine,
                                    reverse=True)
        dh = sg + q * carry[None, :, :]
        carry = _row(decay * dh, offs_t, 0)
        prev = h - inp                                                  # exp(d_i A) h_{i-1}
        dc = tl.sum(h * g[:, :, None], axis=1)                          # (T, N)
        db = tl.sum(dh * (d * u)[:, :, None], axis=1)
        tl.atomic_add(dbc_row + i[:, None] * 2 * N + offs_n[None, :], db, mask=mi[:, None])
        tl.atomic_add(dbc_row + i[:, None] * 2 * N + N + offs_n[None, :], dc, mask=mi[:, None])
        du = tl.sum(dh * bv[:, None, :], axis=2) * d + dsk[None, :] * g
        dd = tl.sum(dh * (a_raw[None, :, :] * prev + u[:, :, None] * bv[:, None, :]), axis=2)
        draw = tl.where(raw > 20., dd, dd / (1. + tl.exp(-raw)))
        draw = tl.where(m2, draw, 0.)
        tl.store(dxc_row + i[:, None] * s_cl + offs_e[None, :],
                 du.to(dxc_ptr.dtype.element_ty), mask=m2)
        tl.store(ddl_row + i[:, None] * s_ll + offs_e[None, :],
                 draw.to(ddl_ptr.dtype.element_ty), mask=m2)
        acc_a += tl.sum(dh * d[:, :, None] * prev, axis=0)
        acc_d += tl.sum(g * u, axis=0)
        acc_b += tl.sum(draw, axis=0)
    part = part_ptr + (p * nb + b) * E * (N + 2)
    tl.store(part + offs_e[:, None] * (N + 2) + offs_n[None, :], acc_a, mask=me[:, None])
    tl.store(part + offs_e * (N + 2) + N, acc_d, mask=me)
    tl.store(part + offs_e * (N + 2) + N + 1, acc_b, mask=me)


def conv_bwd_kernel(x_ptr, perm_ptr, w_ptr, b_ptr, g_ptr, dpre_ptr, part_ptr, L, E, n_lblocks,
                    s_xb, s_xl, s_pp, s_pb, s_gp, s_gb, s_gl, K: tl.constexpr,
                    BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program (sample b and path positions [lb * BLOCK_L, ...), channel block, path p):
    recompute the conv's pre-activation, ``dpre = g silu'(pre)`` stored in path order (fp32,
    (P, B, L, E)), and this block's sums for the conv weight and bias into
    ``part[p, pid] (K + 1, E)`` fp32 (weight taps, then bias)."""
    pid = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    b = pid // n_lblocks
    lb = pid % n_lblocks
    offs_l = lb * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    ml = offs_l < L
    me = offs_e < E
    m2 = ml[:, None] & me[None, :]
    acc = tl.zeros((BLOCK_L, BLOCK_E), dtype=tl.float32) + tl.load(
        b_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)[None, :]
    for j in tl.static_range(K):
        src = offs_l - (K - 1) + j
        ok = ml & (src >= 0)
        tok = tl.load(perm_ptr + p * s_pp + b * s_pb + src, mask=ok, other=0)
        xv = tl.load(x_ptr + b * s_xb + tok[:, None] * s_xl + offs_e[None, :],
                     mask=ok[:, None] & me[None, :], other=0.).to(tl.float32)
        w = tl.load(w_ptr + (p * E + offs_e) * K + j, mask=me, other=0.).to(tl.float32)
        acc += xv * w[None, :]
    gv = tl.load(g_ptr + p * s_gp + b * s_gb + offs_l[:, None] * s_gl + offs_e[None, :],
                 mask=m2, other=0.).to(tl.float32)
    sig = 1. / (1. + tl.exp(-acc))
    dpre = tl.where(m2, gv * sig * (1. + acc * (1. - sig)), 0.)
    nb = tl.num_programs(0) // n_lblocks
    tl.store(dpre_ptr + ((p * nb + b) * L + offs_l[:, None]) * E + offs_e[None, :], dpre,
             mask=m2)
    part = part_ptr + (p * tl.num_programs(0) + pid) * (K + 1) * E
    for j in tl.static_range(K):
        src = offs_l - (K - 1) + j
        ok = ml & (src >= 0)
        tok = tl.load(perm_ptr + p * s_pp + b * s_pb + src, mask=ok, other=0)
        xv = tl.load(x_ptr + b * s_xb + tok[:, None] * s_xl + offs_e[None, :],
                     mask=ok[:, None] & me[None, :], other=0.).to(tl.float32)
        tl.store(part + j * E + offs_e, tl.sum(dpre * xv, axis=0), mask=me)
    tl.store(part + K * E + offs_e, tl.sum(dpre, axis=0), mask=me)


def conv_bwd_dx_kernel(dpre_ptr, inv_ptr, w_ptr, dx_ptr, L, E, P, n_lblocks, s_ip, s_ib, s_xb,
                       s_xl, K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program (sample b and tokens [lb * BLOCK_L, ...), channel block): the conv input's
    gradient in token order, summed over the paths: token t sits at position
    ``q = inv[p, b, t]`` of path p and feeds that path's outputs q .. q + K - 1 through the taps
    K - 1 .. 0."""
    pid = tl.program_id(0)
    eb = tl.program_id(1)
    b = pid // n_lblocks
    lb = pid % n_lblocks
    offs_l = lb * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    ml = offs_l < L
    me = offs_e < E
    nb = tl.num_programs(0) // n_lblocks
    acc = tl.zeros((BLOCK_L, BLOCK_E), dtype=tl.float32)
    for p in range(P):
        pos = tl.load(inv_ptr + p * s_ip + b * s_ib + offs_l, mask=ml, other=0)
        for j in tl.static_range(K):
            q = pos + (K - 1) - j
            ok = ml & (q < L)
            gv = tl.load(dpre_ptr + ((p * nb + b) * L + q[:, None]) * E + offs_e[None, :],
                         mask=ok[:, None] & me[None, :], other=0.)
            w = tl.load(w_ptr + (p * E + offs_e) * K + j, mask=me, other=0.).to(tl.float32)
            acc += gv * w[None, :]
    tl.store(dx_ptr + b * s_xb + offs_l[:, None] * s_xl + offs_e[None, :],
             acc.to(dx_ptr.dtype.element_ty), mask=ml[:, None] & me[None, :])
