// One whole ToMe step at CPU inference, registered as ``amvim_cpu::tome_step``: the summed
// stream, the matching (similarity, edges) and the merge in one call. The reference is
// ToMe.select followed by reduce_tokens(fold=True) (amvim_mm/models/reduction/reducers.py and
// state.py), which run the step as ~20 PyTorch operators and two compiled calls; at Vim-T's
// batch 1 that Python-level sequence cost several times the arithmetic.
//
// The similarity scores must be the reference's bit for bit (a near-tie decided the other way
// changes which tokens merge), so every value is formed by the same float32 operations:
//   stream = residual + hidden            (elementwise, exact: the same bits as at::add)
//   m      = stream * weight              (the RMSNorm weight; metric 'stream': m = stream)
//   norm   = at::linalg_vector_norm(m, 2, -1, keepdim)   (ATen's reduction, called as is)
//   ma, mb = the A / B rows of m / max(norm, 1e-12)      (F.normalize: an exact division)
//   scores = at::matmul(ma, mb^T)         (the same GEMM call on the same layouts)
// then the edge choice and the merge are the kernels of cpu_tome_edges.cpp and
// cpu_token_merge.cpp (bit-identical to their PyTorch references, tests).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/matmul.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "cpu_tome.h"

namespace {

// rows of D values per task: a batch-1 sequence stays on one thread (a parallel region costs
// more than its few hundred rows), a batch of several splits over the pool
constexpr int64_t kRowGrain = 256;

// hidden, residual: (batch, L, D) float32; weight: (D,) or absent; size (batch, L) float32, pos
// (batch, L) int64, source (batch, M) int64: the sequence's bookkeeping; a_idx, b_idx: the
// (A,) / (B,) int64 sequence indices of ToMe's two token sets (one layout for every sample);
// k: the tokens to merge. Returns (hidden, pos, size, source, removed, dst): the reduced
// sequence (the summed stream, merged) and the choice.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tome_step(
    const at::Tensor& hidden, const c10::optional<at::Tensor>& residual,
    const c10::optional<at::Tensor>& weight, const at::Tensor& size, const at::Tensor& pos,
    const at::Tensor& source, const at::Tensor& a_idx, const at::Tensor& b_idx, int64_t k,
    int64_t n_patches, int64_t cls_index) {
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat &&
                  hidden.dim() == 3 && hidden.is_contiguous(),
              "amvim_cpu::tome_step: hidden must be a contiguous (batch, L, D) float32 CPU "
              "tensor");
  const int64_t B = hidden.size(0), L = hidden.size(1), D = hidden.size(2);
  if (residual.has_value())
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->sizes() == hidden.sizes() &&
                    residual->is_contiguous(),
                "amvim_cpu::tome_step: residual must be a contiguous float32 tensor like hidden");
  if (weight.has_value())
    TORCH_CHECK(weight->scalar_type() == at::kFloat && weight->dim() == 1 &&
                    weight->size(0) == D && weight->is_contiguous(),
                "amvim_cpu::tome_step: weight must be a contiguous (D,) float32 tensor");
  for (const at::Tensor* t : {&a_idx, &b_idx})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->is_contiguous(),
                "amvim_cpu::tome_step: the token sets must be contiguous (n,) int64 tensors");
  const int64_t na = a_idx.size(0), nb = b_idx.size(0);
  const int64_t* ap = a_idx.data_ptr<int64_t>();
  const int64_t* bp = b_idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < na; ++i)
    TORCH_CHECK(ap[i] >= 0 && ap[i] < L, "amvim_cpu::tome_step: a token set index is out of "
                "the sequence");
  for (int64_t i = 0; i < nb; ++i)
    TORCH_CHECK(bp[i] >= 0 && bp[i] < L, "amvim_cpu::tome_step: a token set index is out of "
                "the sequence");

  // the summed stream and the metric rows, in one pass (two exact elementwise operations)
  at::Tensor stream = hidden;
  if (residual.has_value()) stream = at::empty({B, L, D}, hidden.options());
  at::Tensor m = weight.has_value() ? at::empty({B, L, D}, hidden.options()) : stream;
  {
    const float* hp = hidden.data_ptr<float>();
    const float* rp = residual.has_value() ? residual->data_ptr<float>() : nullptr;
    const float* wp = weight.has_value() ? weight->data_ptr<float>() : nullptr;
    float* sp = stream.data_ptr<float>();
    float* mp = m.data_ptr<float>();
    at::parallel_for(0, B * L, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t o = row * D;
        if (rp)
          for (int64_t d = 0; d < D; ++d) sp[o + d] = rp[o + d] + hp[o + d];
        if (wp)
          for (int64_t d = 0; d < D; ++d) mp[o + d] = sp[o + d] * wp[d];
      }
    });
  }
  const at::Tensor norm = at::linalg_vector_norm(m, 2, at::IntArrayRef{-1}, true);  // (B, L, 1)
  at::Tensor ma = at::empty({B, na, D}, hidden.options());
  at::Tensor mb = at::empty({B, nb, D}, hidden.options());
  {
    const float* mp = m.data_ptr<float>();
    const float* np = norm.data_ptr<float>();
    float* map = ma.data_ptr<float>();
    float* mbp = mb.data_ptr<float>();
    const float eps = static_cast<float>(1e-12);  // F.normalize's eps, as clamp_min casts it
    auto rows = [&](const int64_t* idx, int64_t n, float* out) {
      at::parallel_for(0, B * n, kRowGrain, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          const int64_t b = j / n, t = b * L + idx[j % n];
          const float nv = np[t];
          const float den = nv < eps ? eps : nv;  // clamp_min: NaN stays NaN
          const float* x = mp + t * D;
          float* y = out + j * D;
          for (int64_t d = 0; d < D; ++d) y[d] = x[d] / den;
        }
      });
    };
    rows(ap, na, map);
    rows(bp, nb, mbp);
  }
  const at::Tensor scores = at::matmul(ma, mb.transpose(1, 2));
  auto [removed, dst] = amvim_kernels::tome_edges(scores.contiguous(), a_idx, b_idx, k);
  auto [out, npos, nsize, nsrc] = amvim_kernels::fold_merge(stream, size, pos, source, removed,
                                                            dst, n_patches, cls_index);
  return {out, npos, nsize, nsrc, removed, dst};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(amvim_cpu, m) {
  m.def(
      "tome_step(Tensor hidden, Tensor? residual, Tensor? weight, Tensor size, Tensor pos, "
      "Tensor source, Tensor a_idx, Tensor b_idx, int k, int n_patches, int cls_index) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) { m.impl("tome_step", &tome_step); }
