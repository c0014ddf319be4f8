// The additive score with a per-edge term (GATConv with edge_dim): its
// registration (host/score_ops.h); the entry points are scores/additive_host.h,
// shared with additive.
#include "scores/additive_host.h"

namespace dfgnn {
using namespace additive_host;

// One backward form (no one-launch variant); no tensor-core or dense-tile paths.
DFGNN_REGISTER_SCORE(additive_edge,
                     ScoreOps{"additive_edge", &check<true>, &forward, &backward<true>, false,
                              false,
                              ScorePaths{/*pmf=*/true, /*mma=*/false, /*dense_tiles=*/false,
                                         /*two_rows=*/true, /*one_launch_backward=*/false}});

}  // namespace dfgnn
