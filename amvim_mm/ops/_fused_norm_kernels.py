"""Triton kernels of :mod:`amvim_mm.ops.fused_add_rmsnorm` (the trainable residual add +
RMSNorm), undecorated: compiled there, or wrapped for Triton's interpreter on CPU tensors.

The arithmetic type is the dtype of the ``res`` buffer: fp32, or fp64 when the inputs are fp64
(tests). Rows are the flattened leading dimensions of the (..., D) stream; ``s`` (the per-sample
drop-path factor) is indexed by ``row // rows_per_sample``.
"""
import triton.language as tl


def add_rmsnorm_fwd_kernel(h_ptr, r_ptr, s_ptr, w_ptr, out_ptr, res_ptr, rstd_ptr, M, D,
                           rows_per_sample, eps, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows [pid * BLOCK_M, ...): ``res = r + s[b] * h`` (stored), ``rstd = 1 / sqrt(mean(res^2)
    + eps)`` (stored, (M,)), ``out = res * rstd * w`` (stored in ``out``'s dtype)."""
    acc_t = res_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    mr = rows < M
    mask = mr[:, None] & (cols < D)[None, :]
    offs = rows[:, None] * D + cols[None, :]
    x = tl.load(h_ptr + offs, mask=mask, other=0.).to(acc_t)
    if HAS_SCALE:
        s = tl.load(s_ptr + rows // rows_per_sample, mask=mr, other=0.).to(acc_t)
        x = x * s[:, None]
    if HAS_RES:
        x += tl.load(r_ptr + offs, mask=mask, other=0.).to(acc_t)
    tl.store(res_ptr + offs, x, mask=mask)
    rstd = 1. / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    tl.store(rstd_ptr + rows, rstd, mask=mr)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.).to(acc_t)
    y = x * rstd[:, None] * w[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm_bwd_kernel(res_ptr, rstd_ptr, w_ptr, s_ptr, dout_ptr, dres_ptr, dh_ptr, dr_ptr,
                           dw_ptr, M, D, rows_per_sample, n_blocks,
                           HAS_DRES: tl.constexpr, HAS_SCALE: tl.constexpr,
                           NEED_DH: tl.constexpr, NEED_DR: tl.constexpr, NEED_DW: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Backward of :func:`add_rmsnorm_fwd_kernel`. Program ``pid`` walks the row blocks
    ``pid, pid + n_prog, ...`` (a fixed assignment: the ``dw`` partials are deterministic).

    With ``x_hat = res * rstd`` and ``g = d_out * w``:
    ``d_res_total = rstd * (g - x_hat * mean(g * x_hat)) + d_res_in``; ``dr = d_res_total``,
    ``dh = s[b] * d_res_total``; this program's ``dw`` partial is the sum over its rows of
    ``d_out * x_hat``, written to row ``pid`` of ``dw`` ((n_prog, D), summed by the caller).
    """
    acc_t = res_ptr.dtype.element_ty
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    mc = cols < D
    w = tl.load(w_ptr + cols, mask=mc, other=0.).to(acc_t)
    dw = tl.zeros((BLOCK_D, ), dtype=acc_t)
    for blk in range(pid, n_blocks, n_prog):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        mr = rows < M
        mask = mr[:, None] & mc[None, :]
        offs = rows[:, None] * D + cols[None, :]
        x = tl.load(res_ptr + offs, mask=mask, other=0.).to(acc_t)
        rstd = tl.load(rstd_ptr + rows, mask=mr, other=0.).to(acc_t)
        go = tl.load(dout_ptr + offs, mask=mask, other=0.).to(acc_t)
        x_hat = x * rstd[:, None]
        if NEED_DW:
            dw += tl.sum(go * x_hat, axis=0)
        if NEED_DH or NEED_DR:
            g = go * w[None, :]
            c = tl.sum(g * x_hat, axis=1) / D
            dx = (g - x_hat * c[:, None]) * rstd[:, None]
            if HAS_DRES:
                dx += tl.load(dres_ptr + offs, mask=mask, other=0.).to(acc_t)
            if NEED_DR:
                tl.store(dr_ptr + offs, dx.to(dr_ptr.dtype.element_ty), mask=mask)
            if NEED_DH:
                if HAS_SCALE:
                    s = tl.load(s_ptr + rows // rows_per_sample, mask=mr, other=0.).to(acc_t)
                    dx = dx * s[:, None]
                tl.store(dh_ptr + offs, dx.to(dh_ptr.dtype.element_ty), mask=mask)
    if NEED_DW:
        tl.store(dw_ptr + pid * D + cols, dw, mask=mc)
