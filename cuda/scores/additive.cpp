// GAT's additive score: its registration (host/score_ops.h); the entry points
// are scores/additive_host.h, shared with additive_edge.
#include "scores/additive_host.h"

namespace dfgnn {
using namespace additive_host;

// One backward form (no one-launch variant); no tensor-core or dense-tile paths;
// a second SMMF forward on the shared row walk (scores/additive_forward.cu).
DFGNN_REGISTER_SCORE(additive,
                     ScoreOps{"additive", &check<false>, &forward, &backward<false>, false, false,
                              ScorePaths{/*pmf=*/true, /*mma=*/false, /*dense_tiles=*/false,
                                         /*two_rows=*/true, /*one_launch_backward=*/false,
                                         /*row_walk=*/true}});

}  // namespace dfgnn
