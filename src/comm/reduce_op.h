// Accelerant's ReduceOp as c10d's, for the process groups (Communicator, the node leaders' group
// of the hierarchical all-reduce).
#pragma once
#include "accelerant/communicator.h"
#include "base/torch_compat.h"

namespace accelerant::detail {

/// kMean maps to SUM: Gloo has no AVG, so callers divide afterwards.
c10d::ReduceOp to_c10d(ReduceOp op);

}  // namespace accelerant::detail
