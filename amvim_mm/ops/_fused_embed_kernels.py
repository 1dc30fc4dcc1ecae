"""Triton kernel of :mod:`amvim_mm.ops.fused_embed` (undecorated: compiled there, or wrapped for
Triton's interpreter on CPU tensors)."""
import triton.language as tl


def patch_embed_kernel(x_ptr, w_ptr, bias_ptr, pos_ptr, cls_ptr, out_ptr, H, W, M, gw, D, mid,
                       n_mblocks, s_xb, s_xc, s_xh, s_ob, s_ol,
                       P: tl.constexpr, C: tl.constexpr, ROWS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_CLS: tl.constexpr,
                       ROUND: tl.constexpr, PREC: tl.constexpr):
    """Program: sample b, patches [m0, m0 + BLOCK_M), channels [n0, n0 + BLOCK_N).

    ``out[b, s(m)] = round(x_patch(m) @ w + bias) + pos[q(m)]``: the patch GEMM reads the
    (B, C, H, W) image directly (``ROWS`` patch rows of one channel per K step; pixels past the
    image are zero, the corner padding of :class:`PatchEmbed`), the product is rounded to the
    weight's dtype when ``ROUND`` (what ``F.linear`` returns under 16-bit autocast), and the
    fp32 position embedding is added. ``q(m)`` skips the class token's entry ``mid`` of ``pos``;
    the stored row ``s(m)`` skips it too when ``HAS_CLS`` (then the m-block 0 programs also
    write the class row ``cls + pos[mid]``). ``PREC``: the dot products on 16-bit operands
    (0), in tf32 (1) or in fp32 (2).
    """
    pid = tl.program_id(0)
    nb = tl.program_id(1)
    b = pid // n_mblocks
    m = (pid % n_mblocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = m < M
    mn = n < D
    gy = m // gw
    gx = m - gy * gw
    r = tl.arange(0, ROWS)
    px = tl.arange(0, P)
    col = gx[:, None, None] * P + px[None, None, :]                         # (BM, 1, P)
    mcol = mm[:, None, None] & (col < W)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    KB: tl.constexpr = ROWS * P
    for kb in range(C * (P // ROWS)):
        c = kb // (P // ROWS)
        py = (kb % (P // ROWS)) * ROWS + r                                   # (ROWS,)
        row = gy[:, None, None] * P + py[None, :, None]                      # (BM, ROWS, 1)
        xt = tl.load(x_ptr + b * s_xb + c * s_xc + row * s_xh + col,
                     mask=mcol & (row < H), other=0.)
        xt = tl.reshape(xt, (BLOCK_M, KB)).to(w_ptr.dtype.element_ty)
        k = kb * KB + tl.arange(0, KB)
        wt = tl.load(w_ptr + k[:, None] * D + n[None, :], mask=mn[None, :], other=0.)
        if PREC == 0:      # 16-bit operands
            acc += tl.dot(xt, wt)
        elif PREC == 1:
            acc += tl.dot(xt, wt, input_precision='tf32')
        else:
            acc += tl.dot(xt, wt, input_precision='ieee')
    y = acc + tl.load(bias_ptr + n, mask=mn, other=0.).to(tl.float32)[None, :]
    if ROUND:
        y = y.to(w_ptr.dtype.element_ty).to(tl.float32)
    q = tl.where(m >= mid, m + 1, m)
    y += tl.load(pos_ptr + q[:, None] * D + n[None, :], mask=mm[:, None] & mn[None, :], other=0.)
    s = q if HAS_CLS else m
    tl.store(out_ptr + b * s_ob + s[:, None] * s_ol + n[None, :], y,
             mask=mm[:, None] & mn[None, :])
    if HAS_CLS:
        if pid % n_mblocks == 0:
            v = tl.load(cls_ptr + n, mask=mn, other=0.) + tl.load(pos_ptr + mid * D + n,
                                                                  mask=mn, other=0.)
            tl.store(out_ptr + b * s_ob + mid * s_ol + n, v, mask=mn)
