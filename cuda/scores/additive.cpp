// GAT's additive score: its registration (host/score_ops.h); the entry points
// are scores/additive_host.h, shared with additive_edge.
#include "scores/additive_host.h"

namespace dfgnn {
using namespace additive_host;

DFGNN_REGISTER_SCORE(additive, ScoreOps{"additive", &check<false>, &forward, &backward<false>,
                                        false});

}  // namespace dfgnn
