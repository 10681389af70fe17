#include "comm/reduce_op.h"

namespace accelerant::detail {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;  // kMean = SUM then divide: Gloo has no AVG
  }
}

}  // namespace accelerant::detail
