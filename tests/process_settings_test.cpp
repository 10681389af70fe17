// The settings of the process state reach it (issue 34): the Accelerator resolves cpu, timeout and
// debug once (option, then the launcher's variable, then the config file) and hands them to
// ProcessState. On a machine with a GPU, cpu(true) or ACCELERANT_USE_CPU=1 must keep the process
// off it (no CUDA context, a Gloo group rather than NCCL), not only the Accelerator's own tensors;
// this machine has no GPU, so those tests pretend one is visible, which is what that code asks
// (comm/cuda_presence.h).
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "comm/cuda_presence.h"
#include "test_support.h"

using namespace accelerant;
using accelerant::testing::contains;
using accelerant::testing::env_of;
using accelerant::testing::error_message;
using namespace std::chrono_literals;

namespace {

// Pretends `count` GPUs for one test, and ends any process state it left.
struct PretendGpus {
  explicit PretendGpus(int64_t count) { accelerant::detail::pretend_visible_cuda_devices(count); }
  ~PretendGpus() {
    if (ProcessState::initialized()) ProcessState::shutdown();
    accelerant::detail::pretend_visible_cuda_devices(std::nullopt);
  }
};

// Ends the process state a test made.
struct EndProcessState {
  ~EndProcessState() {
    if (ProcessState::initialized()) ProcessState::shutdown();
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

TEST(ProcessSettings, TimeoutAndDebugModeResolveOptionThenLauncherThenConfigThenDefault) {
  const ConfigValues config = {{"collective_timeout", "42"}, {"debug", "true"}};
  const auto none = env_of({});
  auto s = resolve_accelerator_settings({}, none, {});
  EXPECT_EQ(s.collective_timeout, kDefaultCollectiveTimeout);
  EXPECT_FALSE(s.debug);
  s = resolve_accelerator_settings({}, none, config, "c.yaml");
  EXPECT_EQ(s.collective_timeout, 42s);
  EXPECT_TRUE(s.debug);
  EXPECT_EQ(s.sources.at("collective_timeout"), "c.yaml (key collective_timeout)");
  const auto launched = env_of({{"ACCELERANT_TIMEOUT_MS", "1500"}, {"ACCELERANT_DEBUG_MODE", "0"}});
  s = resolve_accelerator_settings({}, launched, config, "c.yaml");
  EXPECT_EQ(s.collective_timeout, 1500ms);
  EXPECT_FALSE(s.debug) << "the launcher's ACCELERANT_DEBUG_MODE=0 is a choice, over the file";
  EXPECT_EQ(s.sources.at("debug"), "ACCELERANT_DEBUG_MODE");
  s = resolve_accelerator_settings(AcceleratorOptions().collective_timeout(7s).debug(true),
                                   launched, config, "c.yaml");
  EXPECT_EQ(s.collective_timeout, 7s);
  EXPECT_TRUE(s.debug);
  EXPECT_EQ(s.sources.at("collective_timeout"), "option");
}

TEST(ProcessSettings, ImpossibleTimeoutsAreRefusedNamingTheValue) {
  std::string message = error_message([] {
    resolve_accelerator_settings(AcceleratorOptions().collective_timeout(0ms), env_of({}), {});
  });
  EXPECT_TRUE(contains(message, "AcceleratorOptions::collective_timeout is 0 ms")) << message;
  message = error_message([] {
    resolve_accelerator_settings({}, env_of({}), {{"collective_timeout", "soon"}}, "c.yaml");
  });
  EXPECT_TRUE(contains(message, "\"soon\" (from c.yaml (key collective_timeout))")) << message;
}

TEST(ProcessSettings, TheAcceleratorsTimeoutAndDebugModeReachTheProcessState) {
  EndProcessState end;
  Accelerator acc(AcceleratorOptions().collective_timeout(7s).debug(true));
  EXPECT_EQ(ProcessState::get().collective_timeout(), 7s);
  EXPECT_TRUE(ProcessState::get().debug());
  EXPECT_EQ(acc.settings().collective_timeout, 7s);
}

TEST(ProcessSettings, TheConfigFilesTimeoutAndDebugReachTheProcessState) {
  EndProcessState end;
  accelerant::testing::ScratchDir dir;
  const std::string config = dir.path + "/config.yaml";
  std::ofstream(config) << "collective_timeout: 42\ndebug: true\n";
  Accelerator acc(AcceleratorOptions().config_file(config));
  EXPECT_EQ(ProcessState::get().collective_timeout(), 42s);
  EXPECT_TRUE(ProcessState::get().debug());
}

TEST(ProcessSettings, AProcessStateInitializedWithAnotherTimeoutIsRefusedWithTheFix) {
  EndProcessState end;
  ProcessState::initialize(ProcessStateOptions().collective_timeout(5s));
  const std::string message =
      error_message([] { Accelerator acc(AcceleratorOptions().collective_timeout(7s)); });
  EXPECT_TRUE(contains(message, "timeout is 7000 ms (from option)")) << message;
  EXPECT_TRUE(contains(message, "initialized before it with 5000 ms")) << message;
  EXPECT_TRUE(contains(message, "Fix: initialize it with the same")) << message;
}
