#include "train/end_of_backward.h"

#include <torch/csrc/autograd/engine.h>

#include <memory>
#include <utility>
#include <vector>

namespace accelerant::detail {
namespace {

// One per thread: a nested backward runs on the thread that called it (LibTorch's engine runs
// reentrant backward passes in place), so the hooks it fires see this thread's state.
struct Held {
  int depth = 0;
  std::shared_ptr<std::vector<std::function<void()>>> callbacks;
};
thread_local Held held;

}  // namespace

void queue_end_of_backward(std::function<void()> callback) {
  if (held.depth > 0) {
    held.callbacks->push_back(std::move(callback));
  } else {
    torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
  }
}

RecomputationScope::RecomputationScope() {
  if (held.depth++ > 0) return;
  // The list outlives this scope: the outer backward runs it after every node has finished.
  auto callbacks = std::make_shared<std::vector<std::function<void()>>>();
  held.callbacks = callbacks;
  torch::autograd::Engine::get_default_engine().queue_callback([callbacks] {
    for (auto& callback : *callbacks) callback();
  });
}

RecomputationScope::~RecomputationScope() {
  if (--held.depth == 0) held.callbacks.reset();
}

}  // namespace accelerant::detail
