// TEMPORARY stand-in for reduce_scatter / all_gather until the comm branch lands: correct, slow.
#include "accelerant/communicator.h"

namespace accelerant {

void Communicator::reduce_scatter_(const torch::Tensor& input, const torch::Tensor& output,
                                   ReduceOp op) {
  torch::Tensor all = all_reduce(input.reshape({-1}), op);
  const int64_t share = output.numel();
  output.view({-1}).copy_(all.narrow(0, rank() * share, share));
}

PendingCollective Communicator::reduce_scatter_async_(const torch::Tensor& input,
                                                      const torch::Tensor& output, ReduceOp op) {
  reduce_scatter_(input, output, op);
  return PendingCollective();
}

void Communicator::all_gather_(const torch::Tensor& input, const torch::Tensor& output) {
  output.view({-1}).copy_(gather(input.reshape({-1})));
}

PendingCollective Communicator::all_gather_async_(const torch::Tensor& input,
                                                  const torch::Tensor& output) {
  all_gather_(input, output);
  return PendingCollective();
}

}  // namespace accelerant
