// CPU kernel of ViL's mLSTM cell at inference, the parallel stabilised form (the official
// ``parallel_stabilized_simple``; amvim_mm/ops/mlstm.py states the math and holds the
// references). Per (batch, head), in parallel on ATen's thread pool:
//   F_t = sum_{s <= t} logsigmoid(f_s),  m_t = F_t + max_{j <= t} (i_j - F_j)
//   c[t, j] = (q_t . k_j / sqrt(DH)) exp(F_t - F_j + i_j - m_t)   (j <= t)
//   h_t = sum_j c[t, j] v_j / (max(|sum_j c[t, j]|, exp(-m_t)) + eps)
// Rows go in blocks of ROWS: the block's scores against the keys up to its last row are one
// matrix product, the gate weights, causal mask and row sums one pass over them, the values
// another product; nothing (S x S) per batch and head is materialised, and the PyTorch form's
// chain of mask / exp / max operators (most of the cell's CPU time at ViL-T size) is one loop.
// Float32. Registered as ``amvim_cpu::mlstm`` (amvim_mm/ops/cpu_ops.py decides when it applies).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>


#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t ROWS = 64;

void check(const at::Tensor& t, const char* name, int64_t dims, bool rows_only) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat,
              "amvim_cpu: mlstm ", name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == dims, "amvim_cpu: mlstm ", name, " must be ", dims, "-D");
  TORCH_CHECK(rows_only ? t.stride(-1) == 1 : t.is_contiguous(), "amvim_cpu: mlstm ", name,
              rows_only ? " must have unit stride in its last dim" : " must be contiguous");
}

inline float log_sigmoid(float x) {
  // as PyTorch: min(x, 0) - log1p(exp(-|x|))
  return std::min(x, 0.f) - std::log1p(std::exp(-std::fabs(x)));
}

// one (batch, head): q, k (S, DH), v (S, DHV) with unit stride along their rows, gates (S,)
// -> h (S, DHV), rows ``h_stride`` apart
void cell(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const float* ig,
          const float* fg, float eps, float* hp, int64_t h_stride) {
  const int64_t S = q.size(0), DH = q.size(1), DHV = v.size(1);
  // the cumulative forget gate and the row maxima in double: the weights' exponents are
  // differences of these sums, which float rounding would blur for long, strongly gated rows
  std::vector<double> F(S), m(S), g(S);
  double cum = 0.0, run = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < S; ++t) {
    cum += static_cast<double>(log_sigmoid(fg[t]));
    F[t] = cum;
    g[t] = static_cast<double>(ig[t]) - cum;       // log weight of key t, less F_row
    run = std::max(run, g[t]);
    m[t] = cum + run;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(DH));
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r0 = 0; r0 < S; r0 += ROWS) {
    const int64_t r1 = std::min(S, r0 + ROWS), keys = r1, rows = r1 - r0;
    // the gate weights of the block: exponents (<= 0; -inf above the diagonal), then one
    // vectorised exp over the block
    at::Tensor w = at::empty({rows, keys}, q.options());
    float* wp = w.data_ptr<float>();
    for (int64_t t = r0; t < r1; ++t) {
      float* row = wp + (t - r0) * keys;
      const double shift = F[t] - m[t];
      for (int64_t j = 0; j <= t; ++j) row[j] = static_cast<float>(g[j] + shift);
      std::fill(row + t + 1, row + keys, ninf);
    }
    w.exp_();
    // scores of the block's rows against keys 0 .. r1 - 1, weighted: (rows, keys)
    at::Tensor c = at::mm(q.narrow(0, r0, rows), k.narrow(0, 0, keys).t());
    float* cp = c.data_ptr<float>();
    std::vector<float> denom(rows);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = cp + i * keys;
      const float* wr = wp + i * keys;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < keys; ++j) {
        const float x = row[j] * scale * wr[j];
        row[j] = x;
        sum += x;
      }
      denom[i] = std::max(std::fabs(sum), static_cast<float>(std::exp(-m[r0 + i]))) + eps;
    }
    at::Tensor num = at::mm(c, v.narrow(0, 0, keys));   // (rows, DHV)
    const float* np = num.data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
      const float inv = 1.0f / denom[i];
      const float* src = np + i * DHV;
      float* dst = hp + (r0 + i) * h_stride;
#pragma omp simd
      for (int64_t e = 0; e < DHV; ++e) dst[e] = src[e] * inv;
    }
  }
}

// q, k (B, NH, S, DH), v (B, NH, S, DHV), each with unit stride along its last dim (the heads
// of a packed qkv projection need no copy); gates (B, NH, S) -> h (B, S, NH * DHV): the heads
// side by side, the layout the cell's output projection reads
at::Tensor mlstm(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& igate, const at::Tensor& fgate, double eps) {
  check(q, "q", 4, true);
  check(k, "k", 4, true);
  check(v, "v", 4, true);
  check(igate, "igate", 3, false);
  check(fgate, "fgate", 3, false);
  const int64_t B = q.size(0), NH = q.size(1), S = q.size(2), DHV = v.size(3);
  TORCH_CHECK(k.sizes() == q.sizes() && v.size(0) == B && v.size(1) == NH && v.size(2) == S,
              "amvim_cpu: mlstm q, k (B, NH, S, DH) and v (B, NH, S, DHV) disagree");
  TORCH_CHECK(igate.size(0) == B && igate.size(1) == NH && igate.size(2) == S &&
                  fgate.sizes() == igate.sizes(),
              "amvim_cpu: mlstm gates must be (B, NH, S)");
  at::Tensor h = at::empty({B, S, NH * DHV}, v.options());
  float* hp = h.data_ptr<float>();
  const float* ip = igate.data_ptr<float>();
  const float* fp = fgate.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, B * NH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b = u / NH, n = u % NH;
      cell(q[b][n], k[b][n], v[b][n], ip + u * S, fp + u * S, feps,
           hp + b * S * NH * DHV + n * DHV, NH * DHV);
    }
  });
  return h;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(amvim_cpu, m) {
  m.def("mlstm(Tensor q, Tensor k, Tensor v, Tensor igate, Tensor fgate, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) { m.impl("mlstm", &mlstm); }
