// The host side of a score's CUDA-core backward (kernels/row_backward.cuh):
// D for fp16 / bf16 inputs, scratch, the plan's launches (one or two; the dot score's
// tensor-core walks through hooks), the split rows' merge and the parameter
// gradient's sum. A score's file instantiates it for its functor
// (scores/gatv2_backward.cu, scores/dot_backward.cu).
#pragma once

#include <tuple>

#include "host/dispatch.cuh"
#include "host/ops.h"
#include "host/scratch.h"
#include "host/out_dsum.h"
#include "host/split_merge.h"
#include "kernels/row_backward.cuh"

namespace dfgnn {

// One backward call as the walks see it: dO, the forward's out and lse2, the
// layout, the plan, attention dropout, and `qrow` / `krow`, tensors of the
// query's and the key's shape and options (for the gradients' allocations).
struct BackwardArgs {
  const char* op;
  const at::Tensor& grad_out;
  const at::Tensor& out;
  const at::Tensor& lse2;
  const at::Tensor& qrow;
  const at::Tensor& krow;
  const LayoutView& L;
  const KernelPlan& plan;
  double dropout;
  int64_t seed;
};

// A backward's results: dq, dk, dv (undefined where the score sums its key
// rows, kEdgeInKeyOnly included: dk is the whole gradient of the one gathered
// row), the score's
// parameter gradient [H, C] in fp32 (kParamGrad; undefined otherwise) and its
// edge rows' gradient [E, H, C] in CSR order (kEdgeRows, kEdgeTail: [E, H, D];
// undefined otherwise).
struct RowGrads {
  at::Tensor dq, dk, dv, param, de;
};

template <template <class> class Score> using ScoreProbe = Score<RowShape<float, 1, 32, 1>>;

// An fp16 / bf16 backward's out32 (ForwardCall::out32), which D comes from.
inline void check_out32(const char* op, const at::Tensor& out32) {
  TORCH_CHECK(out32.defined(), op, ": an fp16 / bf16 backward takes D = dO . O from the "
              "forward's float32 rows, and the call has none (a forward without the CSC "
              "keeps none)");
}

// D_i = dO_i . O_i [N_dst, H] in fp32 for an fp16 / bf16 backward, from out32,
// the forward's rows before their rounding (ForwardCall::out32); undefined for
// fp32 inputs (each dq item computes dO_i . O_i from out itself). Where the dP_ij
// of a row are close (duplicate or similar neighbours) dS = P (dP - D) keeps
// only their difference with D, and D from O rounded to fp16 / bf16 loses most
// of its bits (dK off by a median 1.2e-2 relative on a small graph with
// duplicate edges, against 2e-7 with O in fp32; docs/backward.md). One pass
// over [N_dst, H, C] (host/out_dsum.cu).
inline at::Tensor out_dsum(const char* op, const at::Tensor& grad_out, const at::Tensor& out32) {
  if (grad_out.scalar_type() == at::kFloat) return {};
  check_out32(op, out32);
  return out_dsum_cuda(grad_out.contiguous(), out32);
}

// No tensor-core walks (every score but the dot score's mma_backward).
struct NoMmaWalks {
  bool on = false;
  void dq(at::Tensor&, float*) const {}
  void dkv(at::Tensor&, at::Tensor&, const float*) const {}
};

// A score's CUDA-core backward walks as the plan says (bwd_one_launch,
// bwd_merge_in_kernel, vector_rows: callers check their tensors against it);
// `dsum`: D in fp32 (fp16 / bf16 inputs, out_dsum) or nullptr (fp32: each dq
// item computes dO_i . O_i); `into`: given outputs, undefined entries allocated;
// mma: the dot score's tensor-core walks where mma.on (whole rows: no split-row
// partials), mma.dq(dq, pds) then mma.dkv(dk, dv, pds).
template <template <class> class Score, typename Make, typename Mma = NoMmaWalks>
RowGrads row_backward(const BackwardArgs& a, const GradsOut* into, const float* dsum,
                      Make&& make, const Mma& mma = Mma{}) {
  using Probe = ScoreProbe<Score>;
  constexpr bool kTwo = kOwnValueRowOf<Probe>, kParam = Probe::kParamGrad;
  constexpr bool kEdge = kEdgeRowsOf<Probe>;
  const LayoutView& L = a.L;
  const Work &rw = L.rw, &cw = L.cw;
  const int64_t H = a.qrow.size(1), C = a.qrow.size(2), E = L.col.numel();
  const bool one_launch = a.plan.bwd_one_launch;
  TORCH_CHECK(!kEdge || (!one_launch && !mma.on), a.op, ": a score with edge rows runs the "
              "two-launch CUDA-core backward (bwd_one_launch=False, mma_backward=False)");
  // The split rows' partial dQ, dK, dV rows, in two launches the dq kernel's
  // per-edge (P', dS) [E, H, 2] for the dkv kernel, and the parameter
  // gradient's rows per CSR work item; small ones in dQ's allocation
  // (host/scratch.h).
  const int64_t q_slots = mma.on ? 0 : rw.num_slots, kv_slots = mma.on ? 0 : cw.num_slots;
  const int64_t n_items = rw.items.size(0);
  // No (P', dS) where the plan saves no weights (the dense-tile dkv launch
  // recomputes them): that region is then empty and pds null.
  const bool save = !one_launch && a.plan.save_weights;
  Scratch scratch({q_slots * H * C, kv_slots * H * C, kTwo ? kv_slots * H * C : 0,
                   save ? E * H * 2 : 0, kParam ? n_items * H * C : 0});
  RowGrads r;
  if (into != nullptr && into->dq.defined()) {
    r.dq = into->dq;
    scratch.allocate(a.qrow.options());
  } else {
    r.dq = scratch.empty_with(a.qrow.sizes(), a.qrow.options());
  }
  // dK and dV are allocated after the dq kernel's launch in two launches: a small
  // graph's backward is host-bound, and their allocations then run while the dq
  // kernel does instead of before it. One given, the other gets its row stride
  // (the kernels take one for both).
  auto alloc_dkv = [&] {
    const at::Tensor none;
    const at::Tensor& gk = into != nullptr ? into->dk : none;
    const at::Tensor& gv = into != nullptr ? into->dv : none;
    auto like = [&](const at::Tensor& other) {
      return other.defined() ? at::empty_strided(a.krow.sizes(), other.strides(), a.krow.options())
                             : at::empty_like(a.krow);
    };
    r.dk = gk.defined() ? gk : like(gv);
    if constexpr (kTwo) r.dv = gv.defined() ? gv : like(r.dk);
  };
  float* pds_f = scratch[3];
  float2* pds = reinterpret_cast<float2*>(pds_f);
  float* param = scratch[4];
  const float p = (float)a.dropout;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t n_dst_units = n_items * H, n_src_units = cw.items.size(0) * H;
  const BackwardCounters cnt =
      mma.on ? BackwardCounters{nullptr, nullptr}
             : backward_split_counters(a.op, a.plan, a.qrow.scalar_type(), rw, cw, H, one_launch);
  dispatch_rows(a.qrow.scalar_type(), C, a.plan.vector_rows, a.op, [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    using Sc = Score<S>;
    constexpr int G = S::G;
    const auto params = make(TypeTag<T>{});
    const auto fields = params.tie();
    if constexpr (kEdge) {
      int64_t width = C;
      if constexpr (kEdgeTailOf<Sc>) width = Sc::edge_width(params);
      r.de = at::empty({E, H, width}, a.qrow.options());
    }
    const int64_t dq_blocks = ceil_div(n_dst_units * G, kNodeBlock);
    const int64_t dkv_blocks = ceil_div(n_src_units * G, kNodeBlock);
    auto dv_ptr = [&] { return kTwo ? mptr<T>(r.dv) : nullptr; };
    if constexpr (!kEdge) {
      if (one_launch) {
        alloc_dkv();
        if (dq_blocks + dkv_blocks > 0) {
          std::apply([&](auto... in) {
            auto kern = p > 0.f ? row_bwd_one_launch_kernel<Sc, true, decltype(in)...>
                                : row_bwd_one_launch_kernel<Sc, false, decltype(in)...>;
            kern<<<dq_blocks + dkv_blocks, kNodeBlock, 0, stream>>>(
                cptr<T>(a.grad_out), cptr<T>(a.out), a.lse2.data_ptr<float>(), dsum,
                L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(), rw.items.data_ptr<int>(),
                L.colptr.data_ptr<int>(), L.row.data_ptr<int>(), L.perm.data_ptr<int>(),
                cw.items.data_ptr<int>(), (int)L.chunk, mptr<T>(r.dq), mptr<T>(r.dk), dv_ptr(),
                r.dq.stride(0), r.dk.stride(0), scratch[0], scratch[1], scratch[2], param,
                n_dst_units, n_src_units, H, C, p, (uint64_t)a.seed, cnt.csr, cnt.csc,
                (unsigned)dq_blocks, in...);
          }, fields);
          check_launch();
        }
        return;
      }
    }
    if (mma.on) {  // before dkv: it writes (P', dS)
      mma.dq(r.dq, pds_f);
    } else if (dq_blocks > 0) {
      std::apply([&](auto... in) {
        auto kern = p > 0.f ? row_bwd_dq_kernel<Sc, true, decltype(in)...>
                            : row_bwd_dq_kernel<Sc, false, decltype(in)...>;
        kern<<<dq_blocks, kNodeBlock, 0, stream>>>(
            cptr<T>(a.grad_out), cptr<T>(a.out), a.lse2.data_ptr<float>(), dsum,
            L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(), rw.items.data_ptr<int>(),
            (int)L.chunk, mptr<T>(r.dq), r.dq.stride(0), scratch[0], pds, param,
            kEdge ? mptr<T>(r.de) : nullptr, n_dst_units, H, C, p, (uint64_t)a.seed, cnt.csr,
            in...);
      }, fields);
      check_launch();
    }
    alloc_dkv();
    if (mma.on) {
      mma.dkv(r.dk, r.dv, pds_f);
    } else if (dkv_blocks > 0) {
      std::apply([&](auto... in) {
        row_bwd_dkv_kernel<Sc, decltype(in)...><<<dkv_blocks, kNodeBlock, 0, stream>>>(
            cptr<T>(a.grad_out), pds, L.colptr.data_ptr<int>(), L.row.data_ptr<int>(),
            L.perm.data_ptr<int>(), cw.items.data_ptr<int>(), (int)L.chunk, mptr<T>(r.dk),
            dv_ptr(), r.dk.stride(0), scratch[1], scratch[2], n_src_units, H, C, (int)E,
            cnt.csc, in...);
      }, fields);
      check_launch();
    }
  });
  if (cnt.csr == nullptr && !mma.on) {  // the tensor-core walks write whole rows
    combine_partials(scratch[0], rw.num_slots, rw.combine, r.dq);
    combine_partials(scratch[1], cw.num_slots, cw.combine, r.dk);
    if constexpr (kTwo) combine_partials(scratch[2], cw.num_slots, cw.combine, r.dv);
  }
  if constexpr (kParam) {
    // The items' rows summed in a fixed order (a reduction kernel, no atomics).
    const auto f32 = a.qrow.options().dtype(at::kFloat);
    r.param = n_items == 0 ? at::zeros({H, C}, f32)
                           : at::from_blob(param, {n_items, H, C}, f32).sum(0);
  }
  return r;
}

// The CUDA-core backward of a score without tensor-core walks: D in fp32 first
// for fp16 / bf16 inputs (out_dsum, from the forward's out32), then the walks.
template <template <class> class Score, typename Make>
RowGrads row_backward_walks(const BackwardArgs& a, const at::Tensor& out32, Make&& make) {
  const at::Tensor dsum = out_dsum(a.op, a.grad_out, out32);
  return row_backward<Score>(a, nullptr, dsum.defined() ? dsum.data_ptr<float>() : nullptr,
                             make);
}

}  // namespace dfgnn
