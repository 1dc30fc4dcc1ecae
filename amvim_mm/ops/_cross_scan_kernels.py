"""Triton kernels of :mod:`amvim_mm.ops.cross_scan` (undecorated: compiled or wrapped for the
interpreter there).

Direction ``k`` visits raster token ``t = h * W + w`` at path position
``p0 = t``, ``p1 = w * H + h`` (column-major), ``p2 = L - 1 - p0``, ``p3 = L - 1 - p1``.
"""
import triton.language as tl


def cross_scan_kernel(x_ptr, xs_ptr, H, W, L, E, n_lb,
                      BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """x (B, L, E) channel-last -> xs (B, 4, E, L): one read of each element, four writes."""
    pid = tl.program_id(0)
    b = (pid // n_lb).to(tl.int64)          # int64 offsets: B * 4 * E * L may pass 2^31
    t = (pid % n_lb) * BLOCK_L + tl.arange(0, BLOCK_L)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mt = t < L
    m = mt[:, None] & (e < E)[None, :]
    v = tl.load(x_ptr + (b * L + t)[:, None] * E + e[None, :], mask=m, other=0.)
    p1 = (t % W) * H + t // W
    base = xs_ptr + b * 4 * E * L + e[None, :] * L
    tl.store(base + t[:, None], v, mask=m)
    tl.store(base + E * L + p1[:, None], v, mask=m)
    tl.store(base + 2 * E * L + (L - 1 - t)[:, None], v, mask=m)
    tl.store(base + 3 * E * L + (L - 1 - p1)[:, None], v, mask=m)


def cross_merge_kernel(ys_ptr, y_ptr, H, W, L, E, n_lb,
                       BLOCK_L: tl.constexpr, BLOCK_E: tl.constexpr):
    """ys (B, 4, E, L) in path order -> y (B, L, E) channel-last raster: the sum of the four
    directions, accumulated in fp32."""
    pid = tl.program_id(0)
    b = (pid // n_lb).to(tl.int64)          # int64 offsets: B * 4 * E * L may pass 2^31
    t = (pid % n_lb) * BLOCK_L + tl.arange(0, BLOCK_L)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mt = t < L
    m = mt[:, None] & (e < E)[None, :]
    p1 = (t % W) * H + t // W
    base = ys_ptr + b * 4 * E * L + e[None, :] * L
    acc = tl.load(base + t[:, None], mask=m, other=0.).to(tl.float32)
    acc += tl.load(base + E * L + p1[:, None], mask=m, other=0.).to(tl.float32)
    acc += tl.load(base + 2 * E * L + (L - 1 - t)[:, None], mask=m, other=0.).to(tl.float32)
    acc += tl.load(base + 3 * E * L + (L - 1 - p1)[:, None], mask=m, other=0.).to(tl.float32)
    tl.store(y_ptr + (b * L + t)[:, None] * E + e[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m)
