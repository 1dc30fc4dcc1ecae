// CPU kernel of a ToMe merge step at inference: the size-weighted merge of the summed stream,
// the compaction (survivors in order, the class token back at the middle) and the per-sample
// bookkeeping (pos, size, source) in one call instead of ~40 small PyTorch ops.
//
// Registered as ``amvim_cpu::fold_merge`` (a fragment of the ``amvim_cpu`` library of
// cpu_mixer.cpp). The reference is amvim_mm/models/reduction/state.py::reduce_tokens with
// fold=True, weight=None, merges=True, freeze_sources=False (what ToMe takes at inference); the
// arithmetic is the same float32 operations in the same order (the merge weights are whole
// patch counts; each merged row is 0 + the products of its tokens added in sequence order, as
// PyTorch's scatter_add adds them), so the results agree bit for bit (tests).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cpu_tome.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

void check_2d(const at::Tensor& t, const char* name, at::ScalarType type, int64_t rows) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.dim() == 2 &&
                  t.size(0) == rows && t.is_contiguous(),
              "amvim_cpu::fold_merge: ", name, " must be a contiguous (batch, n) ", type,
              " CPU tensor");
}

// row += x * c, the product rounded before the sum (PyTorch's mul, then scatter_add): no fused
// multiply-add here, whatever -march allows
#if defined(__clang__)
void add_scaled(float* row, const float* x, float c, int64_t n) {
#pragma clang fp contract(off)
  for (int64_t d = 0; d < n; ++d) row[d] += x[d] * c;
}
#else
__attribute__((optimize("fp-contract=off"))) void add_scaled(float* row, const float* x, float c,
                                                             int64_t n) {
  for (int64_t d = 0; d < n; ++d) row[d] += x[d] * c;
}
#endif

}  // namespace

// stream (B, L, D) float32: residual + hidden; size (B, L) float32 token sizes; pos (B, L) int64
// grid positions (< 0: not a patch); source (B, M) int64 token carrying each grid patch (-1:
// pruned); removed, dst (B, r) int64: distinct removed patch tokens and the survivor each merges
// into. Returns (hidden (B, L - r, D) float32, pos, size, source) of the reduced sequence.

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> amvim_kernels::fold_merge(
    const at::Tensor& stream, const at::Tensor& size, const at::Tensor& pos,
    const at::Tensor& source, const at::Tensor& removed, const at::Tensor& dst,
    int64_t n_patches, int64_t cls_index) {
  TORCH_CHECK(stream.device().is_cpu() && stream.scalar_type() == at::kFloat &&
                  stream.dim() == 3 && stream.is_contiguous(),
              "amvim_cpu::fold_merge: stream must be a contiguous (batch, L, D) float32 CPU "
              "tensor");
  const int64_t B = stream.size(0), L = stream.size(1), D = stream.size(2);
  check_2d(size, "size", at::kFloat, B);
  check_2d(pos, "pos", at::kLong, B);
  check_2d(source, "source", at::kLong, B);
  check_2d(removed, "removed", at::kLong, B);
  check_2d(dst, "dst", at::kLong, B);
  const int64_t r = removed.size(1), M = source.size(1);
  TORCH_CHECK(size.size(1) == L && pos.size(1) == L && dst.size(1) == r,
              "amvim_cpu::fold_merge: size and pos must be (batch, L), dst like removed");
  const int64_t n_keep = n_patches - r;
  const bool has_cls = cls_index >= 0;
  const int64_t L_new = n_keep + (has_cls ? 1 : 0);
  TORCH_CHECK(n_keep >= 0 && L_new == L - r,
              "amvim_cpu::fold_merge: the sequence must be the patch tokens plus at most a class "
              "token (L = ", L, ", ", n_patches, " patches, ", r, " removed)");
  const int64_t mid = n_keep / 2;  // token_layout.cls_slot
  at::Tensor out = at::zeros({B, L_new, D}, stream.options());
  at::Tensor npos = at::empty({B, L_new}, pos.options());
  at::Tensor nsize = at::empty({B, L_new}, size.options());
  at::Tensor nsrc = at::empty({B, M}, source.options());
  const float* sp = stream.data_ptr<float>();
  const float* szp = size.data_ptr<float>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* srcp = source.data_ptr<int64_t>();
  const int64_t* remp = removed.data_ptr<int64_t>();
  const int64_t* dstp = dst.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  int64_t* npp = npos.data_ptr<int64_t>();
  float* nszp = nsize.data_ptr<float>();
  int64_t* nsrcp = nsrc.data_ptr<int64_t>();
  // one sample per task; a failed check is reported after the loop (no throw inside it)
  std::vector<int> bad(B, 0);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> dest(L), new_index(L), order;
    std::vector<float> w_new(L);
    std::vector<char> keep(L);
    order.reserve(L);
    for (int64_t b = begin; b < end; ++b) {
      const float* w = szp + b * L;
      const int64_t* rem = remp + b * r;
      const int64_t* ds = dstp + b * r;
      for (int64_t i = 0; i < L; ++i) {
        dest[i] = i;
        w_new[i] = w[i];
        keep[i] = 1;
        new_index[i] = -1;
      }
      bool ok = true;
      for (int64_t j = 0; j < r && ok; ++j)
        ok = rem[j] >= 0 && rem[j] < L && ds[j] >= 0 && ds[j] < L && keep[rem[j]];
      if (ok) {
        for (int64_t j = 0; j < r; ++j) {  // scatter_add of the removed sizes, in order
          w_new[ds[j]] += w[rem[j]];
          dest[rem[j]] = ds[j];
          keep[rem[j]] = 0;
        }
        for (int64_t j = 0; j < r && ok; ++j) ok = keep[ds[j]];  // every dst survives
      }
      order.clear();
      if (ok) {
        for (int64_t i = 0; i < L; ++i)
          if (keep[i] && pp[b * L + i] >= 0) order.push_back(i);  // kept patches, in order
        ok = static_cast<int64_t>(order.size()) == n_keep;
      }
      for (int64_t m = 0; m < M && ok; ++m) ok = srcp[b * M + m] < L;  // a token of this sequence
      if (!ok) {
        bad[b] = 1;
        continue;
      }
      if (has_cls) order.insert(order.begin() + mid, cls_index);
      for (int64_t i = 0; i < L_new; ++i) {
        new_index[order[i]] = i;
        npp[b * L_new + i] = pp[b * L + order[i]];
        nszp[b * L_new + i] = w_new[order[i]];
      }
      for (int64_t m = 0; m < M; ++m) {
        const int64_t s = srcp[b * M + m];
        nsrcp[b * M + m] = s >= 0 ? new_index[dest[s]] : s;
      }
      const float* x = sp + b * L * D;
      float* o = op + b * L_new * D;
      for (int64_t i = 0; i < L; ++i) {  // the weighted rows, added in sequence order
        const float coef = w[i] / std::max(w_new[dest[i]], 1e-12f);
        add_scaled(o + std::max<int64_t>(new_index[dest[i]], 0) * D, x + i * D, coef, D);
      }
    }
  });
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(!bad[b], "amvim_cpu::fold_merge: sample ", b, ": removed must be distinct patch "
                "tokens of the sequence, every dst a surviving token and every source a token "
                "of the sequence (or negative)");
  return {out, npos, nsize, nsrc};
}

TORCH_LIBRARY_FRAGMENT(amvim_cpu, m) {
  m.def(
      "fold_merge(Tensor stream, Tensor size, Tensor pos, Tensor source, Tensor removed, "
      "Tensor dst, int n_patches, int cls_index) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(amvim_cpu, CPU, m) { m.impl("fold_merge", &amvim_kernels::fold_merge); }
