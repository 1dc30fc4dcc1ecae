// CPU kernel of the second half of ToMe's bipartite matching at inference (the decisions of
// amvim_mm/models/reduction/reducers.py::ToMe.select, the reference), from the similarity
// scores PyTorch computed (normalise and matmul stay there, so the scores, and with them the
// decisions, are the reference's bit for bit):
//   node_max[i], node_idx[i] = max / first argmax over j of score[i][j]   (A token i, B token j)
//   edges = the k largest node_max, a stable descending order (ties: the lower i)
//   removed = a[edges], dst = b[node_idx[edges]]
// in one call instead of six PyTorch operators (max, argsort, a slice, three gathers). NaN
// orders as torch.max and torch.sort order it: above every number. Registered as
// ``amvim_cpu::tome_edges``.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu_tome.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <vector>

namespace {

// x above y: NaN above every number (as torch.max and a descending torch.sort take it)
inline bool above(float x, float y) {
  if (std::isnan(x)) return !std::isnan(y);
  return x > y;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> amvim_kernels::tome_edges(const at::Tensor& scores,
                                                         const at::Tensor& a_idx,
                                                         const at::Tensor& b_idx, int64_t k) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat &&
                  scores.dim() == 3 && scores.is_contiguous(),
              "amvim_cpu::tome_edges: scores must be a contiguous (batch, A, B) float32 CPU "
              "tensor");
  const int64_t bsz = scores.size(0), na = scores.size(1), nb = scores.size(2);
  for (const at::Tensor* t : {&a_idx, &b_idx})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                "amvim_cpu::tome_edges: the token sets must be contiguous (n,) int64 tensors");
  TORCH_CHECK(a_idx.size(0) == na && b_idx.size(0) == nb,
              "amvim_cpu::tome_edges: the token sets must match the scores' (A, B)");
  TORCH_CHECK(nb >= 1 && k >= 0 && k <= na, "amvim_cpu::tome_edges: cannot merge ", k, " of ",
              na, " A tokens into ", nb, " B tokens");
  const int64_t* ap = a_idx.data_ptr<int64_t>();
  const int64_t* bp = b_idx.data_ptr<int64_t>();
  at::Tensor removed = at::empty({bsz, k}, a_idx.options());
  at::Tensor dst = at::empty({bsz, k}, a_idx.options());
  const float* sp = scores.data_ptr<float>();
  int64_t* rp = removed.data_ptr<int64_t>();
  int64_t* dp = dst.data_ptr<int64_t>();
  // one sample per task (a batch of one runs inline)
  at::parallel_for(0, bsz, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> node_max(static_cast<size_t>(na));
    std::vector<int64_t> node_idx(static_cast<size_t>(na)), order(static_cast<size_t>(na));
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t i = 0; i < na; ++i) {
        const float* row = sp + (b * na + i) * nb;
        int64_t arg = 0;
        for (int64_t j = 1; j < nb; ++j)
          if (above(row[j], row[arg])) arg = j;  // the first maximum
        node_max[i] = row[arg];
        node_idx[i] = arg;
      }
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return above(node_max[x], node_max[y]); });
      for (int64_t e = 0; e < k; ++e) {
        rp[b * k + e] = ap[order[e]];
        dp[b * k + e] = bp[node_idx[order[e]]];
      }
    }
  });
  return {removed, dst};
}

TORCH_LIBRARY_FRAGMENT(amvim_cpu, m) {
  m.def("tome_edges(Tensor scores, Tensor a_idx, Tensor b_idx, int k) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) { m.impl("tome_edges", &amvim_kernels::tome_edges); }
