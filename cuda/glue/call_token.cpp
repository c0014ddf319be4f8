// Tokens of forward calls (call_token.h).
#include "glue/call_token.h"

#include <ATen/ops/empty.h>
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
  return at::empty({0}, at::TensorOptions().dtype(at::kLong)).set_(storage, 0, {1}, {1});
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
