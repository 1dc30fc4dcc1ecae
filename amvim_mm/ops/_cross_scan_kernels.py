"""Triton kernels of :mod:`amvim_mm.ops.cross_scan` (undecorated: compiled or wrapped for the
interpreter there).

Direction ``k`` puts token ``t`` at path position ``inv[k, b, t]``. On a full H x W grid
(``HAS_INDEX=False``) that is, for raster token ``t = h * W + w``: ``p0 = t``,
``p1 = w * H + h`` (column-major), ``p2 = L - 1 - p0``, ``p3 = L - 1 - p1``; on a reduced
sequence the positions are read from ``inv`` (K, B or 1, L) int32 (``inv_bstride`` 0 or L).
"""
import triton
import triton.language as tl


def cross_scan_kernel(x_ptr, xs_ptr, inv_ptr, H, W, L, E, n_lb, inv_bstride, inv_kstride,
                      HAS_INDEX: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """x (B, L, E) channel-last -> xs (B, 4, E, L): one read of each element, four writes."""
    pid = tl.program_id(0)
    b = (pid // n_lb).to(tl.int64)          # int64 offsets: B * 4 * E * L may pass 2^31
    t = (pid % n_lb) * BLOCK_L + tl.arange(0, BLOCK_L)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mt = t < L
    m = mt[:, None] & (e < E)[None, :]
    v = tl.load(x_ptr + (b * L + t)[:, None] * E + e[None, :], mask=m, other=0.)
    base = xs_ptr + b * 4 * E * L + e[None, :] * L
    for k in tl.static_range(4):
        p = _position(inv_ptr, k, b, t, mt, H, W, L, inv_bstride, inv_kstride, HAS_INDEX)
        tl.store(base + k * E * L + p[:, None], v, mask=m)


def cross_merge_kernel(ys_ptr, y_ptr, inv_ptr, H, W, L, E, n_lb, inv_bstride, inv_kstride,
                       HAS_INDEX: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """ys (B, 4, E, L) in path order -> y (B, L, E) channel-last token order: the sum of the
    four directions, accumulated in fp32."""
    pid = tl.program_id(0)
    b = (pid // n_lb).to(tl.int64)
    t = (pid % n_lb) * BLOCK_L + tl.arange(0, BLOCK_L)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mt = t < L
    m = mt[:, None] & (e < E)[None, :]
    base = ys_ptr + b * 4 * E * L + e[None, :] * L
    acc = tl.zeros((BLOCK_L, BLOCK_E), dtype=tl.float32)
    for k in tl.static_range(4):
        p = _position(inv_ptr, k, b, t, mt, H, W, L, inv_bstride, inv_kstride, HAS_INDEX)
        acc += tl.load(base + k * E * L + p[:, None], mask=m, other=0.).to(tl.float32)
    tl.store(y_ptr + (b * L + t)[:, None] * E + e[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _position(inv_ptr, k: tl.constexpr, b, t, mt, H, W, L, inv_bstride, inv_kstride,
              HAS_INDEX: tl.constexpr):
    """Path position of tokens ``t`` in direction ``k`` (int64)."""
    if HAS_INDEX:
        return tl.load(inv_ptr + k * inv_kstride + b * inv_bstride + t, mask=mt,
                       other=0).to(tl.int64)
    if k == 0:
        return t.to(tl.int64)
    elif k == 1:
        return ((t % W) * H + t // W).to(tl.int64)
    elif k == 2:
        return (L - 1 - t).to(tl.int64)
    else:
        return (L - 1 - ((t % W) * H + t // W)).to(tl.int64)
