// The ToMe kernels of the amvim_cpu library that other kernels of it call directly (no
// dispatcher round trip): the edge choice (cpu_tome_edges.cpp), the merge step
// (cpu_token_merge.cpp); cpu_tome_step.cpp chains them behind the similarity.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace amvim_kernels {

// scores (batch, A, B) float32; a_idx (A,), b_idx (B,) int64 -> (removed, dst) (batch, k)
std::tuple<at::Tensor, at::Tensor> tome_edges(const at::Tensor& scores, const at::Tensor& a_idx,
                                              const at::Tensor& b_idx, int64_t k);

// the size-weighted merge of the summed stream, the compaction and the bookkeeping
// -> (hidden, pos, size, source) of the reduced sequence
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fold_merge(
    const at::Tensor& stream, const at::Tensor& size, const at::Tensor& pos,
    const at::Tensor& source, const at::Tensor& removed, const at::Tensor& dst,
    int64_t n_patches, int64_t cls_index);

}  // namespace amvim_kernels
