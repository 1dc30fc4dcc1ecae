// CPU kernel of ToMe's bipartite matching at inference (the decisions of
// amvim_mm/models/reduction/reducers.py::ToMe.select, the reference): for each sample,
//   m = metric * weight (weight optional), rows normalised as F.normalize (x / max(|x|, 1e-12)),
//   score[i][j] = <m[a_i], m[b_j]>   (A tokens i, B tokens j, one layout for every sample)
//   node_max[i], node_idx[i] = max / first argmax over j   (ties: the lower j)
//   edges = the k largest node_max, a stable descending order (ties: the lower i)
//   removed = a[edges], dst = b[node_idx[edges]]
// in one call instead of ~10 PyTorch operators (about 0.35 ms a step on 2 cores at Vim-T
// size, mostly operator overhead). The dot products are float32 in another summation order
// than PyTorch's matmul, so a decision can differ from the reference only where two scores lie
// within a few float32 roundings of each other (tests: equal decisions on random and on
// duplicated tokens). Registered as ``amvim_cpu::tome_match``.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <vector>

namespace {

std::tuple<at::Tensor, at::Tensor> tome_match(const at::Tensor& metric,
                                              const c10::optional<at::Tensor>& weight,
                                              const at::Tensor& a_idx, const at::Tensor& b_idx,
                                              int64_t k) {
  TORCH_CHECK(metric.device().is_cpu() && metric.scalar_type() == at::kFloat &&
                  metric.dim() == 3 && metric.is_contiguous(),
              "amvim_cpu::tome_match: metric must be a contiguous (batch, L, D) float32 CPU "
              "tensor");
  const int64_t bsz = metric.size(0), len = metric.size(1), dim = metric.size(2);
  for (const at::Tensor* t : {&a_idx, &b_idx})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                "amvim_cpu::tome_match: the token sets must be contiguous (n,) int64 tensors");
  const int64_t na = a_idx.size(0), nb = b_idx.size(0);
  TORCH_CHECK(nb >= 1 && k >= 0 && k <= na, "amvim_cpu::tome_match: cannot merge ", k,
              " of ", na, " A tokens into ", nb, " B tokens");
  const int64_t* ap = a_idx.data_ptr<int64_t>();
  const int64_t* bp = b_idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < na; ++i)
    TORCH_CHECK(ap[i] >= 0 && ap[i] < len, "amvim_cpu::tome_match: token index out of range");
  for (int64_t j = 0; j < nb; ++j)
    TORCH_CHECK(bp[j] >= 0 && bp[j] < len, "amvim_cpu::tome_match: token index out of range");
  const float* wp = nullptr;
  if (weight.has_value()) {
    TORCH_CHECK(weight->scalar_type() == at::kFloat && weight->dim() == 1 &&
                    weight->size(0) == dim && weight->is_contiguous(),
                "amvim_cpu::tome_match: weight must be a contiguous (D,) float32 tensor");
    wp = weight->data_ptr<float>();
  }
  at::Tensor removed = at::empty({bsz, k}, a_idx.options());
  at::Tensor dst = at::empty({bsz, k}, a_idx.options());
  const float* mp = metric.data_ptr<float>();
  int64_t* rp = removed.data_ptr<int64_t>();
  int64_t* dp = dst.data_ptr<int64_t>();
  const int64_t rows = na + nb;
  std::vector<float> unit(static_cast<size_t>(rows * dim));
  std::vector<float> node_max(static_cast<size_t>(na));
  std::vector<int64_t> node_idx(static_cast<size_t>(na)), order(static_cast<size_t>(na));
  for (int64_t b = 0; b < bsz; ++b) {
    const float* mb = mp + b * len * dim;
    // the rows of A then B, times the weight and normalised (F.normalize: x / max(|x|, eps))
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* x = mb + (r < na ? ap[r] : bp[r - na]) * dim;
        float* u = unit.data() + r * dim;
        float ss = 0.f;
        for (int64_t d = 0; d < dim; ++d) {
          u[d] = wp ? x[d] * wp[d] : x[d];
          ss += u[d] * u[d];
        }
        const float norm = std::max(std::sqrt(ss), 1e-12f);
        for (int64_t d = 0; d < dim; ++d) u[d] /= norm;
      }
    });
    at::parallel_for(0, na, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float* ua = unit.data() + i * dim;
        float best = 0.f;
        int64_t arg = -1;
        for (int64_t j = 0; j < nb; ++j) {
          const float* ub = unit.data() + (na + j) * dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < dim; ++d) s += ua[d] * ub[d];
          if (arg < 0 || s > best) {  // the first maximum
            best = s;
            arg = j;
          }
        }
        node_max[i] = best;
        node_idx[i] = arg;
      }
    });
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return node_max[x] > node_max[y]; });
    for (int64_t e = 0; e < k; ++e) {
      rp[b * k + e] = ap[order[e]];
      dp[b * k + e] = bp[node_idx[order[e]]];
    }
  }
  return {removed, dst};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(amvim_cpu, m) {
  m.def("tome_match(Tensor metric, Tensor? weight, Tensor a_idx, Tensor b_idx, int k) -> "
        "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) { m.impl("tome_match", &tome_match); }
