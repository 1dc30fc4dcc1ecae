"""Triton kernels of :mod:`amvim_mm.ops.fused_mixer` (undecorated: that module compiles them, or
wraps them for Triton's interpreter on CPU tensors; helpers they call are decorated here).
Imported only when the fused path is used."""
import triton
import triton.language as tl

@triton.jit
def softplus(raw):
    """``delta`` as every scan kernel forms it: softplus with mamba's x > 20 -> x, log1p of
    exp(x) computed accurately (Kahan: log(w1) * ex / (w1 - 1))."""
    ex = tl.exp(tl.minimum(raw, 20.))
    w1 = 1. + ex
    lp = tl.where(w1 == 1., ex, tl.log(w1) * (ex / (w1 - 1.)))
    return tl.where(raw > 20., raw, lp)


@triton.jit
def gap_step(dt, g, gbias, GAP_TOKEN: tl.constexpr):
    """The decay's step size ``delta'`` of a kept token that follows ``g`` pruned positions of
    its path (ToP's hidden-state alignment: each pruned position decays the state with zero
    input): ``delta + g * delta`` (``GAP_TOKEN``: a pruned position's step is the token's own)
    or ``delta + g * softplus(dt_bias)`` (``gbias``). The input term keeps ``delta``."""
    if GAP_TOKEN:
        return dt + g * dt
    else:
        return dt + g * gbias


@triton.jit
def conv_tap(x_ptr, perm_ptr, b, p, offs_l, offs_e, ml, me, j, s_xb, s_xl, s_pp, s_pb,
             K: tl.constexpr):
    """Tap ``j`` of path p's causal conv at path positions ``offs_l``: the rows
    ``x[b, perm[p, b, i - K + 1 + j]]`` (zero before the path's start), fp32 (BLOCK_L, BLOCK_E)."""
    src = offs_l - (K - 1) + j
    ok = ml & (src >= 0)
    tok = tl.load(perm_ptr + p * s_pp + b * s_pb + src, mask=ok, other=0)
    return tl.load(x_ptr + b * s_xb + tok[:, None] * s_xl + offs_e[None, :],
                   mask=ok[:, None] & me[None, :], other=0.).to(tl.float32)


@triton.jit
def conv_block(n_lblocks, L, E, BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """The conv kernels' block: program (sample b and positions [lb * BLOCK_L, ...), channel
    block) -> (b, positions, channels, their masks)."""
    pid = tl.program_id(0)
    b = pid // n_lblocks
    offs_l = (pid % n_lblocks) * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    return b, offs_l, offs_e, offs_l < L, offs_e < E


@triton.jit
def conv_preact(x_ptr, perm_ptr, w_ptr, b_ptr, b, p, E, offs_l, offs_e, ml, me, s_xb, s_xl,
                s_pp, s_pb, K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """Path p's causal depthwise conv before its silu, at path positions ``offs_l`` (fp32)."""
    acc = tl.zeros((BLOCK_L, BLOCK_E), dtype=tl.float32) + tl.load(
        b_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)[None, :]
    for j in tl.static_range(K):
        w = tl.load(w_ptr + (p * E + offs_e) * K + j, mask=me, other=0.).to(tl.float32)
        acc += conv_tap(x_ptr, perm_ptr, b, p, offs_l, offs_e, ml, me, j, s_xb, s_xl, s_pp,
                        s_pb, K) * w[None, :]
    return acc


def conv_kernel(x_ptr, perm_ptr, w_ptr, b_ptr, out_ptr, L, E, n_lblocks, s_xb, s_xl, s_pp,
                s_pb, s_op, s_ob, s_ol, K: tl.constexpr, BLOCK_L: tl.constexpr,
                BLOCK_E: tl.constexpr):
    p = tl.program_id(2)
    b, offs_l, offs_e, ml, me = conv_block(n_lblocks, L, E, BLOCK_L, BLOCK_E)
    acc = conv_preact(x_ptr, perm_ptr, w_ptr, b_ptr, b, p, E, offs_l, offs_e, ml, me, s_xb,
                      s_xl, s_pp, s_pb, K, BLOCK_L, BLOCK_E)
    acc = acc / (1. + tl.exp(-acc))  # silu
    tl.store(out_ptr + p * s_op + b * s_ob + offs_l[:, None] * s_ol + offs_e[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=ml[:, None] & me[None, :])


def scan_kernel(xc_ptr, xd_ptr, dl_ptr, z_ptr, perm_ptr, wdt_ptr, dtb_ptr, a_ptr, d_ptr, out_ptr,
                gap_ptr, L, E, R, s_cp, s_cb, s_cl, s_dp, s_db, s_dl, s_lp, s_lb, s_ll, s_zb, s_zl,
                s_pp, s_pb, s_ob, s_ol, s_gp, s_gb, N: tl.constexpr, BLOCK_E: tl.constexpr,
                BLOCK_R: tl.constexpr, DT_IN_KERNEL: tl.constexpr, HAS_GAPS: tl.constexpr,
                GAP_TOKEN: tl.constexpr):
    """One program: sample b, channels [eb * BLOCK_E, ...), path p; walks the path step by step.

    ``out[b, t, p * E + e]`` receives path p's gated output at token t (token order), so the
    paths' mean is one ``out_proj`` over the concatenation. ``delta`` is ``dt_proj`` of the
    low-rank ``x_dbl[..., :R]`` computed here (``DT_IN_KERNEL``) or read from ``dl_ptr``.
    ``HAS_GAPS``: ``gap[p, b, i]`` (fp32) pruned positions precede step i of the path; the
    decay then uses :func:`gap_step`'s step size (ToP's alignment), the rest is unchanged.
    """
    b = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    offs_r = tl.arange(0, BLOCK_R)
    me = offs_e < E
    mr = offs_r < R
    # per-path constants: A * log2(e), dt_proj weight and bias, D
    a2 = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :],
                 mask=me[:, None], other=0.).to(tl.float32) * 1.4426950408889634
    dtb = tl.load(dtb_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    dsk = tl.load(d_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    if DT_IN_KERNEL:
        wdt = tl.load(wdt_ptr + (p * E + offs_e[:, None]) * R + offs_r[None, :],
                      mask=me[:, None] & mr[None, :], other=0.).to(tl.float32)
    h = tl.zeros((BLOCK_E, N), dtype=tl.float32)
    xc_row = xc_ptr + p * s_cp + b * s_cb
    xd_row = xd_ptr + p * s_dp + b * s_db
    dl_row = dl_ptr + p * s_lp + b * s_lb
    pm_row = perm_ptr + p * s_pp + b * s_pb
    out_row = out_ptr + b * s_ob + p * E
    # step 0's operands; each iteration prefetches the next step's
    t_n = tl.load(pm_row)
    u_n = tl.load(xc_row + offs_e, mask=me, other=0.)
    if DT_IN_KERNEL:
        r_n = tl.load(xd_row + offs_r, mask=mr, other=0.)
    else:
        r_n = tl.load(dl_row + offs_e, mask=me, other=0.)
    b_n = tl.load(xd_row + R + offs_n)
    c_n = tl.load(xd_row + R + N + offs_n)
    z_n = tl.load(z_ptr + b * s_zb + t_n * s_zl + offs_e, mask=me, other=0.)
    if HAS_GAPS:
        gbias = softplus(dtb)       # a pruned position's step size with gap_delta='bias'
        gp_row = gap_ptr + p * s_gp + b * s_gb
        g_n = tl.load(gp_row)
    for i in range(L):
        t = t_n
        u = u_n.to(tl.float32)
        dr = r_n.to(tl.float32)
        bv = b_n.to(tl.float32)
        cv = c_n.to(tl.float32)
        zv = z_n.to(tl.float32)
        nx = i + 1
        more = nx < L
        t_n = tl.load(pm_row + nx, mask=more, other=0)
        u_n = tl.load(xc_row + nx * s_cl + offs_e, mask=me & more, other=0.)
        if DT_IN_KERNEL:
            r_n = tl.load(xd_row + nx * s_dl + offs_r, mask=mr & more, other=0.)
        else:
            r_n = tl.load(dl_row + nx * s_ll + offs_e, mask=me & more, other=0.)
        b_n = tl.load(xd_row + nx * s_dl + R + offs_n, mask=(offs_n < N) & more, other=0.)
        c_n = tl.load(xd_row + nx * s_dl + R + N + offs_n, mask=(offs_n < N) & more, other=0.)
        z_n = tl.load(z_ptr + b * s_zb + t_n * s_zl + offs_e, mask=me & more, other=0.)
        if HAS_GAPS:
            g = g_n
            g_n = tl.load(gp_row + nx, mask=more, other=0.)
        # delta = softplus(dt_proj(dt_low) + bias), softplus as mamba: x > 20 -> x
        if DT_IN_KERNEL:
            dt = softplus(tl.sum(wdt * dr[None, :], axis=1) + dtb)
        else:
            dt = softplus(dr + dtb)
        if HAS_GAPS:
            dA = gap_step(dt, g, gbias, GAP_TOKEN)
        else:
            dA = dt
        h = tl.exp2(dA[:, None] * a2) * h + (dt * u)[:, None] * bv[None, :]
        y = tl.sum(h * cv[None, :], axis=1) + dsk * u
        y = y * (zv / (1. + tl.exp(-zv)))
        tl.store(out_row + t * s_ol + offs_e, y.to(out_ptr.dtype.element_ty), mask=me)


def chunk_scan_kernel(xc_ptr, xd_ptr, dl_ptr, z_ptr, perm_ptr, dtb_ptr, a_ptr, d_ptr, out_ptr,
                      st_ptr, ds_ptr, gap_ptr, L, E, R, n_grid_chunks, s_cp, s_cb, s_cl, s_dp,
                      s_db, s_dl, s_lp, s_lb, s_ll, s_zb, s_zl, s_pp, s_pb, s_ob, s_ol, s_sp,
                      s_sb, s_sc, s_qp, s_qb, s_qc, s_gp, s_gb, N: tl.constexpr,
                      BLOCK_E: tl.constexpr, T: tl.constexpr, OUTPUT: tl.constexpr,
                      HAS_GAPS: tl.constexpr, GAP_TOKEN: tl.constexpr):
    """Passes 1 and 3 of the chunked scan: one program per (sample b and chunk c, block of
    channels, path p) walks steps ``[c * T, min((c + 1) * T, L))`` of the path.

    ``OUTPUT=False`` (pass 1): from a zero state; stores the chunk's end state
    ``st[p, b, c, e, :]`` (fp32) and the sum of its step sizes ``ds[p, b, c, e]`` (the chunk's
    total decay is ``exp(A * ds)``, formed by :func:`chunk_carry_kernel`). ``OUTPUT=True``
    (pass 3): from the chunk's initial state ``st[p, b, c]`` (after the carry), writing the
    gated outputs exactly as :func:`scan_kernel` does. The step's math is scan_kernel's (delta
    read pre-bias from ``dl_ptr``; dt_proj in the kernel is not supported here), gaps
    (``HAS_GAPS``) included: both passes decay with :func:`gap_step`'s step size, so ``ds``
    sums those.
    """
    pid = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    b = pid // n_grid_chunks
    c = pid % n_grid_chunks
    i0 = c * T
    n_steps = tl.minimum(L - i0, T)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    me = offs_e < E
    a2 = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :],
                 mask=me[:, None], other=0.).to(tl.float32) * 1.4426950408889634
    dtb = tl.load(dtb_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
    st = st_ptr + p * s_sp + b * s_sb + c * s_sc + offs_e[:, None] * N + offs_n[None, :]
    if OUTPUT:
        dsk = tl.load(d_ptr + p * E + offs_e, mask=me, other=0.).to(tl.float32)
        h = tl.load(st, mask=me[:, None], other=0.)
    else:
        h = tl.zeros((BLOCK_E, N), dtype=tl.float32)
        dsum = tl.zeros((BLOCK_E, ), dtype=tl.float32)
    xc_row = xc_ptr + p * s_cp + b * s_cb + i0 * s_cl
    xd_row = xd_ptr + p * s_dp + b * s_db + i0 * s_dl
    dl_row = dl_ptr + p * s_lp + b * s_lb + i0 * s_ll
    pm_row = perm_ptr + p * s_pp + b * s_pb + i0
    out_row = out_ptr + b * s_ob + p * E
    # the chunk's first step's operands; each iteration prefetches the next step's
    u_n = tl.load(xc_row + offs_e, mask=me, other=0.)
    r_n = tl.load(dl_row + offs_e, mask=me, other=0.)
    b_n = tl.load(xd_row + R + offs_n)
    if OUTPUT:
        t_n = tl.load(pm_row)
        c_n = tl.load(xd_row + R + N + offs_n)
        z_n = tl.load(z_ptr + b * s_zb + t_n * s_zl + offs_e, mask=me, other=0.)
    if HAS_GAPS:
        gbias = softplus(dtb)
        gp_row = gap_ptr + p * s_gp + b * s_gb + i0
        g_n = tl.load(gp_row)
    for i in range(n_steps):
        u = u_n.to(tl.float32)
        dr = r_n.to(tl.float32)
        bv = b_n.to(tl.float32)
        nx = i + 1
        more = nx < n_steps
        u_n = tl.load(xc_row + nx * s_cl + offs_e, mask=me & more, other=0.)
        r_n = tl.load(dl_row + nx * s_ll + offs_e, mask=me & more, other=0.)
        b_n = tl.load(xd_row + nx * s_dl + R + offs_n, mask=(offs_n < N) & more, other=0.)
        if OUTPUT:
            t = t_n
            cv = c_n.to(tl.float32)
            zv = z_n.to(tl.float32)
            t_n = tl.load(pm_row + nx, mask=more, other=0)
            c_n = tl.load(xd_row + nx * s_dl + R + N + offs_n, mask=(offs_n < N) & more,
                          other=0.)
            z_n = tl.load(z_ptr + b * s_zb + t_n * s_zl + offs_e, mask=me & more, other=0.)
        if HAS_GAPS:
            g = g_n
            g_n = tl.load(gp_row + nx, mask=more, other=0.)
        # delta = softplus(dt + bias) as in scan_kernel
        dt = softplus(dr + dtb)
        if HAS_GAPS:
            dA = gap_step(dt, g, gbias, GAP_TOKEN)
        else:
            dA = dt
        h = tl.exp2(dA[:, None] * a2) * h + (dt * u)[:, None] * bv[None, :]
        if OUTPUT:
            y = tl.sum(h * cv[None, :], axis=1) + dsk * u
            y = y * (zv / (1. + tl.exp(-zv)))
            tl.store(out_row + t * s_ol + offs_e, y.to(out_ptr.dtype.element_ty), mask=me)
        else:
            dsum += dA
    if not OUTPUT:
        tl.store(st, h, mask=me[:, None])
        tl.store(ds_ptr + p * s_qp + b * s_qb + c * s_qc + offs_e, dsum, mask=me)


def chunk_carry_kernel(st_ptr, ds_ptr, a_ptr, E, n_chunks, s_sp, s_sb, s_sc, s_qp, s_qb, s_qc,
                       N: tl.constexpr, BLOCK_E: tl.constexpr):
    """Pass 2 of the chunked scan: one program per (sample b, block of channels, path p) walks
    the chunks in order, ``H_c = exp(A * ds_{c-1}) * H_{c-1} + end_{c-1}`` (``H_0 = 0``),
    turning ``st[p, b, c]`` in place from chunk c's end state (from a zero state; pass 1,
    chunks ``0 .. n_chunks - 2``) into its initial state (the state before its first step)."""
    b = tl.program_id(0)
    eb = tl.program_id(1)
    p = tl.program_id(2)
    offs_e = eb * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_n = tl.arange(0, N)
    me = offs_e < E
    a2 = tl.load(a_ptr + (p * E + offs_e[:, None]) * N + offs_n[None, :],
                 mask=me[:, None], other=0.).to(tl.float32) * 1.4426950408889634
    st = st_ptr + p * s_sp + b * s_sb + offs_e[:, None] * N + offs_n[None, :]
    ds = ds_ptr + p * s_qp + b * s_qb + offs_e
    h = tl.zeros((BLOCK_E, N), dtype=tl.float32)
    for c in range(n_chunks - 1):
        end = tl.load(st + c * s_sc, mask=me[:, None], other=0.)
        dsum = tl.load(ds + c * s_qc, mask=me, other=0.)
        tl.store(st + c * s_sc, h, mask=me[:, None])
        h = tl.exp2(dsum[:, None] * a2) * h + end
    tl.store(st + (n_chunks - 1) * s_sc, h, mask=me[:, None])


def add_rmsnorm_kernel(h_ptr, r_ptr, w_ptr, out_ptr, res_ptr, M, D, eps, HAS_RES: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [pid * BLOCK_M, ...): ``res = h + r`` (fp32, stored), ``out = rmsnorm(res) * w``."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < M)[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    x = tl.load(h_ptr + offs, mask=mask, other=0.).to(tl.float32)
    if HAS_RES:
        x += tl.load(r_ptr + offs, mask=mask, other=0.).to(tl.float32)
    _store_rmsnorm(x, offs, mask, cols, D, w_ptr, out_ptr, res_ptr, eps)


def merge_add_rmsnorm_kernel(h_ptr, r_ptr, w_ptr, out_ptr, res_ptr, rows_ptr, rcoef_ptr, rem_ptr,
                             rtgt_ptr, rmcoef_ptr, L, L_new, D, R, n_blocks, eps,
                             HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """A ToMe merge step fused into the block's add + RMSNorm (a merge plan of
    :func:`amvim_mm.ops.token_merge.plan_merge`).

    Program: sample b, new rows [j0, j0 + BLOCK_M). ``res[b, j] = c_j x[b, rows[b, j]]`` plus,
    for every removed token t with ``rtgt[b, t] = j``, ``rmcoef[b, t] x[b, rem[b, t]]``, where
    ``x = h + r`` is the old (B, L, D) stream; then ``out = rmsnorm(res) * w``. The removed
    tokens' targets, indices and weights are read as vectors; the loop runs over this block's
    hits only (usually none or one; a scalar loop over all ``R`` removed tokens was slower).
    """
    pid = tl.program_id(0)
    b = pid // n_blocks
    j0 = (pid % n_blocks) * BLOCK_M
    j = j0 + tl.arange(0, BLOCK_M)
    mj = j < L_new
    cols = tl.arange(0, BLOCK_D)
    mc = cols < D
    mask = mj[:, None] & mc[None, :]
    src = tl.load(rows_ptr + b * L_new + j, mask=mj, other=0)
    coef = tl.load(rcoef_ptr + b * L_new + j, mask=mj, other=0.)
    offs_in = (b * L + src)[:, None] * D + cols[None, :]
    x = tl.load(h_ptr + offs_in, mask=mask, other=0.).to(tl.float32)
    if HAS_RES:
        x += tl.load(r_ptr + offs_in, mask=mask, other=0.).to(tl.float32)
    x = x * coef[:, None]
    ro = tl.arange(0, BLOCK_R)
    mr = ro < R
    tgs = tl.load(rtgt_ptr + b * R + ro, mask=mr, other=-1)
    hit = mr & (tgs >= j0) & (tgs < j0 + BLOCK_M)
    rems = tl.load(rem_ptr + b * R + ro, mask=hit, other=0)
    cfs = tl.load(rmcoef_ptr + b * R + ro, mask=hit, other=0.)
    for _ in range(tl.sum(hit.to(tl.int32), axis=0)):
        t = tl.min(tl.where(hit, ro, BLOCK_R), axis=0)
        one = ro == t
        hit = hit & (ro != t)
        tg = tl.sum(tl.where(one, tgs, 0), axis=0)
        ri = tl.sum(tl.where(one, rems, 0), axis=0)
        cf = tl.sum(tl.where(one, cfs, 0.), axis=0)
        v = tl.load(h_ptr + (b * L + ri) * D + cols, mask=mc, other=0.).to(tl.float32)
        if HAS_RES:
            v += tl.load(r_ptr + (b * L + ri) * D + cols, mask=mc, other=0.).to(tl.float32)
        x += tl.where((j == tg)[:, None], cf * v[None, :], 0.)
    offs = (b * L_new + j)[:, None] * D + cols[None, :]
    _store_rmsnorm(x, offs, mask, cols, D, w_ptr, out_ptr, res_ptr, eps)


@triton.jit
def _store_rmsnorm(x, offs, mask, cols, D, w_ptr, out_ptr, res_ptr, eps):
    tl.store(res_ptr + offs, x, mask=mask)
    inv = 1. / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.).to(tl.float32)
    y = x * inv[:, None] * w[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
