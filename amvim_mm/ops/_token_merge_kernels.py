"""Triton kernels of :mod:`amvim_mm.ops.token_merge` (undecorated; compiled there)."""
import triton.language as tl


def merge_bookkeeping_kernel(rem_ptr, dst_ptr, pos_ptr, size_ptr, src_ptr,
                             keep_ptr, dest_ptr, wnew_ptr, nidx_ptr,
                             tgt_ptr, coef_ptr, npos_ptr, nsize_ptr, nsrc_ptr,
                             L, R, M, L_new, mid,
                             BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
    """One program per sample: where every token goes, with which weight, and the new state.

    Scratch rows (per sample, length L): keep, dest (token carrying token i after the merge:
    itself or its destination), wnew (sizes after the merge), nidx (new index of kept tokens).
    """
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK_L)
    ml = offs < L
    ro = tl.arange(0, BLOCK_R)
    mr = ro < R
    rem = tl.load(rem_ptr + b * R + ro, mask=mr, other=0)
    dst = tl.load(dst_ptr + b * R + ro, mask=mr, other=0)
    w = tl.load(size_ptr + b * L + offs, mask=ml, other=0.)
    row = b * L
    tl.store(keep_ptr + row + offs, tl.full((BLOCK_L, ), 1, tl.int32), mask=ml)
    tl.store(dest_ptr + row + offs, offs, mask=ml)
    tl.store(wnew_ptr + row + offs, w, mask=ml)
    tl.debug_barrier()
    tl.store(keep_ptr + row + rem, tl.zeros((BLOCK_R, ), tl.int32), mask=mr)
    tl.store(dest_ptr + row + rem, dst.to(tl.int32), mask=mr)
    w_rem = tl.load(size_ptr + row + rem, mask=mr, other=0.)
    tl.atomic_add(wnew_ptr + row + dst, w_rem, mask=mr)
    tl.debug_barrier()
    keep = tl.load(keep_ptr + row + offs, mask=ml, other=0)
    dest = tl.load(dest_ptr + row + offs, mask=ml, other=0)
    p = tl.load(pos_ptr + row + offs, mask=ml, other=-3)
    kp = (keep != 0) & (p >= 0) & ml
    rank = tl.cumsum(kp.to(tl.int32), axis=0) - 1
    ni = tl.where((mid >= 0) & (rank >= mid), rank + 1, rank)
    is_cls = (p == -1) & ml
    ni = tl.where(is_cls, mid, ni)
    ni = tl.where(kp | is_cls, ni, -1)
    tl.store(nidx_ptr + row + offs, ni, mask=ml)
    tl.debug_barrier()
    tgt = tl.load(nidx_ptr + row + dest, mask=ml, other=0)
    wd = tl.load(wnew_ptr + row + dest, mask=ml, other=1.)
    tl.store(tgt_ptr + row + offs, tgt, mask=ml)
    tl.store(coef_ptr + row + offs, w / tl.maximum(wd, 1e-12), mask=ml)
    valid = ml & (ni >= 0)
    wn = tl.load(wnew_ptr + row + offs, mask=ml, other=0.)
    tl.store(npos_ptr + b * L_new + ni, p, mask=valid)
    tl.store(nsize_ptr + b * L_new + ni, wn, mask=valid)
    mo = tl.arange(0, BLOCK_M)
    mm = mo < M
    src = tl.load(src_ptr + b * M + mo, mask=mm, other=-1)
    has = mm & (src >= 0)
    d = tl.load(dest_ptr + row + src, mask=has, other=0)
    ns = tl.load(nidx_ptr + row + d, mask=has, other=0)
    tl.store(nsrc_ptr + b * M + mo, tl.where(has, ns.to(tl.int64), src), mask=mm)


def merge_scatter_kernel(x_ptr, tgt_ptr, coef_ptr, out_ptr, L, D, L_new, n_tblocks,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """``out[b, tgt[b, i]] += coef[b, i] * x[b, i]`` (x fp32 (B, L, D), out zeroed)."""
    pid = tl.program_id(0)
    b = pid // n_tblocks
    tb = pid % n_tblocks
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mt = t < L
    md = d < D
    m2 = mt[:, None] & md[None, :]
    tgt = tl.load(tgt_ptr + b * L + t, mask=mt, other=0)
    c = tl.load(coef_ptr + b * L + t, mask=mt, other=0.)
    x = tl.load(x_ptr + (b * L + t[:, None]) * D + d[None, :], mask=m2, other=0.).to(tl.float32)
    tl.atomic_add(out_ptr + (b * L_new + tgt[:, None]) * D + d[None, :], x * c[:, None], mask=m2)
