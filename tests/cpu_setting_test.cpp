// The CPU setting reaches the code that picks each process's device (issue 34): on a machine with
// a GPU, cpu(true) or ACCELERANT_USE_CPU=1 must keep the process off it (no CUDA context, a Gloo
// group rather than NCCL), not only the Accelerator's own tensors. This machine has no GPU, so the
// tests pretend one is visible, which is what that code asks (comm/cuda_presence.h).
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/cuda_presence.h"
#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::error_message;

namespace {

// Pretends `count` GPUs for one test, and ends any process state it left.
struct PretendGpus {
  explicit PretendGpus(int64_t count) { accelerant::detail::pretend_visible_cuda_devices(count); }
  ~PretendGpus() {
    if (ProcessState::initialized()) ProcessState::shutdown();
    accelerant::detail::pretend_visible_cuda_devices(std::nullopt);
  }
};

}  // namespace

// What the others avoid: with a GPU visible and nothing said, the process state picks it.
TEST(CpuSetting, WithAGpuVisibleAndNoSettingTheProcessPicksIt) {
  PretendGpus gpu(1);
  EXPECT_TRUE(ProcessState::initialize().device().is_cuda());
}

TEST(CpuSetting, TheCpuOptionKeepsTheProcessStateOffTheGpu) {
  PretendGpus gpu(1);
  Accelerator acc(AcceleratorOptions().cpu(true));
  EXPECT_TRUE(acc.device().is_cpu());
  EXPECT_TRUE(ProcessState::get().device().is_cpu())
      << "the process state would make a CUDA context and an NCCL group the run never uses";
}

TEST(CpuSetting, TheEnvironmentVariableKeepsTheProcessStateOffTheGpu) {
  PretendGpus gpu(1);
  ::setenv("ACCELERANT_USE_CPU", "1", 1);
  Accelerator acc;
  ::unsetenv("ACCELERANT_USE_CPU");
  EXPECT_TRUE(acc.device().is_cpu());
  EXPECT_TRUE(ProcessState::get().device().is_cpu());
}

TEST(CpuSetting, AProcessStateInitializedForTheGpuFirstIsRefusedWithTheFix) {
  PretendGpus gpu(1);
  ProcessState::initialize();
  const std::string message =
      error_message([] { Accelerator acc(AcceleratorOptions().cpu(true)); });
  EXPECT_TRUE(contains(message, "initialized before it for cuda:0")) << message;
  EXPECT_TRUE(contains(message, "Fix: initialize it with ProcessStateOptions().cpu(true)"))
      << message;
}
