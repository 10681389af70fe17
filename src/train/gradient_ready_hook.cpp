#include "train/gradient_ready_hook.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "accelerant/error.h"

namespace accelerant::detail {

std::shared_ptr<torch::autograd::Node> on_gradient_ready(const torch::Tensor& param,
                                                         const std::string& what,
                                                         std::function<void()> ready) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  if (!accumulator) {
    throw Error(what +
                " requires grad but is not a leaf tensor, so it has no gradient accumulator to "
                "hook. Fix: register parameters with register_parameter (leaf tensors), or "
                "detach it first.");
  }
  accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [ready = std::move(ready)](const torch::autograd::variable_list& outputs,
                                 const torch::autograd::variable_list&) {
        ready();
        return outputs;
      }));
  return accumulator;
}

}  // namespace accelerant::detail
