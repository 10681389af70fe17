#include "comm/cuda_presence.h"

#include <torch/cuda.h>

#include <atomic>

namespace accelerant::detail {
namespace {

constexpr int64_t kAskLibTorch = -1;
std::atomic<int64_t> pretended{kAskLibTorch};

}  // namespace

int64_t visible_cuda_devices() {
  const int64_t count = pretended.load();
  if (count != kAskLibTorch) return count;
  return torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
}

void pretend_visible_cuda_devices(std::optional<int64_t> count) {
  pretended.store(count.value_or(kAskLibTorch));
}

}  // namespace accelerant::detail
