// CPU kernels of the Mamba mixer: the selective scan with the state in registers, and the causal
// depthwise conv + SiLU, both over token-major (batch, L, E) activations.
//
// Registered as torch ops ``amvim_cpu::selective_scan`` and ``amvim_cpu::conv_silu`` (the
// Python side, amvim_mm/ops/cpu_ops.py, builds and loads this file and checks the arguments),
// and the whole mixer ``amvim_cpu::mixer_forward`` (amvim_mm/ops/cpu_mixer.py), ToP's
// hidden-state alignment and importance score included.
// Inference only (no autograd formula): the callers take them without an autograd graph.
//
// Vectorisation runs across 16 channels with AVX-512, else 8 (GCC/Clang vector extensions:
// AVX on x86, NEON pairs on ARM, SSE pairs elsewhere; the library is built for the machine), the
// walk over L is sequential per channel block and the blocks of (batch x channels) run in
// parallel on ATen's thread pool. exp is a Cephes-style polynomial (about 1 ulp, the same as
// ATen's vectorised exp); the scan's exp(dt A) is 2^(dt A log2 e) with A pre-scaled (no range
// reduction by ln 2: a faster scan, outputs within 4e-8 of the exp form); the scan state of a channel block lives in a small stack array that stays in L1. The
// scan walks L in chunks of steps, each in two passes (step sizes and gates, then the
// recurrence): benchmarks/README.md has the measurements behind these choices.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
constexpr int VW = 16;         // channels per vector (one zmm register)
#else
constexpr int VW = 8;          // channels per vector (one ymm, or two xmm / NEON registers)
#endif
constexpr int kMaxState = 256;  // largest state size N
constexpr int kChunk = 64;      // steps per pass of the scan (two (kChunk, VW) buffers, in L1)
constexpr float kLog2e = 1.44269504088896341f;
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VW * sizeof(int32_t))));
// the same vector, unaligned: loads and stores of it are single instructions (a memcpy of a
// 64-byte vector was left as a library call)
typedef float vf_u __attribute__((vector_size(VW * sizeof(float)), aligned(4)));

inline vf splat(float v) { return vf{} + v; }

// the helpers of vexp / vexp2: x limited to [lo, hi] (min / max instructions); x rounded to the
// nearest integer (after a scale), y * 2^n for integral n in [-126, 127]. With AVX-512 these are
// single instructions (vminps / vmaxps, vrndscaleps, vscalefps); otherwise the rounding is the 1.5 * 2^23 trick (|x| < 2^22) and 2^n is built as the float bits
// (n + 127) << 23 with a float multiply and one conversion (no integer vector ops: AVX without
// AVX2 has none). Both give the same bits.
inline vf clamp(vf x, float lo, float hi) {
#if defined(__AVX512F__)
  // vminps / vmaxps: the selects below (x when it compares, else the bound: a NaN gives hi),
  // which GCC keeps as compare + blend pairs without -ffinite-math-only
  const __m512 v = _mm512_min_ps(reinterpret_cast<__m512>(x), _mm512_set1_ps(hi));
  return reinterpret_cast<vf>(_mm512_max_ps(v, _mm512_set1_ps(lo)));
#else
  x = x < hi ? x : splat(hi);
  return x > lo ? x : splat(lo);
#endif
}

inline vf round_scaled(vf x, float scale) {  // round(x * scale), ties to even
#if defined(__AVX512F__)
  return reinterpret_cast<vf>(_mm512_roundscale_ps(reinterpret_cast<__m512>(x * scale),
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  const vf magic = splat(12582912.0f);
  return (x * scale + magic) - magic;
#endif
}

inline vf times_pow2(vf y, vf n) {
#if defined(__AVX512F__)
  // vscalefps: y * 2^n in one instruction (the same product for n in [-126, 127])
  return reinterpret_cast<vf>(_mm512_scalef_ps(reinterpret_cast<__m512>(y),
                                               reinterpret_cast<__m512>(n)));
#else
  const vi e = __builtin_convertvector(n * 8388608.0f + 1065353216.0f, vi);  // (n + 127) << 23
  return y * reinterpret_cast<vf>(e);
#endif
}

// exp(x) for every lane: x = n ln2 + r, n = round(x / ln2) by the 1.5 * 2^23 trick, |r| <= ln2/2,
// exp(r) by Cephes' expf polynomial (about 1 ulp), 2^n built as the float bits (n + 127) << 23
// with a float multiply and one conversion (no integer vector ops: AVX without AVX2 has none).
// Inputs are clamped to the float range (min / max instructions).
inline vf vexp(vf x) {
  x = clamp(x, -87.3365447504f, 88.0f);  // 2^127 at most
  const vf n = round_scaled(x, 1.44269504088896341f);
  vf r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const vf r2 = r * r;
  vf y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  return times_pow2(y, n);
}

// 2^x for every lane (the scan's exp(dt A) with A pre-scaled by log2(e): no range reduction by
// ln 2): x = n + f, n = round(x), |f| <= 1/2, 2^f by a degree-6 polynomial fitted to the relative
// error with 2^0 = 1 exactly (1.9e-9 in float64, 1e-7 evaluated in float32, as Cephes' expf;
// exact at f = 0 matters: a slowly decaying channel multiplies its state by 2^f, f near 0, at
// every step, and a bias there compounds over L), times 2^n. Without AVX-512, x is clamped to
// [-126, 127] and 2^n built as float bits. With AVX-512 (DQ), f = x - round(x) in one
// instruction (vreduceps, exact), n = x - f, y * 2^n by vscalefps, and no clamp: vscalefps gives
// 0 / inf where 2^x under- / overflows, vreduceps gives 0 for infinities (2^-inf = 0, 2^inf =
// inf) and NaN stays NaN: 9 vector instructions instead of 16 (the clamp's compares and
// blends, the rounding trick, the exponent bits).
inline vf vexp2(vf x) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  const vf f = reinterpret_cast<vf>(_mm512_reduce_ps(reinterpret_cast<__m512>(x),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const vf n = x - f;
#else
  x = clamp(x, -126.0f, 127.0f);
  const vf n = round_scaled(x, 1.0f);
  const vf f = x - n;
#endif
  vf y = splat(1.5337576831199462e-4f);
  y = y * f + 1.339986036306473e-3f;
  y = y * f + 9.618519534354997e-3f;
  y = y * f + 5.550328997517793e-2f;
  y = y * f + 2.4022646608713982e-1f;
  y = y * f + 6.931472056005104e-1f;
  y = y * f + 1.0f;
  return times_pow2(y, n);
}

inline vf vsilu(vf x) { return x / (vexp(-x) + 1.0f); }

// softplus as torch.nn.functional.softplus (beta 1; its threshold 20 changes nothing in
// float32): max(x, 0) + log1p(exp(-|x|)), log1p(e) for e in (0, 1] by the atanh series
// 2 (s + s^3/3 + ...) with s = e / (2 + e), or of (1 + e) / 2 for e > sqrt(2) - 1, |s| <= 0.172
inline vf vsoftplus(vf x) {
  const vf ax = x < 0.0f ? -x : x;
  const vf e = vexp(-ax);
  const auto big = e > 0.41421356237f;
  // one division: numerator and denominator chosen first (the same quotient as choosing after)
  const vf s = (big ? e - 1.0f : e) / (big ? e + 3.0f : e + 2.0f);
  const vf s2 = s * s;
  vf p = splat(2.0f / 13.0f);
  p = p * s2 + 2.0f / 11.0f;
  p = p * s2 + 2.0f / 9.0f;
  p = p * s2 + 2.0f / 7.0f;
  p = p * s2 + 2.0f / 5.0f;
  p = p * s2 + 2.0f / 3.0f;
  p = p * s2 + 2.0f;
  const vf l = p * s + (big ? splat(0.693147180559945f) : vf{});
  return (x > 0.0f ? x : vf{}) + l;
}

// load / store VW channels at p (unit stride), the first n of them only when n < VW
inline vf load(const float* p, int n) {
  vf v;
  if (n == VW) {
    v = *reinterpret_cast<const vf_u*>(p);
  } else {
    v = vf{};
    for (int j = 0; j < n; ++j) v[j] = p[j];
  }
  return v;
}

inline void store(float* p, vf v, int n) {
  if (n == VW) {
    *reinterpret_cast<vf_u*>(p) = v;
  } else {
    for (int j = 0; j < n; ++j) p[j] = v[j];
  }
}

void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), "amvim_cpu: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "amvim_cpu: ", name, " must be float32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == dim, "amvim_cpu: ", name, " must have ", dim, " dimensions, got ",
              t.dim());
}

void check_channels(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.size(-1) == 1 || t.stride(-1) == 1, "amvim_cpu: ", name,
              " needs unit stride along its last dim");
}

// the optional per-step token index (1 or batch, L) int32: step t of sample b is token order[t]
struct Order {
  const int32_t* p = nullptr;
  int64_t sb = 0;
  inline int64_t at(int64_t b, int64_t t) const { return p ? p[b * sb + t] : t; }
};

Order make_order(const c10::optional<at::Tensor>& order, int64_t bsz, int64_t len) {
  Order o;
  if (!order.has_value()) return o;
  const at::Tensor& t = *order;
  TORCH_CHECK(t.scalar_type() == at::kInt && t.dim() == 2 && t.is_contiguous() &&
                  (t.size(0) == 1 || t.size(0) == bsz) && t.size(1) == len,
              "amvim_cpu: order must be a contiguous (1 or batch, L) int32 tensor");
  o.p = t.data_ptr<int32_t>();
  o.sb = t.size(0) == 1 ? 0 : len;
  return o;
}

// ---------------------------------------------------------------------------------------------
// selective scan
// ---------------------------------------------------------------------------------------------
// u, delta: (batch, L, E) in scan order, unit stride along E; with dt_proj (E, R) delta is
// instead the low-rank input (batch, L, R) (unit stride along R) and the kernel forms
// delta_t = dt_proj @ delta_t itself (R FMAs per step, instead of a skinny GEMM).
// A: (E, N). B, C: (batch, G, L, N) in scan order, unit stride along N, group g serving the
// channels g E/G .. (g+1) E/G - 1 (G = 1, or E/G a multiple of the vector width).
// D, delta_bias: (E,) or absent. z: (batch, Lz, E) in token order, read at row order[t]
// (absent: no gate). out: (batch, Lo, E), written (or, with accumulate, added to) at row
// order[t], times scale. Returns the last state (batch, E, N).
//   dt = softplus(delta + delta_bias) (or delta + delta_bias)
//   h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t;  y_t = <C_t, h_t> + D u_t;  y_t *= silu(z_t)
// want_last = false: no last state (an undefined tensor is returned; the fused mixer has no use
// for it).
// gaps (1 or batch, L) float32 in scan order, or absent: ToP's hidden-state alignment, G_t
// pruned positions right before step t decaying the state with zero input. They compose into
// the step's decay only: exp(dt'_t A) with dt'_t = dt_t + G_t softplus(delta_bias)
// (gap_token = false; delta_bias itself without delta_softplus) or dt_t (1 + G_t)
// (gap_token = true), the input term dt_t B_t u_t unchanged.
// imp: a (batch, ceil(E / VW), Lo) float32 buffer or null; each channel block adds the sum over
// its channels of max(0, y_t) (gated, before scale) at row order[t] of its own slice (ToP's
// importance; the caller sums over the blocks).
at::Tensor scan_into(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                     const at::Tensor& B, const at::Tensor& C, const c10::optional<at::Tensor>& D,
                     const c10::optional<at::Tensor>& z,
                     const c10::optional<at::Tensor>& delta_bias, bool delta_softplus,
                     const c10::optional<at::Tensor>& order, at::Tensor out, bool accumulate,
                     double scale, const c10::optional<at::Tensor>& dt_proj, bool want_last,
                     const c10::optional<at::Tensor>& gaps = c10::nullopt,
                     bool gap_token = false, float* imp = nullptr) {
  check_f32(u, "u", 3);
  check_f32(delta, "delta", 3);
  check_f32(A, "A", 2);
  check_f32(B, "B", 4);
  check_f32(C, "C", 4);
  check_f32(out, "out", 3);
  const int64_t bsz = u.size(0), len = u.size(1), dim = u.size(2), n_state = A.size(1);
  const int64_t groups = B.size(1);
  TORCH_CHECK(groups >= 1 && C.size(1) == groups && dim % groups == 0 &&
                  (groups == 1 || (dim / groups) % VW == 0),
              "amvim_cpu: B and C must be (batch, G, L, N) with E / G a multiple of ", VW,
              " (or G = 1)");
  const int64_t group_dim = dim / groups;
  const float* dtwp = nullptr;
  int64_t rank = 0;
  if (dt_proj.has_value()) {
    check_f32(*dt_proj, "dt_proj", 2);
    rank = dt_proj->size(1);
    TORCH_CHECK(dt_proj->size(0) == dim && dt_proj->is_contiguous() && rank <= 64 &&
                    delta.size(0) == bsz && delta.size(1) == len && delta.size(2) == rank,
                "amvim_cpu: with dt_proj (E, R <= 64), delta must be (batch, L, R)");
    dtwp = dt_proj->data_ptr<float>();
  } else {
    TORCH_CHECK(delta.sizes() == u.sizes(), "amvim_cpu: delta must have the shape of u");
  }
  TORCH_CHECK(A.size(0) == dim && A.is_contiguous(), "amvim_cpu: A must be contiguous (E, N)");
  for (const at::Tensor* t : {&B, &C})
    TORCH_CHECK(t->size(0) == bsz && t->size(2) == len && t->size(3) == n_state,
                "amvim_cpu: B and C must be (batch, G, L, N)");
  TORCH_CHECK(out.size(0) == bsz && out.size(2) == dim, "amvim_cpu: out must be (batch, L, E)");
  for (const at::Tensor* t : {&u, &delta, &B, &C, static_cast<const at::Tensor*>(&out)})
    check_channels(*t, "every input");
  const float* Dp = nullptr;
  const float* biasp = nullptr;
  const float* zp = nullptr;
  int64_t zsb = 0, zst = 0;
  if (D.has_value()) {
    check_f32(*D, "D", 1);
    TORCH_CHECK(D->size(0) == dim && D->is_contiguous(), "amvim_cpu: D must be (E,)");
    Dp = D->data_ptr<float>();
  }
  if (delta_bias.has_value()) {
    check_f32(*delta_bias, "delta_bias", 1);
    TORCH_CHECK(delta_bias->size(0) == dim && delta_bias->is_contiguous(),
                "amvim_cpu: delta_bias must be (E,)");
    biasp = delta_bias->data_ptr<float>();
  }
  if (z.has_value()) {
    check_f32(*z, "z", 3);
    check_channels(*z, "z");
    TORCH_CHECK(z->size(0) == bsz && z->size(2) == dim, "amvim_cpu: z must be (batch, L, E)");
    zp = z->data_ptr<float>();
    zsb = z->stride(0);
    zst = z->stride(1);
  }
  TORCH_CHECK(n_state >= 1 && n_state <= kMaxState, "amvim_cpu: state size N must be 1..",
              kMaxState);
  const float* gapp = nullptr;
  int64_t gsb = 0;
  if (gaps.has_value()) {
    check_f32(*gaps, "gaps", 2);
    TORCH_CHECK((gaps->size(0) == 1 || gaps->size(0) == bsz) && gaps->size(1) == len &&
                    gaps->stride(1) == 1,
                "amvim_cpu: gaps must be (1 or batch, L) with unit stride along L");
    gapp = gaps->data_ptr<float>();
    gsb = gaps->size(0) == 1 ? 0 : gaps->stride(0);
  }
  const Order ord = make_order(order, bsz, len);
  at::Tensor last = want_last ? at::empty({bsz, dim, n_state}, u.options()) : at::Tensor();
  const float* up = u.data_ptr<float>();
  const float* dp = delta.data_ptr<float>();
  const float* Ap = A.data_ptr<float>();
  const float* Bp = B.data_ptr<float>();
  const float* Cp = C.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* lastp = want_last ? last.data_ptr<float>() : nullptr;
  const int64_t usb = u.stride(0), ust = u.stride(1), dsb = delta.stride(0),
                dst = delta.stride(1), bsb = B.stride(0), bsg = B.stride(1),
                bst = B.stride(2), bsn = B.stride(3), csb = C.stride(0), csg = C.stride(1),
                cst = C.stride(2), csn = C.stride(3),
                osb = out.stride(0), ost = out.stride(1);
  const int64_t blocks = (dim + VW - 1) / VW;
  const float fscale = static_cast<float>(scale);
  const int64_t imp_rows = out.size(1);
  // the walk of one (sample, channel block); NS > 0: the state size known at compile time;
  // GAPS, IMP: gaps given, importance wanted (compiled apart: the plain walk is unchanged)
  auto walk = [&](auto ns_tag, auto gaps_tag, auto imp_tag, int64_t b, int64_t e0) {
    constexpr int NS = decltype(ns_tag)::value;
    constexpr bool GAPS = decltype(gaps_tag)::value, IMP = decltype(imp_tag)::value;
    const int64_t ns = NS > 0 ? NS : n_state;
    vf h[NS > 0 ? NS : kMaxState], Av[NS > 0 ? NS : kMaxState], Wv[64];
    const int nc = static_cast<int>(std::min<int64_t>(VW, dim - e0));
    const int64_t g = e0 / group_dim;  // a block lies in one group (checked above)
    for (int64_t r = 0; r < rank; ++r)
      for (int j = 0; j < VW; ++j) Wv[r][j] = j < nc ? dtwp[(e0 + j) * rank + r] : 0.f;
    for (int64_t n = 0; n < ns; ++n) {
      h[n] = vf{};
      // A log2(e): the step's exp(dt A) is 2^(dt A log2 e), one multiply per element
      for (int j = 0; j < VW; ++j) Av[n][j] = j < nc ? Ap[(e0 + j) * ns + n] * kLog2e : 0.f;
    }
    const vf Dv = Dp ? load(Dp + e0, nc) : vf{};
    const vf biasv = biasp ? load(biasp + e0, nc) : vf{};
    // a gap's step per pruned position: dt * tokv + stepv (the token's own dt, or the bias's)
    const vf tokv = splat(gap_token ? 1.f : 0.f);
    const vf stepv = gap_token ? vf{} : (delta_softplus ? vsoftplus(biasv) : biasv);
    float* impb = IMP ? imp + (b * blocks + e0 / VW) * imp_rows : nullptr;
    // chunks of kChunk steps in two passes: first every step's size dt (the low-rank
    // projection and the softplus) and gate silu(z), then the recurrence. Both are the same
    // operations as one pass, but the first pass has no dependency between steps, so its long
    // chains (exp, division, polynomial) overlap; inside the recurrence they were on the
    // critical path of each step (benchmarks/README.md, "CPU a third time").
    vf dts[kChunk], gates[kChunk];
    [[maybe_unused]] vf decays[GAPS ? kChunk : 1];  // dt' of the aligned scan's decay
    for (int64_t t0 = 0; t0 < len; t0 += kChunk) {
      const int64_t tn = std::min<int64_t>(kChunk, len - t0);
      for (int64_t i = 0; i < tn; ++i) {
        const int64_t t = t0 + i;
        vf dt = biasv;
        if (dtwp) {
          const float* lr = dp + b * dsb + t * dst;
          vf acc[4] = {};  // four partial sums: a chain of 4 FMAs per step instead of R
          int64_t r = 0;
          for (; r + 4 <= rank; r += 4)
            for (int q = 0; q < 4; ++q) acc[q] += Wv[r + q] * lr[r + q];
          for (; r < rank; ++r) acc[0] += Wv[r] * lr[r];
          dt += (acc[0] + acc[1]) + (acc[2] + acc[3]);
        } else {
          dt += load(dp + b * dsb + t * dst + e0, nc);
        }
        dts[i] = delta_softplus ? vsoftplus(dt) : dt;
        if constexpr (GAPS) decays[i] = dts[i] + gapp[b * gsb + t] * (dts[i] * tokv + stepv);
        if (zp) gates[i] = vsilu(load(zp + b * zsb + ord.at(b, t) * zst + e0, nc));
      }
      for (int64_t i = 0; i < tn; ++i) {
        const int64_t t = t0 + i;
        const vf uv = load(up + b * usb + t * ust + e0, nc);
        const vf dt = dts[i];
        vf dtd = dt;  // the decay's step size
        if constexpr (GAPS) dtd = decays[i];
        const vf du = dt * uv;
        const float* bp = Bp + b * bsb + g * bsg + t * bst;
        const float* cp = Cp + b * csb + g * csg + t * cst;
        vf y{};
#pragma GCC unroll 16
        for (int64_t n = 0; n < ns; ++n) {
          h[n] = vexp2(dtd * Av[n]) * h[n] + du * bp[n * bsn];
          y += h[n] * cp[n * csn];
        }
        y += Dv * uv;
        const int64_t row = ord.at(b, t);
        if (zp) y *= gates[i];
        if constexpr (IMP) {
          const vf pos = y > 0.0f ? y : vf{};
          float s = 0.f;
          for (int j = 0; j < VW; ++j) s += pos[j];
          impb[row] += s;
        }
        y *= fscale;
        float* o = op + b * osb + row * ost + e0;
        if (accumulate) y += load(o, nc);
        store(o, y, nc);
      }
    }
    if (lastp)
      for (int j = 0; j < nc; ++j)
        for (int64_t n = 0; n < ns; ++n) lastp[(b * dim + e0 + j) * ns + n] = h[n][j];
  };
  using yes = std::true_type;
  using no = std::false_type;
  auto pick = [&](auto ns_tag, int64_t b, int64_t e0) {
    if (gapp)
      imp ? walk(ns_tag, yes{}, yes{}, b, e0) : walk(ns_tag, yes{}, no{}, b, e0);
    else
      imp ? walk(ns_tag, no{}, yes{}, b, e0) : walk(ns_tag, no{}, no{}, b, e0);
  };
  at::parallel_for(0, bsz * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const int64_t b = job / blocks, e0 = (job % blocks) * VW;
      if (n_state == 16)
        pick(std::integral_constant<int, 16>{}, b, e0);
      else
        pick(std::integral_constant<int, 0>{}, b, e0);
    }
  });
  return last;
}

at::Tensor selective_scan(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                          const at::Tensor& B, const at::Tensor& C,
                          const c10::optional<at::Tensor>& D,
                          const c10::optional<at::Tensor>& z,
                          const c10::optional<at::Tensor>& delta_bias, bool delta_softplus,
                          const c10::optional<at::Tensor>& order, at::Tensor out,
                          bool accumulate, double scale,
                          const c10::optional<at::Tensor>& dt_proj) {
  return scan_into(u, delta, A, B, C, D, z, delta_bias, delta_softplus, order, out, accumulate,
                   scale, dt_proj, true);
}

// ---------------------------------------------------------------------------------------------
// causal depthwise conv + SiLU
// ---------------------------------------------------------------------------------------------
// x: (batch, Lx, E) token order, unit stride along E; step t of the scan order reads row
// order[t]. weight (E, K), bias (E,) or absent. Returns u (batch, L, E) contiguous in scan order:
//   u_t = silu(bias + sum_k weight[k] x_{t - (K - 1) + k})   (steps before 0 are zero)
at::Tensor conv_silu(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& order,
                     int64_t length) {
  check_f32(x, "x", 3);
  check_channels(x, "x");
  check_f32(weight, "weight", 2);
  const int64_t bsz = x.size(0), dim = x.size(2), K = weight.size(1);
  TORCH_CHECK(weight.size(0) == dim && weight.is_contiguous(),
              "amvim_cpu: weight must be contiguous (E, K)");
  TORCH_CHECK(K >= 1 && K <= 16, "amvim_cpu: conv width must be 1..16");
  TORCH_CHECK(order.has_value() || length == x.size(1), "amvim_cpu: length must be x's L");
  const float* biasp = nullptr;
  if (bias.has_value()) {
    check_f32(*bias, "bias", 1);
    TORCH_CHECK(bias->size(0) == dim && bias->is_contiguous(), "amvim_cpu: bias must be (E,)");
    biasp = bias->data_ptr<float>();
  }
  const Order ord = make_order(order, bsz, length);
  at::Tensor u = at::empty({bsz, length, dim}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* upp = u.data_ptr<float>();
  const int64_t xsb = x.stride(0), xst = x.stride(1);
  const int64_t blocks = (dim + VW - 1) / VW;
  at::parallel_for(0, bsz * blocks, 1, [&](int64_t begin, int64_t end) {
    vf w[16], win[16];  // K <= 16
    for (int64_t job = begin; job < end; ++job) {
      const int64_t b = job / blocks, e0 = (job % blocks) * VW;
      const int nc = static_cast<int>(std::min<int64_t>(VW, dim - e0));
      for (int64_t k = 0; k < K; ++k) {
        for (int j = 0; j < VW; ++j) w[k][j] = j < nc ? wp[(e0 + j) * K + k] : 0.f;
        win[k] = vf{};
      }
      const vf bv = biasp ? load(biasp + e0, nc) : vf{};
      for (int64_t t = 0; t < length; ++t) {
        for (int64_t k = 0; k + 1 < K; ++k) win[k] = win[k + 1];
        win[K - 1] = load(xp + b * xsb + ord.at(b, t) * xst + e0, nc);
        vf acc = bv;
        for (int64_t k = 0; k < K; ++k) acc += w[k] * win[k];
        store(upp + (b * length + t) * dim + e0, vsilu(acc), nc);
      }
    }
  });
  return u;
}

// ---------------------------------------------------------------------------------------------
// the whole mixer
// ---------------------------------------------------------------------------------------------
// The fused CPU mixer's inference forward (amvim_mm/ops/cpu_mixer.py) in one call: in_proj, per
// path the conv + SiLU in the path's order, x_proj and the gated scan added into the paths'
// mean at each step's token, out_proj. The same kernels and GEMMs (ATen's linear) as the calls
// one by one from Python, so the same bits; one call instead of a dozen Python-level ops and
// slices a path, which at ToMe's short sequences cost more than the scan they feed.
// hidden (batch, L, D); in_w (2E, D); out_w (D', E); conv_w (P, E, K); conv_b (P, E) or absent;
// x_proj (P, W, E) with the columns [R' step-size ranks | N B | N C | padding]; dt_w (P, E, R');
// dt_b, D (P, E); A (P, E, N); perms (P, 1 or batch, L): the token at each step of each path.
// gaps (P, 1 or batch, L) float32 or absent: ToP's alignment, path p's gap counts in path p's
// order (scan_into; gap_token picks the gaps' step size). want_importance: also ToP's
// importance (batch, L), the sum over paths and channels of max(0, gated y_p) in token order
// (before the paths' mean), else an empty tensor; the output is the same either way.
std::tuple<at::Tensor, at::Tensor> mixer_forward(
    const at::Tensor& hidden, const at::Tensor& in_w, const at::Tensor& out_w,
    const at::Tensor& conv_w, const c10::optional<at::Tensor>& conv_b, const at::Tensor& x_proj,
    const at::Tensor& dt_w, const at::Tensor& dt_b, const at::Tensor& A, const at::Tensor& D,
    const at::Tensor& perms, const c10::optional<at::Tensor>& gaps, bool gap_token,
    bool want_importance) {
  check_f32(hidden, "hidden", 3);
  check_f32(A, "A", 3);
  check_f32(x_proj, "x_proj", 3);
  check_f32(dt_w, "dt_proj", 3);
  const int64_t P = A.size(0), E = A.size(1), N = A.size(2), L = hidden.size(1);
  const int64_t rank = dt_w.size(2);
  TORCH_CHECK(in_w.dim() == 2 && in_w.size(0) == 2 * E, "amvim_cpu: in_proj must be (2E, D)");
  TORCH_CHECK(x_proj.size(0) == P && x_proj.size(1) >= rank + 2 * N && dt_w.size(0) == P,
              "amvim_cpu: x_proj must be (P, R' + 2N + pad, E), dt_proj (P, E, R')");
  TORCH_CHECK(perms.dim() == 3 && perms.size(0) == P && perms.size(2) == L,
              "amvim_cpu: perms must be (P, 1 or batch, L)");
  const int64_t bsz = hidden.size(0);
  if (gaps.has_value())
    TORCH_CHECK(gaps->dim() == 3 && gaps->size(0) == P && gaps->size(2) == L,
                "amvim_cpu: gaps must be (P, 1 or batch, L)");
  // the importance of each (sample, channel block), summed over the blocks at the end
  at::Tensor part = want_importance ? at::zeros({bsz, (E + VW - 1) / VW, L}, hidden.options())
                                    : at::Tensor();
  const at::Tensor order = perms.to(at::kInt);
  const at::Tensor xz = at::linear(hidden, in_w);  // (batch, L, 2E)
  const at::Tensor x = xz.narrow(-1, 0, E), z = xz.narrow(-1, E, E);
  at::Tensor y = at::empty({bsz, L, E}, hidden.options());
  for (int64_t k = 0; k < P; ++k) {
    const at::Tensor o = order.select(0, k).contiguous();
    c10::optional<at::Tensor> bias;
    if (conv_b.has_value()) bias = conv_b->select(0, k);
    const at::Tensor u = conv_silu(x, conv_w.select(0, k), bias, o, L);
    const at::Tensor x_dbl = at::linear(u, x_proj.select(0, k));  // (batch, L, W)
    c10::optional<at::Tensor> gap;
    if (gaps.has_value()) gap = gaps->select(0, k).contiguous();
    scan_into(u, x_dbl.narrow(-1, 0, rank), A.select(0, k),
              x_dbl.narrow(-1, rank, N).unsqueeze(1), x_dbl.narrow(-1, rank + N, N).unsqueeze(1),
              D.select(0, k), z, dt_b.select(0, k), true, o, y, k > 0,
              1.0 / static_cast<double>(P), dt_w.select(0, k), false, gap, gap_token,
              want_importance ? part.data_ptr<float>() : nullptr);
  }
  return {at::linear(y, out_w),
          want_importance ? at::sum(part, 1) : at::empty({0}, hidden.options())};
}

}  // namespace

TORCH_LIBRARY(amvim_cpu, m) {
  m.def(
      "selective_scan(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, "
      "Tensor? z, Tensor? delta_bias, bool delta_softplus, Tensor? order, Tensor(a!) out, "
      "bool accumulate, float scale, Tensor? dt_proj=None) -> Tensor");
  m.def("conv_silu(Tensor x, Tensor weight, Tensor? bias, Tensor? order, int length) -> Tensor");
  m.def(
      "mixer_forward(Tensor hidden, Tensor in_w, Tensor out_w, Tensor conv_w, Tensor? conv_b, "
      "Tensor x_proj, Tensor dt_w, Tensor dt_b, Tensor A, Tensor D, Tensor perms, "
      "Tensor? gaps=None, bool gap_token=False, bool want_importance=False) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) {
  m.impl("selective_scan", &selective_scan);
  m.impl("conv_silu", &conv_silu);
  m.impl("mixer_forward", &mixer_forward);
}
