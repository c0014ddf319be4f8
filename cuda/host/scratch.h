// The float32 scratch of one kernel call (split-row partials, row sums, scores).
#pragma once
#include "host/tensor.h"
#include <initializer_list>

namespace dfgnn {

// The float32 scratch of one call (split-row partials, row sums, PMF scores):
// regions of the given numbers of floats, an empty region nullptr, each on a
// 256-byte boundary (the kernels store 16-byte vectors). Each at::empty costs a
// few µs of host time and a small graph's call is host-bound, so small scratch
// (at most kSharedBytes) shares the allocation of one of the call's outputs,
// after its elements; larger scratch (a super-node graph's partial rows, PMF scores) gets
// one of its own, freed when the call returns. The outputs themselves keep
// storages of their own: the ops' schemas promise outputs that do not alias one
// another (torch.library.opcheck checks it).
class Scratch {
 public:
  // 2 MiB: PubMed's two-launch backward scratch (split-row partials and the
  // per-edge (P', dS), 1.5 MB) fits, one allocation fewer per backward.
  static constexpr int64_t kSharedBytes = int64_t(2) << 20;
  explicit Scratch(std::initializer_list<int64_t> floats);
  // An uninitialised contiguous tensor of `sizes` and `opts` (the call's output,
  // at storage offset 0) and, in the same allocation or one of their own, the
  // scratch regions.
  at::Tensor empty_with(at::IntArrayRef sizes, const at::TensorOptions& opts);
  // The scratch regions alone, in an allocation of their own (a call whose
  // outputs the caller allocated); `opts` gives the device.
  void allocate(const at::TensorOptions& opts);
  float* operator[](size_t i) const { return ptr_[i]; }

 private:
  void place(float* base);
  static constexpr size_t kMaxRegions = 5;
  int64_t offset_[kMaxRegions] = {-1, -1, -1, -1, -1};  // floats from the scratch's start
  int64_t floats_ = 0;
  at::Tensor own_;
  float* ptr_[kMaxRegions] = {nullptr, nullptr, nullptr, nullptr, nullptr};
};

}  // namespace dfgnn
