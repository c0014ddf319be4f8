"""Former home of the fusion-method rule and the work-item scheduling, kept as a
re-export: the decisions live in :mod:`pyg_dfgnn.ops.plan`, the work items in
:mod:`pyg_dfgnn.work_items` (below the layout, whose build computes them)."""
from ..work_items import (DEFAULT_CHUNK, SMALL_GRAPH_CHUNK, SMALL_GRAPH_EDGES,  # noqa: F401
                          Work, chunk_for, split_work, work_items, work_stats)
from .plan import (MAX_ROW_BYTES, MAX_SCALAR_C, STRATEGIES, choose_strategy,  # noqa: F401
                   kernel_supports, shared_memory_per_block)
