// Scratch (scratch.h): a call's small fp32 scratch in the allocation of one of its
// outputs, one allocation fewer per call on host-bound small graphs.
#include "host/scratch.h"

namespace dfgnn {

Scratch::Scratch(std::initializer_list<int64_t> floats) {
  TORCH_INTERNAL_ASSERT(floats.size() <= kMaxRegions);
  size_t i = 0;
  for (int64_t n : floats) {
    offset_[i++] = n > 0 ? floats_ : -1;
    floats_ += n > 0 ? (n + 63) / 64 * 64 : 0;  // 256-byte regions
  }
}

void Scratch::place(float* base) {
  for (size_t i = 0; i < kMaxRegions; ++i)
    ptr_[i] = offset_[i] < 0 ? nullptr : base + offset_[i];
}

void Scratch::allocate(const at::TensorOptions& opts) {
  if (floats_ == 0) return;
  own_ = at::empty({floats_}, opts.dtype(at::kFloat));
  place(own_.data_ptr<float>());
}

at::Tensor Scratch::empty_with(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  if (floats_ == 0 || floats_ * 4 > kSharedBytes) {
    if (floats_ > 0) {
      own_ = at::empty({floats_}, opts.dtype(at::kFloat));
      place(own_.data_ptr<float>());
    }
    return at::empty(sizes, opts);
  }
  const int64_t bytes = c10::multiply_integers(sizes) * (int64_t)opts.dtype().itemsize();
  const int64_t head = (bytes + 255) / 256 * 256;
  const at::Tensor buf = at::empty({head + floats_ * 4}, opts.dtype(at::kByte));
  place(reinterpret_cast<float*>(static_cast<char*>(buf.data_ptr()) + head));
  // The output: a TensorImpl of its own on the buffer's storage, made directly
  // (no view op to dispatch, no view relation to the byte buffer).
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buf.storage()), buf.key_set(),
                                                   opts.dtype());
  impl->set_sizes_contiguous(sizes);
  return at::Tensor(std::move(impl));
}

}  // namespace dfgnn
