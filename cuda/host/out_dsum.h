// D = dO . O per (row, head) for the fp16 / bf16 backward, from the forward's
// float32 rows (out_dsum.cu).
#pragma once
#include "host/tensor.h"

namespace dfgnn {

// D[i, h] = sum_c dO[i, h, c] O32[i, h, c] in fp32: grad_out [N, H, C] fp16 / bf16
// (contiguous), out32 [N, H, C] float32 (contiguous); returns [N, H] float32.
at::Tensor out_dsum_cuda(const at::Tensor& grad_out, const at::Tensor& out32);

}  // namespace dfgnn
