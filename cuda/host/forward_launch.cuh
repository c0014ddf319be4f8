// The host side of a score's CUDA-core forward (kernels/row_forward.cuh, SMMF;
// kernels/edge_sddmm.cuh then softmax_spmm, PMF): the row shape, the SMMF's
// two-rows, merge and EXTRAS variants, as the kernel plan says. A score's file
// instantiates it for its functor (scores/<name>.cu, scores/dot_forward.cu).
#pragma once

#include <tuple>

#include "host/dispatch.cuh"
#include "host/forward_call.h"
#include "kernels/edge_sddmm.cuh"
#include "kernels/row_forward.cuh"

namespace dfgnn {

// The SMMF launch of Score over row shape S: two rows per warp where the plan
// says so (with_smmf_shape raises where S has no such variant), the variant that
// merges split rows where fc has counters, the EXTRAS variant where the call
// has dropout or returns attention weights.
template <template <class> class Score, typename S>
void launch_row_smmf(const char* op, const typename Score<S>::Params& sp, const LayoutView& L,
                     ForwardCall& fc, int H, int C, float p, int64_t seed, bool two_rows) {
  using T = typename S::T;
  const Work& rw = L.rw;
  const int64_t n_units = rw.items.size(0) * H;
  if (n_units == 0) return;
  with_smmf_shape<S>(op, two_rows, [&](auto shape2, auto uf) {
    using S2 = decltype(shape2);
    constexpr int UF = decltype(uf)::value;
    with_merge_variant<T>(fc.counters != nullptr, [&](auto merge) {
      constexpr bool M = decltype(merge)::value;
      std::apply([&](auto... in) {
        auto kern = p > 0.f || fc.need_attn
                        ? row_fwd_smmf_kernel<Score<S2>, true, UF, M, decltype(in)...>
                        : row_fwd_smmf_kernel<Score<S2>, false, UF, M, decltype(in)...>;
        kern<<<ceil_div(n_units * S2::G, kNodeBlock), kNodeBlock, 0,
               c10::cuda::getCurrentCUDAStream()>>>(
            L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(), rw.items.data_ptr<int>(),
            (int)L.chunk, mptr<T>(fc.out), fc.out32_ptr(), fc.lse2.data_ptr<float>(), fc.attn_ptr(),
            fc.partial(), fc.partial_ml(), n_units, H, C, p, (uint64_t)seed, fc.counters, in...);
      }, sp.tie());
      check_launch();
    });
  });
}

// The edge-parallel SDDMM of Score into fc's score buffer (PMF step 1).
template <template <class> class Score, typename S>
void launch_edge_sddmm(const typename Score<S>::Params& sp, const LayoutView& L,
                       ForwardCall& fc, int H, int C) {
  constexpr int kThreads = 256;  // edge-parallel PMF kernels
  const int64_t n_units = L.col.numel() * H;
  if (n_units == 0) return;
  std::apply([&](auto... in) {
    edge_sddmm_kernel<Score<S>, decltype(in)...><<<ceil_div(n_units * S::G, kThreads), kThreads,
                                                   0, c10::cuda::getCurrentCUDAStream()>>>(
        L.csr_row.data_ptr<int>(), L.col.data_ptr<int>(), fc.score(), n_units, H, C, in...);
  }, sp.tie());
  check_launch();
}

// A score's CUDA-core forward into fc (out, lse2, attn), SMMF or PMF as the plan
// says, with `value` the summed rows (softmax_spmm's, PMF) and make(TypeTag<T>{})
// the score's Params for the call's kernel type T. Callers check the plan's
// vector_rows against their tensors (check_vector_rows). HAS_PMF false: the score
// has no PMF path (pmf raises).
template <template <class> class Score, bool HAS_PMF = true, typename Make>
void row_forward(const char* op, ForwardCall& fc, const at::Tensor& value, const LayoutView& L,
                 const KernelPlan& plan, double dropout, int64_t seed, Make&& make) {
  const int64_t H = fc.out.size(1), C = fc.out.size(2);
  const at::ScalarType st = fc.out.scalar_type();
  TORCH_CHECK(HAS_PMF || !plan.pmf, op, ": pmf=True, but this score runs SMMF only");
  check_two_rows(op, plan, L, st, C);
  fc.merge_in_kernel(op, plan, L);
  dispatch_rows(st, C, plan.vector_rows, op, [&](auto shape) {
    using S = decltype(shape);
    if constexpr (Score<S>::kHasKernels) {
      const auto sp = make(TypeTag<typename S::T>{});
      if constexpr (HAS_PMF) {
        if (plan.pmf) return launch_edge_sddmm<Score, S>(sp, L, fc, (int)H, (int)C);
      }
      launch_row_smmf<Score, S>(op, sp, L, fc, (int)H, (int)C, (float)dropout, seed,
                                plan.two_rows);
    } else {
      TORCH_CHECK(false, op, ": this score has no kernels for ", st);
    }
  });
  fc.finish(value, L, plan, dropout, seed);
}

}  // namespace dfgnn
