// End to end, with the real programs: the Fashion-MNIST example under `accelerant launch
// --max_restarts 2` has a worker SIGKILLed mid-epoch, resumes from its newest checkpoint by
// itself and ends with the same weights, bit for bit, as a run nobody interrupted. Then
// `accelerant checkpoint inspect|verify` on what those runs left.
#include <accelerant/safetensors.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

std::string example_path() {
  return cli_path().substr(0, cli_path().rfind('/')) + "/fashion_mnist";
}

using accelerant::testing::contains;

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

int run_cli(const std::vector<std::string>& args, std::string& output,
            std::chrono::seconds limit = std::chrono::seconds(60)) {
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  std::vector<std::string> argv{cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto program = start_program(argv);
  output.clear();  // finish_program appends
  return exit_code(finish_program(program, output, limit));
}

// 2 epochs of 100 steps (12800 images, 64 per step on each of 2 processes), a checkpoint every
// 20 steps, final weights as safetensors.
std::vector<std::string> training_command(const std::string& project_dir) {
  return {example_path(),
          "--epochs",
          "2",
          "--train_samples",
          "12800",
          "--project_dir",
          project_dir,
          "--checkpoint_every",
          "20",
          "--save_weights",
          project_dir + "/weights"};
}

// The newest complete checkpoint's step under project_dir, or -1.
int64_t newest_checkpoint_step(const std::string& project_dir) {
  int64_t step = -1;
  for (int n = 0; n < 64; ++n) {
    std::ifstream manifest(project_dir + "/checkpoints/checkpoint_" + std::to_string(n) +
                           "/manifest.json");
    if (!manifest) continue;
    try {
      step = std::max<int64_t>(step, nlohmann::json::parse(manifest).at("step").get<int64_t>());
    } catch (const std::exception&) {
    }
  }
  return step;
}

}  // namespace

TEST(CheckpointEndToEnd, AKilledWorkerResumesMidEpochAndEndsBitIdentical) {
  ScratchDir scratch;
  const std::string uninterrupted = scratch.path + "/uninterrupted",
                    interrupted = scratch.path + "/interrupted";
  std::string out;
  std::vector<std::string> launch{"launch", "-n", "2", "--main_process_port", "0"};
  auto args = launch;
  for (const auto& a : training_command(uninterrupted)) args.push_back(a);
  ASSERT_EQ(run_cli(args, out, std::chrono::seconds(100)), 0) << out;
  ASSERT_TRUE(contains(out, "Fashion-MNIST test accuracy:")) << out;

  args = launch;
  args.insert(args.end(), {"--max_restarts", "2"});
  for (const auto& a : training_command(interrupted)) args.push_back(a);
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  auto launcher = start_program([&] {
    std::vector<std::string> argv{cli_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }());
  // Kill rank 1 as soon as the first checkpoint is complete: step 20 of the first epoch's 100.
  pid_t killed = -1;
  int64_t step_at_kill = -1;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (killed < 0 && std::chrono::steady_clock::now() < give_up) {
    step_at_kill = newest_checkpoint_step(interrupted);
    if (step_at_kill >= 0) {
      for (pid_t child : children_of(launcher.pid)) {
        if (environment_of(child, "RANK") == "1") {
          ::kill(child, SIGKILL);
          killed = child;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  out.clear();
  const int status = finish_program(launcher, out, std::chrono::seconds(100));
  ASSERT_GT(killed, 0) << "no checkpoint appeared, or no rank 1 worker was found:\n" << out;
  ASSERT_EQ(exit_code(status), 0) << out;
  EXPECT_GT(step_at_kill, 0);
  EXPECT_LT(step_at_kill, 100) << "the worker was to be killed in the first epoch";
  EXPECT_TRUE(contains(out, "Resumed from " + interrupted + "/checkpoints/checkpoint_")) << out;
  EXPECT_TRUE(contains(out, "Fashion-MNIST test accuracy:")) << out;
  EXPECT_TRUE(wait_until_dead({killed}, std::chrono::seconds(5)).empty());

  const auto expected = accelerant::read_model_safetensors(uninterrupted + "/weights");
  const auto resumed = accelerant::read_model_safetensors(interrupted + "/weights");
  ASSERT_EQ(resumed.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(resumed.count(name)) << name;
    EXPECT_TRUE(torch::equal(resumed.at(name), tensor))
        << name << " differs from the uninterrupted run";
  }
  // Same bytes: same weights and the same layout.
  EXPECT_EQ(slurp(interrupted + "/weights/model.safetensors"),
            slurp(uninterrupted + "/weights/model.safetensors"));
}

TEST(CheckpointCommand, InspectAndVerifyWhatATrainingRunLeft) {
  ScratchDir scratch;
  const std::string project = scratch.path + "/run";
  std::string out;
  std::vector<std::string> args{example_path(),
                                "-n",
                                "2",
                                "--epochs",
                                "1",
                                "--train_samples",
                                "2560",
                                "--project_dir",
                                project,
                                "--checkpoint_every",
                                "5",
                                "--checkpoint_total_limit",
                                "2",
                                "--save_weights",
                                project + "/weights"};
  auto training = start_program(args);
  out.clear();
  ASSERT_EQ(exit_code(finish_program(training, out, std::chrono::seconds(60))), 0) << out;
  // 20 steps, a checkpoint every 5: checkpoint_0..3 written, the newest 2 kept.
  const std::string newest = project + "/checkpoints/checkpoint_3";

  ASSERT_EQ(run_cli({"checkpoint", "inspect", newest}, out), 0) << out;
  EXPECT_TRUE(contains(out, "format         accelerant-checkpoint version 1")) << out;
  EXPECT_TRUE(contains(out, "world size     2 process(es)")) << out;
  EXPECT_TRUE(contains(out, "progress       step 20 (optimizer steps), epoch 1")) << out;
  EXPECT_TRUE(contains(out, "data loader 0  epoch 1, 0 of 2560 samples done, seed 42, shuffled"))
      << out;
  EXPECT_TRUE(contains(out, "model_0.pt")) << out;

  ASSERT_EQ(
      run_cli({"checkpoint", "inspect", "--json", project + "/checkpoints/checkpoint_2"}, out), 0)
      << out;
  const auto manifest = nlohmann::json::parse(out);
  EXPECT_EQ(manifest.at("step"), 15);
  EXPECT_EQ(manifest.at("world_size"), 2);

  ASSERT_EQ(run_cli({"checkpoint", "inspect", project}, out), 0) << out;
  EXPECT_TRUE(contains(out, "2 checkpoint(s) in " + project + "/checkpoints, 2 verified")) << out;
  EXPECT_TRUE(contains(out, newest + "  step 20, epoch 1")) << out;

  ASSERT_EQ(run_cli({"checkpoint", "inspect", project + "/weights"}, out), 0) << out;
  EXPECT_TRUE(contains(out, "conv1.weight  Float [16, 1, 5, 5]")) << out;
  ASSERT_EQ(run_cli({"checkpoint", "verify", project + "/weights"}, out), 0) << out;
  EXPECT_TRUE(contains(out, "OK " + project + "/weights: 8 tensors")) << out;

  ASSERT_EQ(run_cli({"checkpoint", "verify", newest}, out), 0) << out;
  EXPECT_TRUE(contains(out, "OK  " + newest + " (step 20, 5 files")) << out;

  // One flipped byte in the newest checkpoint's weights: verify names the file, per checkpoint.
  {
    std::fstream model(newest + "/model_0.pt", std::ios::in | std::ios::out | std::ios::binary);
    model.seekg(1000);
    char byte = 0;
    model.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    model.seekp(1000);
    model.write(&byte, 1);
  }
  EXPECT_EQ(run_cli({"checkpoint", "verify", newest}, out), 1) << out;
  EXPECT_TRUE(contains(out, "model_0.pt is corrupted: CRC-32")) << out;
  EXPECT_EQ(run_cli({"checkpoint", "verify", project + "/checkpoints"}, out), 1) << out;
  EXPECT_TRUE(contains(out, "OK  " + project + "/checkpoints/checkpoint_2 (step 15")) << out;
  EXPECT_TRUE(contains(out, "BAD " + newest)) << out;
  EXPECT_TRUE(contains(out, "1 of 2 checkpoint(s) verified")) << out;

  // Not a checkpoint, or nothing there: exit 1 and what to pass instead.
  EXPECT_EQ(run_cli({"checkpoint", "verify", scratch.path + "/nothing"}, out), 1) << out;
  EXPECT_TRUE(contains(out, "does not exist. Fix: pass a checkpoint directory")) << out;
  std::ofstream(scratch.path + "/notes.txt") << "x";
  EXPECT_EQ(run_cli({"checkpoint", "inspect", scratch.path + "/notes.txt"}, out), 1) << out;
  EXPECT_TRUE(contains(out, "is a file, not a checkpoint directory")) << out;
  // The project dir again: inspect lists both and exits 1, since checkpoint_3 (corrupted above)
  // does not verify.
  EXPECT_EQ(run_cli({"checkpoint", "inspect", project + "/weights/.."}, out), 1) << out;
  EXPECT_TRUE(contains(out, "2 checkpoint(s) in")) << out;
  EXPECT_TRUE(contains(out, ", 1 verified")) << out;
  EXPECT_TRUE(contains(out, "checkpoint_3  DAMAGED: ")) << out;

  ASSERT_EQ(run_cli({"checkpoint", "verify", "--help"}, out), 0) << out;
  EXPECT_TRUE(contains(out, "Examples:")) << out;
  EXPECT_NE(run_cli({"checkpoint"}, out), 0) << "a subcommand is required";
}
