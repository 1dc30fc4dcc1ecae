"""Triton kernel of the fused label map: bilinear resize of (C, h, w) logits and argmax over the
classes in one pass, never writing the resized logits (:mod:`amvim_mm.ops.label_map`).

Each program takes ``BLOCK`` output pixels of one image, computes their source rows / columns
and weights as PyTorch's CUDA ``upsample_bilinear2d`` kernel does (fp32 ``accscalar_t``), then
walks the classes, interpolating each and keeping the first maximum (NaN above every number,
the first NaN kept: ``torch.argmax``'s rule). ``VARIANT`` selects where the multiply-adds are
fused (nvcc contracts PyTorch's expressions into FMAs; which ones is the compiler's choice):
digits (source index, inner, outer) with 0 = separate multiply and add, 1 = FMA on the first
product, 2 = FMA on the second. The kernel is compiled with ``enable_fp_fusion=False`` so that
Triton fuses nothing else. ``WRITE_VALUES``: write every class's interpolated value instead (the
test of the arithmetic against ``F.interpolate``).
"""
import triton
import triton.language as tl


@triton.jit
def _src(dst, scale, ALIGN: tl.constexpr, S: tl.constexpr):
    d = dst.to(tl.float32)
    if ALIGN:
        return scale * d
    if S == 1:
        r = tl.fma(scale, d + 0.5, -0.5)
    else:
        r = scale * (d + 0.5) - 0.5
    return tl.where(r < 0.0, 0.0, r)


@triton.jit
def _mix(p, a, q, b, V: tl.constexpr):
    if V == 1:
        return tl.fma(p, a, q * b)
    if V == 2:
        return tl.fma(q, b, p * a)
    return p * a + q * b


@triton.jit
def label_map_kernel(x_ptr, out_ptr, val_ptr, C, h, w, H, W, scale_h, scale_w,
                     ALIGN: tl.constexpr, S: tl.constexpr, INNER: tl.constexpr,
                     OUTER: tl.constexpr, WRITE_VALUES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H * W
    h2 = offs // W
    w2 = offs % W
    h1r = _src(h2, scale_h, ALIGN, S)
    w1r = _src(w2, scale_w, ALIGN, S)
    h1 = h1r.to(tl.int32)
    w1 = w1r.to(tl.int32)
    h1p = tl.where(h1 < h - 1, 1, 0)
    w1p = tl.where(w1 < w - 1, 1, 0)
    h1l = h1r - h1.to(tl.float32)
    w1l = w1r - w1.to(tl.float32)
    h0l = 1.0 - h1l
    w0l = 1.0 - w1l
    i00 = h1 * w + w1
    i01 = i00 + w1p
    i10 = i00 + h1p * w
    i11 = i10 + w1p
    best = tl.full([BLOCK], float('-inf'), tl.float32)
    label = tl.zeros([BLOCK], tl.int64)
    for c in range(0, C):
        base = x_ptr + c * h * w
        a = tl.load(base + i00, mask=mask, other=0.0)
        b = tl.load(base + i01, mask=mask, other=0.0)
        d = tl.load(base + i10, mask=mask, other=0.0)
        e = tl.load(base + i11, mask=mask, other=0.0)
        val = _mix(h0l, _mix(w0l, a, w1l, b, INNER), h1l, _mix(w0l, d, w1l, e, INNER), OUTER)
        if WRITE_VALUES:
            tl.store(val_ptr + c * H * W + offs, val, mask=mask)
        else:
            take = (val > best) | ((val != val) & (best == best)) | (c == 0)
            best = tl.where(take, val, best)
            label = tl.where(take, c, label)
    if not WRITE_VALUES:
        tl.store(out_ptr + offs, label, mask=mask)
