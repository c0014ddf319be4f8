// Tokens of forward calls (call_token.h).
#include "glue/call_token.h"

#include <ATen/core/TensorBody.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/Storage.h>

#include <utility>

namespace dfgnn {
namespace {

struct TokenData {
  int64_t seed;
  PlanPtr plan;
};

void delete_token(void* data) { delete static_cast<TokenData*>(data); }

}  // namespace

at::Tensor make_token(PlanPtr plan, int64_t seed) {
  auto* data = new TokenData{seed, std::move(plan)};
  c10::DataPtr ptr(&data->seed, data, &delete_token, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), sizeof(int64_t), std::move(ptr),
                       /*allocator=*/nullptr, /*resizable=*/false);
  // The tensor made directly, not by ops through the dispatcher: every call
  // makes one, and a small graph's call is host time.
  at::Tensor token = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      caffe2::TypeMeta::Make<int64_t>());
  token.unsafeGetTensorImpl()->set_sizes_contiguous({1});
  return token;
}

TokenParts token_parts(const at::Tensor& token, const char* op) {
  TORCH_CHECK(token.defined() && token.has_storage() &&
                  token.storage().data_ptr().get_deleter() == &delete_token,
              op, ": token must be the token output of the forward call (attention_fwd) whose "
              "backward this is, as it returned it (not a copy)");
  const auto* data = static_cast<const TokenData*>(token.storage().data_ptr().get_context());
  return {data->plan, data->seed};
}

}  // namespace dfgnn
