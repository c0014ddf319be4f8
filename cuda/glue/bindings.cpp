// The dfgnn operator library, TORCH_LIBRARY(dfgnn): a namespace has one such
// definition, and every file of ops adds to it as a fragment (the attention ops
// and the plan class in attention.cpp, the layout build in layout_build_op.cpp,
// the GT projections in projections.cpp); the fakes are registered from Python
// (pyg_dfgnn/ops/_fakes.py).
#include <torch/library.h>

TORCH_LIBRARY(dfgnn, m) {}

// The Python module pyg_dfgnn._C itself: python_entry.cpp.
