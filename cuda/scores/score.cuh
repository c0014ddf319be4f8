// What a score function is to the kernels: a functor type over the row shape S
// (device/row_shape.cuh) that the edge walks (kernels/row_forward.cuh,
// edge_sddmm.cuh, row_backward.cuh) are templates over. The walks
// own the edge loop, the gathers, the group reductions, the online softmax, the
// dropout mask, the split rows and every store; a score supplies what differs
// per destination and per edge, and each of its calls inlines into the walk.
//
//   template <typename S> struct XScore {
//     using Shape = S;
//     struct Params;                   // its inputs (pointers, scalars); tie() lists them
//     static constexpr bool kValueIsKey;   // one gathered row per edge is key and value
//     static constexpr bool kSrcScalar;    // a per-source scalar comes with each edge
//     static constexpr bool kParamGrad;    // the dq walk accumulates a parameter gradient
//     static constexpr bool kHasKernels;   // S's kernels are compiled (dtypes it serves)
//     static constexpr bool kKeyFree = true;  // optional: the score reads no key row (its
//                                          // Dst::partial is not called; the forward only)
//     static const T* query_rows(const Params&);  // [N_dst, H, C] rows the CSC walks gather
//     static const T* key_rows(const Params&);    // [N_src, H, C] rows gathered per edge
//     static const T* value_rows(const Params&);  // !kValueIsKey: the summed rows
//     static float src_scalar(const Params&, int64_t j, int h, int H);  // kSrcScalar
//
//     struct Dst {                     // a destination row, prepared once per work item
//       Dst(const Params&, const RowAt&);              // prepare_dst
//       float partial(const P (&key)[NV]) const;       // this lane's share of the score
//       float finish(float sum, float src) const;      // group sum -> base-2 score
//       void grad(float ds, const P (&key)[NV],        // dq walk: acc += dS d s / d q_i,
//                 Frag& acc, Frag& param) const;       //   param += dS d s / d param
//       float finish_grad(const Params&, Frag& acc) const; // dq_i = acc * (returned)
//     };
//     struct Src {                     // a source row (the CSC walk that recomputes P)
//       Src(const Params&, const RowAt&);
//       float partial(const P (&query)[NV]) const;     // share of the score with a gathered q_i
//       float finish(float sum) const;
//       const Frag& value() const;                     // the held value row (dP = dO_i . value)
//       void grad(float ds, const P (&query)[NV], Frag& acc) const;  // acc += dS d s / d k_j
//       float finish_grad(const Params&, Frag& dk, Frag& dv) const;  // dk_j = dk * (returned)
//     };
//     using SrcGrad = ...;             // Src's gradient half alone (the CSC walk from saved
//                                      // (P', dS)): its constructor, grad and finish_grad
//     struct EdgeDst;                  // optional: Dst as the edge-parallel SDDMM takes it
//                                      // (one edge per prepared row; default Dst)
//     // Optional, per-edge inputs (kEdgeRows, below):
//     static constexpr bool kEdgeRows = true;
//     static constexpr bool kEdgeInKeyOnly = true;  // optional: the key only, not the value
//     static constexpr bool kEdgeBeside = true;     // optional: key and value, summed in fp32
//     static const T* edge_rows(const Params&);  // [E, H, C] rows in CSR edge order
//     static constexpr bool kEdgeTail = true;  // optional: [E, D] tails instead (below)
//     static int edge_width(const Params&);    // kEdgeTail: D
//     static int64_t key_stride(const Params&); // kEdgeTail: the [N_src, H, C - D] rows' stride
//     // Dst::key_grad(ds, key, out): out = ds d s / d key_j (natural units) at the
//     // edge's gathered key row (edge row added), per edge. With kEdgeInKeyOnly
//     // or kEdgeBeside the edge row goes beside the gathered row instead:
//     // Dst::partial(key, edge), Dst::grad(ds, key, edge, acc, param) and
//     // Dst::key_grad(ds, key, edge, out); kEdgeInKeyOnly also
//     // Src::grad(ds, query, edge, acc)
//   };
//
// A score's Params reach the kernels as separate arguments, its fields in the
// order tie() gives them, and each kernel assembles the struct: as one struct
// argument, nvcc loads every field at the kernel's start, and ptxas then
// allocates 39 of the 96 dot-score SMMF kernels differently than with separate
// arguments and spills in two of them (the fp16 / bf16 scalar-row kernels, 8
// bytes); separate arguments avoid both.
//
// Scores are in base 2 (log2(e) folded in where it is free: the dot score scales
// q_i once per row); the backward's dS is in natural-log units. With kValueIsKey
// the dk walk's finish_grad leaves the whole gradient of the one gathered row in
// dk (dv is not written).
//
// Per-edge inputs (kEdgeRows): a row e_ij per edge and head that the walks
// over destination rows (the SMMF forward, D, the dq walk) load at the edge's
// CSR position and add to the gathered key row and value row, so the score and
// the aggregation see k_j + e_ij and v_j + e_ij: the edge-augmented keys and
// values of TransformerConv's edge_dim and of GraphGPS-style edge encodings. The
// score's functors stay those of its node-only form. The dq walk writes each
// edge's gradient dE_ij = dS_ij ds_ij/dk_j + P'_ij dO_i (CSR order, [E, H, C]);
// the CSC walk is the SpMM with the saved (P', dS), which needs no edge rows,
// so such a score has no one-launch backward (which recomputes the weights
// there) and no edge-parallel (PMF) forward.
//
// With kEdgeBeside the walks hand the edge row beside the key row and the value
// row rather than adding it in T: the functors sum key and edge in fp32, and the
// walks add the edge row's share to dP (dO_i . e_ij) and to the weighted sum in
// fp32 (k_j + e_ij rounded to fp16 / bf16 put the dot_edge score's dq 1 % off
// float64, as for GATv2 below). The CSC walk reads no edge rows (its gradient
// of k_j does not depend on e_ij).
//
// With kEdgeTail the edge rows are [E, D] (CSR order), one row for every head,
// that fill the last D channels of each head's key and value rows (D a multiple
// of the row's vectors): the keys and values are [N_src, H, C - D], the rows
// before the tails, and the queries and the output [N, H, C]. The walks gather
// the key and value rows up to the tails' first vector and load the tails with
// load_edge_row, the dq walk stores the gradient's tails [E, H, D] with
// store_edge_grad, and the CSC walk writes the C - D channels of dk and dv from
// the gathered rows' first C - D. TransformerConv's edge_dim without an
// [E, H, C] tensor: with W_h head h's [C, D] slice of lin_edge (no bias),
// q_i . (k_j + W_h a_ij) = [q_i, W_h^T q_i] . [k_j, a_ij], and the sum of
// P_ij (v_j + W_h a_ij) is the first C channels of sum_j P_ij [v_j, a_ij] plus
// W_h times its last D (nn/_edge_tails.py builds those rows).
//
// With kEdgeInKeyOnly the edge row enters the score alone: the score sees
// k_j + e_ij and the aggregation sums the gathered row k_j as it is (GATv2's
// edge_dim: att . LeakyReLU(x_i + x_j + e_ij), summing x_j). Such a score's
// value row is its key row (kValueIsKey is false for them: the gather copies
// the row, no second load), and its one source row's whole gradient is dk (dv
// is not written). The walks hand the edge row to the functors beside the key
// row rather than adding it: the functors sum the two in fp32, where k_j + e_ij
// rounded to fp16 / bf16 put dq 1-3 % off float64 (dS cancels over a row).
// dE_ij is dS_ij ds_ij/dk_j alone, and the CSC walk, whose source-side
// gradient depends on the edge (Src::grad at the gathered query), loads the
// edge row at the CSR position perm[e] beside each gathered query row.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>

#include "device/fragments.cuh"
#include "device/row_shape.cuh"

namespace dfgnn {

// Where a lane group's held row lies: row `row` of head h, its H * C row at
// element `off`, the head's C elements at `head_off` of a per-head [H, C]
// parameter; lane gl of the group holds vectors gl, gl + G, ... (< nvec).
struct RowAt {
  int64_t row;
  int h, H;
  int64_t off, head_off;
  int gl, nvec;
};

// The fp32 fragment a lane holds of one row.
template <typename S> using FragOf = float[S::NV][S::VEC];
template <typename S> using PackedOf = typename Packed<typename S::T, S::VEC>::type;

// Score::EdgeDst where the score has one, else Score::Dst.
template <typename Score, typename = void> struct EdgeDstOf {
  using type = typename Score::Dst;
};
template <typename Score>
struct EdgeDstOf<Score, std::void_t<typename Score::EdgeDst>> {
  using type = typename Score::EdgeDst;
};

// Whether Score's value reads no key row (kKeyFree; false where it does not say):
// the SMMF forward then gathers the rows for the weighted sum alone and scores
// each edge from the destination's state and the per-source scalar.
template <typename Score, typename = void> struct KeyFreeOf : std::false_type {};
template <typename Score>
struct KeyFreeOf<Score, std::enable_if_t<Score::kKeyFree>> : std::true_type {};
template <typename Score> constexpr bool kKeyFreeOf = KeyFreeOf<Score>::value;

// Whether Score has per-edge rows (kEdgeRows; false where it does not say).
template <typename Score, typename = void> struct EdgeRowsOf : std::false_type {};
template <typename Score>
struct EdgeRowsOf<Score, std::enable_if_t<Score::kEdgeRows>> : std::true_type {};
template <typename Score> constexpr bool kEdgeRowsOf = EdgeRowsOf<Score>::value;

// Whether Score's edge rows enter its key row only (kEdgeInKeyOnly; false where
// it does not say).
template <typename Score, typename = void> struct EdgeInKeyOnlyOf : std::false_type {};
template <typename Score>
struct EdgeInKeyOnlyOf<Score, std::enable_if_t<Score::kEdgeInKeyOnly>> : std::true_type {};
template <typename Score> constexpr bool kEdgeInKeyOnlyOf = EdgeInKeyOnlyOf<Score>::value;

// Whether Score's edge rows are [E, D] tails of every head's row (kEdgeTail;
// false where it does not say).
template <typename Score, typename = void> struct EdgeTailOf : std::false_type {};
template <typename Score>
struct EdgeTailOf<Score, std::enable_if_t<Score::kEdgeTail>> : std::true_type {};
template <typename Score> constexpr bool kEdgeTailOf = EdgeTailOf<Score>::value;

// Lane gl's slice of edge e's row (CSR position e) for head h's row at head_off:
// the [E, H, C] row, or with kEdgeTail the [E, D] tail with zeros before it.
template <typename Score>
__device__ __forceinline__ void load_edge_row(const typename Score::Params& sp, int64_t e,
                                              int64_t HC, int64_t head_off, int gl, int nvec,
                                              PackedOf<typename Score::Shape> (&x)[Score::NV]) {
  using S = typename Score::Shape;
  if constexpr (kEdgeTailOf<Score>) {
    const int d = Score::edge_width(sp);
    load_packed_tail<typename S::T, S::VEC, S::G, S::NV>(Score::edge_rows(sp) + e * d, gl,
                                                         nvec - d / S::VEC, nvec, x);
  } else {
    load_packed<typename S::T, S::VEC, S::G, S::NV>(Score::edge_rows(sp) + e * HC + head_off,
                                                    gl, nvec, x);
  }
}

// Stores lane gl's slice of edge e's row gradient for head h: into the
// [E, H, C] gradient, or with kEdgeTail its tail into the [E, H, D] one.
template <typename Score>
__device__ __forceinline__ void store_edge_grad(typename Score::T* __restrict__ de,
                                                const typename Score::Params& sp, int64_t e,
                                                int h, int H, int64_t HC, int64_t head_off,
                                                int gl, int nvec, const FragOf<typename Score::Shape>& x) {
  using S = typename Score::Shape;
  if constexpr (kEdgeTailOf<Score>) {
    const int d = Score::edge_width(sp);
    store_row_tail<typename S::T, S::VEC, S::G, S::NV>(de + (e * H + h) * d, gl,
                                                       nvec - d / S::VEC, nvec, x, 1.f);
  } else {
    store_row<typename S::T, S::VEC, S::G, S::NV>(de + e * HC + head_off, gl, nvec, x, 1.f);
  }
}

// Whether Score's edge rows enter key and value beside the gathered rows, summed
// in fp32 (kEdgeBeside; false where it does not say).
template <typename Score, typename = void> struct EdgeBesideOf : std::false_type {};
template <typename Score>
struct EdgeBesideOf<Score, std::enable_if_t<Score::kEdgeBeside>> : std::true_type {};
template <typename Score> constexpr bool kEdgeBesideOf = EdgeBesideOf<Score>::value;

// Whether the walks hand Score's functors the edge row beside the key row
// (kEdgeInKeyOnly or kEdgeBeside) rather than added to it.
template <typename Score>
constexpr bool kEdgeApartOf = kEdgeInKeyOnlyOf<Score> || kEdgeBesideOf<Score>;

// Whether the walks write a value gradient dv apart from dk: the score sums a
// row of its own (not its key row, nor its key row before the edge row).
template <typename Score>
constexpr bool kOwnValueRowOf = !Score::kValueIsKey && !kEdgeInKeyOnlyOf<Score>;

}  // namespace dfgnn
