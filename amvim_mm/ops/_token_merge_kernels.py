"""Triton kernels of :mod:`amvim_mm.ops.token_merge` (undecorated: compiled there; the helpers
they call are decorated here)."""
import triton
import triton.language as tl


def merge_plan_kernel(rem_ptr, dst_ptr, pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr,
                      rows_ptr, rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr, nsrc_ptr,
                      L, R, M, L_new, mid,
                      BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr,
                      SEP_W: tl.constexpr, FREEZE: tl.constexpr):
    """One program per sample: the merge plan of edges ``rem[b, t] -> dst[b, t]`` (who lands
    where, with which weight) and the new state (see :func:`_merge_plan`)."""
    b = tl.program_id(0)
    ro = tl.arange(0, BLOCK_R)
    mr = ro < R
    rem = tl.load(rem_ptr + b * R + ro, mask=mr, other=-1)
    dst = tl.load(dst_ptr + b * R + ro, mask=mr, other=-1)
    _merge_plan(b, rem, dst, ro, mr, pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr, rows_ptr,
                rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr, nsrc_ptr, L, R, M, L_new,
                mid, BLOCK_L, BLOCK_M, SEP_W, FREEZE)


@triton.jit
def _merge_plan(b, rem, dst, ro, mr, pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr, rows_ptr,
                rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr, nsrc_ptr, L, R, M, L_new,
                mid, BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr, SEP_W: tl.constexpr,
                FREEZE: tl.constexpr):
    """Sample b's merge plan from its edges ``rem[t] -> dst[t]`` (vectors over ``ro``, valid
    where ``mr``; -1 elsewhere): token i is removed when some ``rem[t] == i``; its weight after
    the merge is its own plus the weights merged into it (the sizes, or with ``SEP_W`` the
    row ``wt``: EViT's importance; a token whose weights are all zero keeps its value);
    survivors are renumbered in order (the class token, ``pos == -1``, at ``mid``; EViT's
    fused token, ``pos == -2``, last). ``dst[t] = -1`` prunes ``rem[t]``: it adds to no row
    (``rtgt = -1``, weight 0) and its patches get no carrier (source -1); with ``FREEZE``
    merged tokens' patches get none either (EViT: the fused token stands for no patch).

    Plan: ``rows[b, j]`` the old index of the token kept at new index j with weight
    ``rcoef[b, j]``; removed token t adds with weight ``rmcoef[b, t]`` to new row
    ``rtgt[b, t]``; new pos / size (sizes summed like the weights) / source. Work linear in
    L + R: the per-token facts go through two scratch rows of length L (``f`` int32: removed
    flags, then the new index carrying old token i; ``g`` fp32: the merged weights, then the
    merged sizes, several edges into one ``dst`` added atomically), scattered and gathered
    between block barriers. (An (L, R) comparison in registers, the first form, spilled at
    the dense tasks' L ~ 1000.)
    """
    offs = tl.arange(0, BLOCK_L)
    ml = offs < L
    row = b * L
    merged = mr & (dst >= 0)
    w = tl.load(wt_ptr + row + offs, mask=ml, other=0.)
    w_rem = tl.load(wt_ptr + row + rem, mask=mr, other=0.)
    tl.store(f_ptr + row + offs, tl.zeros((BLOCK_L, ), dtype=tl.int32), mask=ml)
    tl.store(g_ptr + row + offs, w, mask=ml)
    tl.debug_barrier()
    tl.store(f_ptr + row + rem, (ro * 0 + 1).to(tl.int32), mask=mr)
    tl.atomic_add(g_ptr + row + dst, w_rem, mask=merged)
    tl.debug_barrier()
    removed = tl.load(f_ptr + row + offs, mask=ml, other=0) > 0
    wn = tl.load(g_ptr + row + offs, mask=ml, other=0.)
    p = tl.load(pos_ptr + row + offs, mask=ml, other=-3)
    kp = (~removed) & (p >= 0) & ml
    rank = tl.cumsum(kp.to(tl.int32), axis=0) - 1
    ni = tl.where((mid >= 0) & (rank >= mid), rank + 1, rank)
    is_cls = (p == -1) & ml
    ni = tl.where(is_cls, mid, ni)
    is_fused = (p == -2) & ml & (~removed)
    ni = tl.where(is_fused, L_new - 1, ni)
    ni = tl.where(kp | is_cls | is_fused, ni, -1)
    valid = ml & (ni >= 0)
    tl.store(rows_ptr + b * L_new + ni, offs, mask=valid)
    tl.store(rcoef_ptr + b * L_new + ni, tl.where(wn > 0, w / tl.maximum(wn, 1e-12), 1.),
             mask=valid)
    tl.store(npos_ptr + b * L_new + ni, p, mask=valid)
    if not SEP_W:
        tl.store(nsize_ptr + b * L_new + ni, wn, mask=valid)
    tl.debug_barrier()
    tl.store(f_ptr + row + offs, ni, mask=ml)
    tl.debug_barrier()
    tgt = tl.load(f_ptr + row + dst, mask=merged, other=-1)                 # ni[dst[t]]
    wd = tl.load(g_ptr + row + dst, mask=merged, other=1.)                  # wn[dst[t]]
    tl.store(rtgt_ptr + b * R + ro, tgt, mask=mr)
    tl.store(rmcoef_ptr + b * R + ro, tl.where(merged, w_rem / tl.maximum(wd, 1e-12), 0.),
             mask=mr)
    tl.debug_barrier()
    if FREEZE:
        tl.store(f_ptr + row + rem, tgt * 0 - 1, mask=mr)                   # removed -> none
    else:
        tl.store(f_ptr + row + rem, tgt, mask=mr)                           # removed -> dst
    if SEP_W:   # the sizes, merged as the weights were (g is free again)
        _merged_sizes(size_ptr, g_ptr, nsize_ptr + b * L_new, row, offs, ml, rem, mr, dst,
                      merged, ni, valid)
    tl.debug_barrier()
    mo = tl.arange(0, BLOCK_M)
    mm = mo < M
    src = tl.load(src_ptr + b * M + mo, mask=mm, other=-1)
    has = mm & (src >= 0)
    ns = tl.load(f_ptr + row + src, mask=has, other=0)
    tl.store(nsrc_ptr + b * M + mo, tl.where(has, ns.to(tl.int64), src), mask=mm)


@triton.jit
def _merged_sizes(size_ptr, g_ptr, out_ptr, row, offs, ml, rem, mr, dst, merged, ni, valid):
    """The sizes after a merge whose weights were not the sizes (EViT): each token's size plus
    those merged into it, through the scratch row ``g``, stored at the new indices ``ni``."""
    sz = tl.load(size_ptr + row + offs, mask=ml, other=0.)
    sz_rem = tl.load(size_ptr + row + rem, mask=mr, other=0.)
    tl.store(g_ptr + row + offs, sz, mask=ml)
    tl.debug_barrier()
    tl.atomic_add(g_ptr + row + dst, sz_rem, mask=merged)
    tl.debug_barrier()
    sn = tl.load(g_ptr + row + offs, mask=ml, other=0.)
    tl.store(out_ptr + ni, sn, mask=valid)


@triton.jit
def _seq_index(j, cls):
    """Sequence index of patch j (the class token, at ``cls`` >= 0, is skipped)."""
    return tl.where((cls >= 0) & (j >= cls), j + 1, j)


def tome_match_kernel(h_ptr, r_ptr, w_ptr, rem_ptr, dst_ptr, L, D, n_a, n_b, cls, k,
                      pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr,
                      rows_ptr, rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr, nsrc_ptr,
                      M, mid,
                      HAS_RES: tl.constexpr, HAS_W: tl.constexpr, DOT: tl.constexpr,
                      BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr,
                      PLAN: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_M: tl.constexpr):
    """One program per sample: ToMe's bipartite matching on the stream ``h + r`` (B, L, D).

    Patch j is in set A when j is even, in B when odd. Cosine similarity of ``x * w`` between
    A and B rows (the dot products with ``input_precision=DOT``: 'ieee', 'tf32x3', 'tf32'); each A
    row's best B row; the k A rows with the highest best score (ties: lower index first) are
    written, in that order, to ``rem``/``dst`` (sequence indices). (Splitting a sample's A rows
    over several programs re-reads the B rows and was slower on an H200.) With ``PLAN`` the same
    program then makes the merge plan of those edges (:func:`merge_plan_kernel`'s work; the
    arguments after ``k`` are its).
    """
    b = tl.program_id(0)
    ja = tl.arange(0, BLOCK_A)
    ma = ja < n_a
    mb = ja < n_b
    sa = _seq_index(2 * ja, cls)
    sb = _seq_index(2 * ja + 1, cls)
    acc = tl.zeros((BLOCK_A, BLOCK_A), dtype=tl.float32)
    na2 = tl.zeros((BLOCK_A, ), dtype=tl.float32)
    nb2 = tl.zeros((BLOCK_A, ), dtype=tl.float32)
    for d0 in tl.range(0, D, BLOCK_D, num_stages=STAGES):
        dd = d0 + tl.arange(0, BLOCK_D)
        md = dd < D
        a = _weighted_rows(h_ptr, r_ptr, w_ptr, b, sa, ma, dd, md, L, D, HAS_RES, HAS_W)
        c = _weighted_rows(h_ptr, r_ptr, w_ptr, b, sb, mb, dd, md, L, D, HAS_RES, HAS_W)
        acc += tl.dot(a, tl.trans(c), input_precision=DOT)
        na2 += tl.sum(a * a, axis=1)
        nb2 += tl.sum(c * c, axis=1)
    na = tl.maximum(tl.sqrt(na2), 1e-12)
    nb = tl.maximum(tl.sqrt(nb2), 1e-12)
    scores = acc / (na[:, None] * nb[None, :])
    scores = tl.where(mb[None, :], scores, float('-inf'))
    best = tl.max(scores, axis=1)
    best_j = tl.argmax(scores, axis=1)
    best = tl.where(ma, best, float('-inf'))
    vi = best[:, None]
    vj = best[None, :]
    before = ((vj > vi) | ((vj == vi) & (ja[None, :] < ja[:, None]))) & ma[None, :]
    rank = tl.sum(before.to(tl.int32), axis=1)
    sel = ma & (rank < k)
    sd = _seq_index(2 * best_j + 1, cls)
    tl.store(rem_ptr + b * k + rank, sa.to(tl.int64), mask=sel)
    tl.store(dst_ptr + b * k + rank, sd.to(tl.int64), mask=sel)
    if PLAN:
        # the edges in rank order, from registers: edge t is the A row of rank t
        ro = tl.arange(0, BLOCK_R)
        mr = ro < k
        at = (rank[:, None] == ro[None, :]) & sel[:, None]                 # (A, R)
        rem = tl.where(mr, tl.sum(tl.where(at, sa[:, None], 0), axis=0), -1)
        dst = tl.where(mr, tl.sum(tl.where(at, sd[:, None], 0), axis=0), -1)
        _merge_plan(b, rem, dst, ro, mr, pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr,
                    rows_ptr, rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr, nsrc_ptr, L,
                    k, M, L - k, mid, BLOCK_L, BLOCK_M, False, False)


def tome_best_kernel(h_ptr, r_ptr, w_ptr, best_ptr, bidx_ptr, L, D, n_a, n_b, cls, n_split,
                     HAS_RES: tl.constexpr, HAS_W: tl.constexpr, DOT: tl.constexpr,
                     BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (sample b, block of A rows, block s of B rows): each A row's best B row of the
    block on the stream ``h + r`` (B, L, D), for sequences too long for
    :func:`tome_match_kernel`'s one tile (dense tasks); :func:`tome_rank_plan_kernel`
    combines the blocks.

    The same similarity as that kernel (dot products of ``x * w`` with ``input_precision=DOT``
    over ``BLOCK_D`` columns at a time, divided by both norms); ties within the block go to
    the lower B index. Writes ``best`` (B, n_split, n_a) fp32 and ``bidx`` (B, n_split, n_a)
    int32 (B-set index)."""
    b = tl.program_id(0).to(tl.int64)
    ja = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    s = tl.program_id(2)
    jb = s * BLOCK_B + tl.arange(0, BLOCK_B)
    ma = ja < n_a
    mb = jb < n_b
    sa = _seq_index(2 * ja, cls)
    sb = _seq_index(2 * jb + 1, cls)
    acc = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    na2 = tl.zeros((BLOCK_A, ), dtype=tl.float32)
    nb2 = tl.zeros((BLOCK_B, ), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + tl.arange(0, BLOCK_D)
        md = dd < D
        a = _weighted_rows(h_ptr, r_ptr, w_ptr, b, sa, ma, dd, md, L, D, HAS_RES, HAS_W)
        c = _weighted_rows(h_ptr, r_ptr, w_ptr, b, sb, mb, dd, md, L, D, HAS_RES, HAS_W)
        acc += tl.dot(a, tl.trans(c), input_precision=DOT)
        na2 += tl.sum(a * a, axis=1)
        nb2 += tl.sum(c * c, axis=1)
    na = tl.maximum(tl.sqrt(na2), 1e-12)
    nb = tl.maximum(tl.sqrt(nb2), 1e-12)
    scores = tl.where(mb[None, :], acc / (na[:, None] * nb[None, :]), float('-inf'))
    out = (b * n_split + s) * n_a + ja
    tl.store(best_ptr + out, tl.max(scores, axis=1), mask=ma)
    tl.store(bidx_ptr + out, tl.argmax(scores, axis=1, tie_break_left=True) + s * BLOCK_B,
             mask=ma)


def tome_rank_plan_kernel(best_ptr, bidx_ptr, rem_ptr, dst_ptr, n_a, cls, k, n_split,
                          pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr,
                          rows_ptr, rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr,
                          nsrc_ptr, L, M, mid, PLAN: tl.constexpr, BLOCK_A: tl.constexpr,
                          BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_M: tl.constexpr):
    """One program per sample, after :func:`tome_best_kernel`: each A row's best over the
    ``n_split`` blocks of B rows (a later block only when strictly better: ties to the lower
    B index), then the ``k`` A rows with the highest best score (ties: lower index first)
    written in that order to ``rem`` / ``dst`` (sequence indices), by one sort of 64-bit keys
    (the score's order-preserving integer above, ``2^31 - 1 - index`` below); with ``PLAN``
    the merge plan of those edges (:func:`merge_plan_kernel`'s work; the arguments after
    ``n_split`` are its). The combined B index goes to ``bidx``'s first block."""
    b = tl.program_id(0).to(tl.int64)
    ja = tl.arange(0, BLOCK_A)
    ma = ja < n_a
    v = tl.full((BLOCK_A, ), float('-inf'), tl.float32)
    bj = tl.zeros((BLOCK_A, ), dtype=tl.int32)
    for s in range(n_split):
        row = (b * n_split + s) * n_a + ja
        vs = tl.load(best_ptr + row, mask=ma, other=float('-inf'))
        js = tl.load(bidx_ptr + row, mask=ma, other=0)
        better = vs > v
        v = tl.where(better, vs, v)
        bj = tl.where(better, js, bj)
    tl.store(bidx_ptr + b * n_split * n_a + ja, bj, mask=ma)
    tl.debug_barrier()
    bits = v.to(tl.int32, bitcast=True)
    order = bits ^ ((bits >> 31) & 0x7FFFFFFF)            # signed order = the floats' order
    key = (order.to(tl.int64) << 32) + (0x7FFFFFFF - ja).to(tl.int64)   # masked rows: -inf
    top = tl.sort(key, 0, descending=True)
    i = 0x7FFFFFFF - (top & 0x7FFFFFFF).to(tl.int32)   # the A row at each rank
    sel = ja < k
    j = tl.load(bidx_ptr + b * n_split * n_a + i, mask=sel, other=0)
    tl.store(rem_ptr + b * k + ja, _seq_index(2 * i, cls).to(tl.int64), mask=sel)
    tl.store(dst_ptr + b * k + ja, _seq_index(2 * j + 1, cls).to(tl.int64), mask=sel)
    if PLAN:
        tl.debug_barrier()
        ro = tl.arange(0, BLOCK_R)
        mr = ro < k
        rem = tl.load(rem_ptr + b * k + ro, mask=mr, other=-1)
        dst = tl.load(dst_ptr + b * k + ro, mask=mr, other=-1)
        _merge_plan(b, rem, dst, ro, mr, pos_ptr, size_ptr, wt_ptr, src_ptr, f_ptr, g_ptr,
                    rows_ptr, rcoef_ptr, rtgt_ptr, rmcoef_ptr, npos_ptr, nsize_ptr, nsrc_ptr, L,
                    k, M, L - k, mid, BLOCK_L, BLOCK_M, False, False)


@triton.jit
def _weighted_rows(h_ptr, r_ptr, w_ptr, b, rows, mrow, dd, md, L, D, HAS_RES: tl.constexpr,
                   HAS_W: tl.constexpr):
    """``(h + r) * w`` at sequence rows ``rows``, columns ``dd`` (fp32; 0 where masked)."""
    off = (b * L + rows[:, None]) * D + dd[None, :]
    m2 = mrow[:, None] & md[None, :]
    x = tl.load(h_ptr + off, mask=m2, other=0.).to(tl.float32)
    if HAS_RES:
        x += tl.load(r_ptr + off, mask=m2, other=0.).to(tl.float32)
    if HAS_W:
        x = x * tl.load(w_ptr + dd, mask=md, other=0.).to(tl.float32)[None, :]
    return x


def rank_perm_kernel(pos_ptr, rank_ptr, rev_ptr, buf_ptr, out_ptr, B, L, M, cls, n,
                     BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program (sample b, path p): the order of the sample's tokens along path p, given by the
    path's grid ranks ``rank[p]`` (M,) and direction ``rev[p]``.

    Patch tokens sorted by ``rank[p, pos]`` (placed at their rank in a per-sample buffer of the
    grid's size, then compacted), the class token (index ``cls``, which is its slot) at ``cls``
    of the forward sequence, everything flipped when reversed: ``out[p, b, i]`` = token at path
    position i.
    """
    b = tl.program_id(0)
    p = tl.program_id(1)
    rev = tl.load(rev_ptr + p) != 0
    offs = tl.arange(0, BLOCK_L)
    ml = offs < L
    pos = tl.load(pos_ptr + b * L + offs, mask=ml, other=-3)
    isp = ml & (pos >= 0)
    r = tl.load(rank_ptr + p * M + pos, mask=isp, other=0)
    mo = tl.arange(0, BLOCK_M)
    mm = mo < M
    buf = buf_ptr + (p * B + b) * M
    tl.store(buf + mo, tl.full((BLOCK_M, ), -1, tl.int32), mask=mm)
    tl.debug_barrier()
    tl.store(buf + r, offs, mask=isp)
    tl.debug_barrier()
    v = tl.load(buf + mo, mask=mm, other=-1)
    has = mm & (v >= 0)
    slot = tl.cumsum(has.to(tl.int32), axis=0) - 1
    # the class token sits at its slot (amvim_mm.token_layout.cls_slot): ``cls`` itself
    half = cls
    fi = tl.where((cls >= 0) & (slot >= half), slot + 1, slot)
    lp = tl.where(cls >= 0, n + 1, n)
    fi = tl.where(rev, lp - 1 - fi, fi)
    out = out_ptr + (p * B + b) * L
    tl.store(out + fi, v, mask=has)
    ci = tl.where(rev, lp - 1 - half, half)
    tl.store(out + ci + offs * 0, cls + offs * 0, mask=(offs == 0) & (cls >= 0))
