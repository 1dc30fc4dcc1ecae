// CPU kernel of a block's residual add + RMSNorm at inference, over token-major (..., D) rows:
//   res = residual + hidden   (hidden alone when there is no residual yet)
//   out = res * rsqrt(mean(res^2) + eps) * weight
// in one pass over each row (PyTorch takes six operators and three temporaries for it, mostly
// operator overhead at Vim-T size; benchmarks/README.md). Float32; rows in parallel on
// ATen's thread pool. Registered as ``amvim_cpu::add_rmsnorm`` (amvim_mm/ops/cpu_ops.py checks
// the arguments and decides when it applies).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <tuple>

namespace {

at::Tensor checked_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat,
              "amvim_cpu: ", name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() >= 1 && t.is_contiguous(), "amvim_cpu: ", name, " must be contiguous");
  return t;
}

std::tuple<at::Tensor, at::Tensor> add_rmsnorm(const at::Tensor& hidden,
                                               const c10::optional<at::Tensor>& residual,
                                               const at::Tensor& weight, double eps) {
  checked_rows(hidden, "hidden");
  checked_rows(weight, "weight");
  const int64_t dim = hidden.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == dim, "amvim_cpu: weight must be (D,)");
  const float* rp = nullptr;
  if (residual.has_value()) {
    checked_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == hidden.sizes(),
                "amvim_cpu: residual must have the shape of hidden");
    rp = residual->data_ptr<float>();
  }
  at::Tensor out = at::empty_like(hidden);
  at::Tensor res = at::empty_like(hidden);
  const int64_t rows = dim ? hidden.numel() / dim : 0;
  const float* hp = hidden.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* sp = res.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  const float fdim = static_cast<float>(dim);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* h = hp + i * dim;
      float* s = sp + i * dim;
      float ss = 0.f;
      if (rp) {
        const float* r = rp + i * dim;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < dim; ++j) {
          s[j] = r[j] + h[j];
          ss += s[j] * s[j];
        }
      } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < dim; ++j) {
          s[j] = h[j];
          ss += h[j] * h[j];
        }
      }
      // as PyTorch: mean = sum / D, then + eps, rsqrt as 1 / sqrt, (res * rstd) * weight
      const float rstd = 1.0f / std::sqrt(ss / fdim + feps);
      float* o = op + i * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) o[j] = (s[j] * rstd) * wp[j];
    }
  });
  return {out, res};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(amvim_cpu, m) {
  m.def("add_rmsnorm(Tensor hidden, Tensor? residual, Tensor weight, float eps) -> "
        "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) { m.impl("add_rmsnorm", &add_rmsnorm); }
