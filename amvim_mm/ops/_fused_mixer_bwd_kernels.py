"""Triton kernels of the fused mixer's training path (:mod:`amvim_mm.ops.fused_mixer_autograd`):
the scan's backward and the causal conv's backward.

Undecorated like :mod:`._fused_mixer_kernels` (the autograd module compiles them or wraps them
for Triton's interpreter); the decorated helpers they call live in :mod:`._fused_mixer_kernels`.

The scan's backward walks chunks of ``T`` steps last to first: each chunk's states are rebuilt
from the chunk's initial state (:func:`amvim_mm.ops.fused_mixer.chunk_initial_states`,
recomputed in the backward) into a small per-program scratch, then the chunk is walked backwards
with the state gradient ``dh_i = exp(d_{i+1} A) dh_{i+1} + g_i C_i`` in registers. So the
backward recomputes the states instead of storing one per step (one (E, N) state per chunk,
transient). (A first version scanned (T, BLOCK_E, N) tiles with ``tl.associative_scan``: it
spilled registers and was slower than mamba-ssm's backward; benchmarks/README.md, "Fused
training and long sequences".)
"""
import triton.language as tl

from ._fused_mixer_kernels import conv_block, conv_preact, conv_tap, softplus


def scan_bwd_kernel(xc_ptr, xd_ptr, dl_ptr, z_ptr, perm_ptr, dy_ptr, dtb_ptr, a_ptr, d_ptr,
                    st_ptr, kin_ptr, hs_ptr, dxc_ptr, dbc_ptr, ddl_ptr, dz_ptr, part_ptr, L, E,
                    R, n_chunks, n_groups, s_cp, s_cb, s_cl, s_dp, s_db, s_dl, s_lp, s_lb, s_ll,
                    s_zb, s_zl, s_pp, s_pb, s_yb, s_yl, N: tl.constexpr, T: tl.constexpr,
                    BLOCK_E: tl.constexpr, HAS_CARRY: tl.constexpr):
    """Program (sample b and chunk group g, channel block, path p): the gated scan's backward
    over the chunks of group g (of ``n_groups`` contiguous groups), last to first.

    Forward (per channel e, state n, path position i, token t = perm[p, b, i]):
    ``d_i = softplus(dl_i + dtb)``, ``h_i = exp(d_i A) h_{i-1} + d_i u_i B_i``,
    ``s_i = <h_i, C_i> + D u_i``, ``y[b, t, p E + e] = s_i silu(z_t)``. Given ``dy``:
    ``g_i = dy silu(z)``; ``dh_i = exp(d_{i+1} A) dh_{i+1} + g_i C_i``.

    Per chunk of ``T`` steps: the states are recomputed from the chunk's initial state
    ``st[p, b, c]`` step by step into this program's scratch rows ``hs`` (T, BLOCK_E, N) fp32
    (reused by every chunk: a few KiB that stay in cache), then the chunk is walked backwards
    with the state gradient in registers, as the forward kernel walks forwards.
    ``exp(d_i A) h_{i-1}`` is ``h_i - d_i u_i B_i``. Writes ``du`` into ``dxc`` (path order),
    ``dB``/``dC`` added atomically into ``dbc`` (P, B, L, 2N) fp32 (a sum over channel
    blocks), d(dt) into ``ddl`` (path order), ``dz`` of this path into ``dz[p]`` (token order,
    fp32), and this program's sums for A, D and the dt bias into ``part[p, b, g]`` (E, N + 2)
    fp32. With several groups (``HAS_CARRY``) the state gradient entering the group's last
    chunk comes from ``kin`` (:func:`scan_bwd_carry_kernel`, :func:`scan_bwd_link_kernel`).
    """
    pid = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    nb = tl.num_programs(0) // n_groups
    b = pid // n_groups
    grp = pid % n_groups
    per = tl.cdiv(n_chunks, n_groups)
    c_lo = grp * per
    c_hi = tl.minimum(c_lo + per, n_chunks)
    offs_k = tl.arange(0, BLOCK_E)
    offs_e = eb * BLOCK_E + offs_k
    offs_n = tl.arange(0, N)
    me = offs_e < E
    tile = offs_k[:, None] * N + offs_n[None, :]
    a_raw = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :], mask=me[:, None],
                    other=0.).to(tl.float32)
    a2 = a_raw * 1.4426950408889634
    dtb = tl.load(dtb_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    dsk = tl.load(d_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    xc_row = xc_ptr + p * s_cp + b * s_cb
    xd_row = xd_ptr + p * s_dp + b * s_db
    dl_row = dl_ptr + p * s_lp + b * s_lb
    pm_row = perm_ptr + p * s_pp + b * s_pb
    st_row = st_ptr + (p * nb + b) * n_chunks * E * N
    hs_row = hs_ptr + ((p * tl.num_programs(0) + pid) * tl.num_programs(1) + eb) * (T * BLOCK_E
                                                                                  * N)
    dxc_row = dxc_ptr + p * s_cp + b * s_cb
    ddl_row = ddl_ptr + p * s_lp + b * s_lb
    dbc_row = dbc_ptr + (p * nb + b) * L * 2 * N
    dz_row = dz_ptr + (p * nb + b) * L * E
    carry = tl.zeros((BLOCK_E, N), dtype=tl.float32)      # exp(d_{i+1} A) dh_{i+1}
    if HAS_CARRY:
        carry = tl.load(kin_ptr + (((p * nb + b) * n_chunks + c_hi - 1) * E + offs_e[:, None])
                        * N + offs_n[None, :], mask=me[:, None], other=0.)
    acc_a = tl.zeros((BLOCK_E, N), dtype=tl.float32)
    acc_d = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    for cc in range(c_hi - c_lo):
        c = c_hi - 1 - cc
        i0 = c * T
        h = tl.load(st_row + (c * E + offs_e[:, None]) * N + offs_n[None, :], mask=me[:, None],
                    other=0.)
        for k in range(T):          # the chunk's states, forwards
            i = i0 + k
            ok = i < L
            u = tl.load(xc_row + i * s_cl + offs_e, mask=me & ok, other=0.).to(tl.float32)
            raw = tl.load(dl_row + i * s_ll + offs_e, mask=me & ok, other=0.).to(tl.float32)
            dt = tl.where(me & ok, softplus(raw + dtb), 0.)
            bv = tl.load(xd_row + i * s_dl + R + offs_n, mask=(offs_n < N) & ok,
                         other=0.).to(tl.float32)
            h = tl.exp2(dt[:, None] * a2) * h + (dt * u)[:, None] * bv[None, :]
            tl.store(hs_row + k * BLOCK_E * N + tile, h)
        tl.debug_barrier()
        for k in range(T):          # and backwards
            kk = T - 1 - k
            i = i0 + kk
            ok = i < L
            mo = me & ok
            u = tl.load(xc_row + i * s_cl + offs_e, mask=mo, other=0.).to(tl.float32)
            raw = tl.load(dl_row + i * s_ll + offs_e, mask=mo, other=0.).to(tl.float32) + dtb
            dt = tl.where(mo, softplus(raw), 0.)
            bv = tl.load(xd_row + i * s_dl + R + offs_n, mask=(offs_n < N) & ok,
                         other=0.).to(tl.float32)
            cv = tl.load(xd_row + i * s_dl + R + N + offs_n, mask=(offs_n < N) & ok,
                         other=0.).to(tl.float32)
            tok = tl.load(pm_row + i, mask=ok, other=0)
            zv = tl.load(z_ptr + b * s_zb + tok * s_zl + offs_e, mask=mo,
                         other=0.).to(tl.float32)
            gy = tl.load(dy_ptr + b * s_yb + tok * s_yl + p * E + offs_e, mask=mo,
                         other=0.).to(tl.float32)
            h = tl.load(hs_row + kk * BLOCK_E * N + tile)
            s = tl.sum(h * cv[None, :], axis=1) + dsk * u
            sig = 1. / (1. + tl.exp(-zv))
            g = gy * zv * sig                                           # d s_i
            tl.store(dz_row + tok * E + offs_e, gy * s * sig * (1. + zv * (1. - sig)),
                     mask=mo)
            dh = carry + g[:, None] * cv[None, :]
            du_ = dt * u
            prev = h - du_[:, None] * bv[None, :]                      # exp(d_i A) h_{i-1}
            dc = tl.sum(h * g[:, None], axis=0)
            db = tl.sum(dh * du_[:, None], axis=0)
            mn = (offs_n < N) & ok
            tl.atomic_add(dbc_row + i * 2 * N + offs_n, db, mask=mn)
            tl.atomic_add(dbc_row + i * 2 * N + N + offs_n, dc, mask=mn)
            du = tl.sum(dh * bv[None, :], axis=1) * dt + dsk * g
            dd = tl.sum(dh * (a_raw * prev + u[:, None] * bv[None, :]), axis=1)
            draw = tl.where(mo, tl.where(raw > 20., dd, dd / (1. + tl.exp(-raw))), 0.)
            tl.store(dxc_row + i * s_cl + offs_e, du.to(dxc_ptr.dtype.element_ty), mask=mo)
            tl.store(ddl_row + i * s_ll + offs_e, draw.to(ddl_ptr.dtype.element_ty), mask=mo)
            acc_a += dh * dt[:, None] * prev
            acc_d += g * u
            acc_b += draw
            carry = tl.exp2(dt[:, None] * a2) * dh
        tl.debug_barrier()
    part = part_ptr + (p * tl.num_programs(0) + pid) * E * (N + 2)
    tl.store(part + offs_e[:, None] * (N + 2) + offs_n[None, :], acc_a, mask=me[:, None])
    tl.store(part + offs_e * (N + 2) + N, acc_d, mask=me)
    tl.store(part + offs_e * (N + 2) + N + 1, acc_b, mask=me)


def scan_bwd_carry_kernel(dl_ptr, xd_ptr, z_ptr, perm_ptr, dy_ptr, dtb_ptr, a_ptr, kl_ptr,
                          ds_ptr, L, E, R, n_chunks, s_dp, s_db, s_dl, s_lp, s_lb, s_ll, s_zb,
                          s_zl, s_pp, s_pb, s_yb, s_yl, N: tl.constexpr, T: tl.constexpr,
                          BLOCK_E: tl.constexpr):
    """Program (sample b and chunk c, channel block, path p): chunk c's own contribution to the
    state gradient that leaves it backwards, ``kl[p, b, c] = exp(d_first A) dh_first`` with no
    gradient coming in from later chunks (it needs no states: ``dh_i = exp(d_{i+1} A) dh_{i+1}
    + g_i C_i``), and the chunk's sum of step sizes ``ds[p, b, c]`` (E) fp32."""
    pid = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    b = pid // n_chunks
    c = pid % n_chunks
    nb = tl.num_programs(0) // n_chunks
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    me = offs_e < E
    a2 = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :], mask=me[:, None],
                 other=0.).to(tl.float32) * 1.4426950408889634
    dtb = tl.load(dtb_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    xd_row = xd_ptr + p * s_dp + b * s_db
    dl_row = dl_ptr + p * s_lp + b * s_lb
    pm_row = perm_ptr + p * s_pp + b * s_pb
    carry = tl.zeros((BLOCK_E, N), dtype=tl.float32)
    dsum = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    for k in range(T):
        i = c * T + T - 1 - k
        ok = i < L
        mo = me & ok
        raw = tl.load(dl_row + i * s_ll + offs_e, mask=mo, other=0.).to(tl.float32) + dtb
        dt = tl.where(mo, softplus(raw), 0.)
        cv = tl.load(xd_row + i * s_dl + R + N + offs_n, mask=(offs_n < N) & ok,
                     other=0.).to(tl.float32)
        tok = tl.load(pm_row + i, mask=ok, other=0)
        zv = tl.load(z_ptr + b * s_zb + tok * s_zl + offs_e, mask=mo, other=0.).to(tl.float32)
        gy = tl.load(dy_ptr + b * s_yb + tok * s_yl + p * E + offs_e, mask=mo,
                     other=0.).to(tl.float32)
        g = gy * zv / (1. + tl.exp(-zv))
        carry = tl.exp2(dt[:, None] * a2) * (carry + g[:, None] * cv[None, :])
        dsum += dt
    row = (p * nb + b) * n_chunks + c
    tl.store(kl_ptr + (row * E + offs_e[:, None]) * N + offs_n[None, :], carry, mask=me[:, None])
    tl.store(ds_ptr + row * E + offs_e, dsum, mask=me)


def scan_bwd_link_kernel(kl_ptr, ds_ptr, a_ptr, kin_ptr, E, n_chunks, N: tl.constexpr,
                         BLOCK_E: tl.constexpr):
    """Program (sample b, channel block, path p): the state gradient entering each chunk's last
    step from the chunks after it, ``kin[c] = kl[c + 1] + exp(A ds[c + 1]) kin[c + 1]``
    (``kin[last] = 0``), walking the chunks backwards."""
    b = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    nb = tl.num_programs(0)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    me = offs_e < E
    a2 = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :], mask=me[:, None],
                 other=0.).to(tl.float32) * 1.4426950408889634
    base = (p * nb + b) * n_chunks
    tile = offs_e[:, None] * N + offs_n[None, :]
    k = tl.zeros((BLOCK_E, N), dtype=tl.float32)
    tl.store(kin_ptr + (base + n_chunks - 1) * E * N + tile, k, mask=me[:, None])
    for cc in range(n_chunks - 1):
        c = n_chunks - 2 - cc
        ds = tl.load(ds_ptr + (base + c + 1) * E + offs_e, mask=me, other=0.)
        kl = tl.load(kl_ptr + (base + c + 1) * E * N + tile, mask=me[:, None], other=0.)
        k = kl + tl.exp2(ds[:, None] * a2) * k
        tl.store(kin_ptr + (base + c) * E * N + tile, k, mask=me[:, None])


def conv_bwd_kernel(x_ptr, perm_ptr, w_ptr, b_ptr, g_ptr, dpre_ptr, part_ptr, L, E, n_lblocks,
                    s_xb, s_xl, s_pp, s_pb, s_gp, s_gb, s_gl, K: tl.constexpr,
                    BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program (sample b and path positions [lb * BLOCK_L, ...), channel block, path p):
    recompute the conv's pre-activation, ``dpre = g silu'(pre)`` stored in path order (fp32,
    (P, B, L, E)), and this block's sums for the conv weight and bias into
    ``part[p, pid] (K + 1, E)`` fp32 (weight taps, then bias)."""
    pid = tl.program_id(0)
    p = tl.program_id(2)
    b, offs_l, offs_e, ml, me = conv_block(n_lblocks, L, E, BLOCK_L, BLOCK_E)
    m2 = ml[:, None] & me[None, :]
    acc = conv_preact(x_ptr, perm_ptr, w_ptr, b_ptr, b, p, E, offs_l, offs_e, ml, me, s_xb,
                      s_xl, s_pp, s_pb, K, BLOCK_L, BLOCK_E)
    gv = tl.load(g_ptr + p * s_gp + b * s_gb + offs_l[:, None] * s_gl + offs_e[None, :],
                 mask=m2, other=0.).to(tl.float32)
    sig = 1. / (1. + tl.exp(-acc))
    dpre = tl.where(m2, gv * sig * (1. + acc * (1. - sig)), 0.)
    nb = tl.num_programs(0) // n_lblocks
    tl.store(dpre_ptr + ((p * nb + b) * L + offs_l[:, None]) * E + offs_e[None, :], dpre,
             mask=m2)
    part = part_ptr + (p * tl.num_programs(0) + pid) * (K + 1) * E
    for j in tl.static_range(K):
        xv = conv_tap(x_ptr, perm_ptr, b, p, offs_l, offs_e, ml, me, j, s_xb, s_xl, s_pp, s_pb,
                      K)
        tl.store(part + j * E + offs_e, tl.sum(dpre * xv, axis=0), mask=me)
    tl.store(part + K * E + offs_e, tl.sum(dpre, axis=0), mask=me)


def conv_bwd_dx_kernel(dpre_ptr, inv_ptr, w_ptr, dx_ptr, L, E, P, n_lblocks, s_ip, s_ib, s_xb,
                       s_xl, K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program (sample b and tokens [lb * BLOCK_L, ...), channel block): the conv input's
    gradient in token order, summed over the paths: token t sits at position
    ``q = inv[p, b, t]`` of path p and feeds that path's outputs q .. q + K - 1 through the taps
    K - 1 .. 0."""
    b, offs_l, offs_e, ml, me = conv_block(n_lblocks, L, E, BLOCK_L, BLOCK_E)
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
