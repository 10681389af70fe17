// A checkpoint survives the saver's death and a full or read-only disk: a process that saves in a
// loop is SIGKILLed at random moments, and after every kill the newest complete checkpoint (and a
// directory saved over and over in place) still verifies and loads, holding a state that was
// really saved. A full disk or a read-only directory fails save_state with a clear error and
// leaves the previous checkpoint intact.
#include <accelerant/accelerant.h>
#include <accelerant/checkpoint.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <random>
#include <set>
#include <thread>

#include "test_support.h"

using namespace accelerant;
using accelerant::testing::make_temp_dir;
using accelerant::testing::remove_tree;
using accelerant::testing::ScratchDir;

namespace {

using accelerant::testing::contains;

// The saved state encodes which save it was: every weight equals the iteration number.
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(256, 256), torch::nn::Linear(256, 256));
}

void fill(torch::nn::Module& m, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.fill_(value);
}

// A forked child that runs `body` and reports through a pipe; `body` gets the pipe's write end.
struct Child {
  pid_t pid = -1;
  int from_child = -1;
};

Child fork_child(const std::function<void(int)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    try {
      body(fds[1]);
    } catch (const std::exception& e) {
      const std::string text = std::string("exception: ") + e.what();
      (void)!::write(fds[1], text.data(), text.size());
      ::_exit(2);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

void say(int fd, const std::string& text) { (void)!::write(fd, text.data(), text.size()); }

// Everything the child wrote until it exits (bounded by `limit`), and its wait status.
std::string collect(Child& child, int& status,
                    std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buffer[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(child.pid, SIGKILL);
      out += "\n[timed out]";
      break;
    }
    pollfd p{child.from_child, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::read(child.from_child, buffer, sizeof buffer);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(child.from_child);
  ::waitpid(child.pid, &status, 0);
  return out;
}

// Blocks until the child has written `count` bytes in all (each completed save writes one).
bool wait_for_bytes(Child& child, size_t count, std::string& got) {
  char buffer[256];
  while (got.size() < count) {
    pollfd p{child.from_child, POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) return false;
    const ssize_t n = ::read(child.from_child, buffer, sizeof buffer);
    if (n <= 0) return false;
    got.append(buffer, static_cast<size_t>(n));
  }
  return true;
}

// In a fresh process: load `dir` (or the newest under `project` when dir is empty) into a model
// and report the iteration its weights hold, or the error.
std::string iteration_saved_in(const std::string& project, const std::string& dir) {
  Child checker = fork_child([&](int out) {
    Accelerator acc(AcceleratorOptions().project_dir(project));
    auto model = make_model();
    acc.prepare(model);
    verify_checkpoint(dir.empty()
                          ? latest_checkpoint(project + "/checkpoints").value_or(project + "/none")
                          : dir);
    acc.load_state(dir);
    const auto first = model->parameters()[0].flatten()[0].item<double>();
    for (const auto& p : model->parameters()) {
      if (!torch::all(p == first).item<bool>())
        throw std::runtime_error("a model mixing two saves was loaded");
    }
    say(out, std::to_string(static_cast<int64_t>(first)));
  });
  int status = 0;
  return collect(checker, status);
}

// The saver: saves forever, iteration i holding weights i, one byte to the parent after each save.
void save_forever(int out, const std::string& project, const std::string& fixed_dir) {
  Accelerator acc(AcceleratorOptions().project_dir(project).checkpoint_total_limit(2));
  auto model = make_model();
  acc.prepare(model);
  for (int64_t i = 0;; ++i) {
    fill(*model, static_cast<double>(i));
    acc.save_state(fixed_dir);
    say(out, "s");
  }
}

}  // namespace

// 60 kills at random moments, in the two ways a checkpoint is written: automatic names with a
// total limit (old ones removed after the new one is complete) and one directory saved in place.
TEST(CheckpointCrashes, ASaverKilledAtRandomMomentsAlwaysLeavesALoadableCheckpoint) {
  std::mt19937 random(20261202);
  // How many saves each trial's saver finished before its kill: the kills must have landed at
  // varied moments, not all in the first save (a broken delay would make every trial the same).
  std::set<size_t> saves_before_kill;
  for (const bool in_place : {false, true}) {
    ScratchDir scratch;
    const std::string fixed = in_place ? scratch.path + "/in_place" : "";
    std::string acknowledged;
    for (int trial = 0; trial < 30; ++trial) {
      Child saver = fork_child([&](int out) { save_forever(out, scratch.path, fixed); });
      std::string acks;
      ASSERT_TRUE(wait_for_bytes(saver, 1, acks)) << "the saver never finished a first save";
      // One save's duration, measured rather than assumed: it grows with what a save checks and
      // with the machine's load (a fixed 40 ms window once held only the first two saves).
      const auto first_save_done = std::chrono::steady_clock::now();
      ASSERT_TRUE(wait_for_bytes(saver, 2, acks)) << "the saver never finished a second save";
      const auto one_save = std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - first_save_done);
      // The kill lands anywhere in the next six saves, so at any moment of one.
      const int window = static_cast<int>(std::max<int64_t>(1000, 6 * one_save.count()));
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::uniform_int_distribution<int>(0, window)(random)));
      ::kill(saver.pid, SIGKILL);
      int status = 0;
      acks += collect(saver, status);
      ASSERT_TRUE(WIFSIGNALED(status)) << "the saver ended on its own: " << acks;

      const std::string loaded = iteration_saved_in(scratch.path, fixed);
      ASSERT_FALSE(contains(loaded, "exception"))
          << "trial " << trial << (in_place ? " (in place)" : "") << ": " << loaded;
      // The saver restarts from iteration 0 each trial, so it acknowledged iterations 0..acks-1:
      // the checkpoint holds the last acknowledged one or the one in progress.
      const int64_t iteration = std::stoll(loaded);
      saves_before_kill.insert(acks.size());
      const int64_t last_acknowledged = static_cast<int64_t>(acks.size()) - 1;
      EXPECT_TRUE(iteration == last_acknowledged || iteration == last_acknowledged + 1)
          << "trial " << trial << ": loaded iteration " << iteration << ", the saver had finished "
          << acks.size();
      if (!in_place) {
        auto kept = list_checkpoints(scratch.path + "/checkpoints");
        EXPECT_LE(kept.size(), 3u)
            << "total_limit 2 (+1 for a kill between publishing and pruning)";
        for (const auto& k : kept) EXPECT_NO_THROW(verify_checkpoint(k)) << k;
      }
    }
  }
  EXPECT_GE(saves_before_kill.size(), 5u) << "the kills did not land at varied moments";
}

namespace {

// Runs `body` in a child; as root in its own mount namespace, so that its mounts vanish with it.
std::string in_private_mounts(const std::function<std::string()>& body) {
  Child child = fork_child([&](int out) {
    if (::geteuid() == 0 && (::unshare(CLONE_NEWNS) != 0 ||
                             ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)) {
      say(out, "skip: cannot make a private mount namespace");
      return;
    }
    say(out, body());
  });
  int status = 0;
  return collect(child, status);
}

// Saves checkpoint 0 (fits), then tries a second one; reports the error and whether 0 still loads.
std::string second_save_into(const std::string& project, const std::string& fixed_dir) {
  Accelerator acc(AcceleratorOptions().project_dir(project));
  auto model = make_model();  // ~0.5 MB per checkpoint
  acc.prepare(model);
  fill(*model, 1);
  const std::string first = acc.save_state(fixed_dir);
  fill(*model, 2);
  std::string error = "no error";
  try {
    acc.save_state(fixed_dir);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  fill(*model, 0);
  acc.load_state(first);
  const bool intact = model->parameters()[0].flatten()[0].item<double>() == 1.0;
  const bool partial_left = !list_checkpoints(project + "/checkpoints").empty() &&
                            list_checkpoints(project + "/checkpoints").size() != 1;
  return std::string(intact ? "[previous intact]" : "[PREVIOUS DAMAGED]") +
         (partial_left ? "[EXTRA LEFT]" : "") + error;
}

}  // namespace

TEST(CheckpointDisk, AFullDiskFailsTheSaveClearlyAndKeepsThePreviousCheckpoint) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "mounting a small tmpfs needs root; the file-size-limit test below runs anyway";
  ScratchDir scratch;
  for (const bool in_place : {false, true}) {
    const std::string result = in_private_mounts([&] {
      if (::mount("tmpfs", scratch.path.c_str(), "tmpfs", 0, "size=800k") != 0)
        return std::string("skip: mount failed");
      return second_save_into(scratch.path, in_place ? scratch.path + "/ckpt" : "");
    });
    if (contains(result, "skip:")) GTEST_SKIP() << result;
    EXPECT_TRUE(contains(result, "[previous intact]")) << result;
    EXPECT_FALSE(contains(result, "EXTRA LEFT")) << result;
    EXPECT_TRUE(contains(result, "No space left on device (the disk or quota is full)")) << result;
    EXPECT_TRUE(contains(result, "Fix: free space")) << result;
    EXPECT_TRUE(contains(result, in_place ? "the checkpoint there" : "the earlier checkpoints"))
        << result;
  }
}

TEST(CheckpointDisk, AFileSizeLimitFailsTheSaveClearlyAndKeepsThePreviousCheckpoint) {
  ScratchDir scratch;
  Child child = fork_child([&](int out) {
    std::signal(SIGXFSZ, SIG_IGN);         // then write() fails with EFBIG instead of killing
    rlimit limit{300 * 1024, 300 * 1024};  // the first checkpoint's files are ~260 KB each
    ::setrlimit(RLIMIT_FSIZE, &limit);
    Accelerator acc;
    auto model = torch::nn::Sequential(torch::nn::Linear(256, 256));
    acc.prepare(model);
    acc.save_state(scratch.path + "/ckpt");
    // The same model, and now a registered object whose file (~520 KB) is over the limit.
    torch::nn::Linear big(512, 256);
    acc.register_for_checkpointing(*big);
    std::string error = "no error";
    try {
      acc.save_state(scratch.path + "/ckpt");
    } catch (const CheckpointError& e) {
      error = e.what();
    }
    say(out, error);
  });
  int status = 0;
  const std::string error = collect(child, status);
  EXPECT_TRUE(contains(error, "over the file size limit")) << error;
  EXPECT_TRUE(contains(error, "custom_0.pt")) << error;
  auto manifest = verify_checkpoint(scratch.path + "/ckpt");
  EXPECT_EQ(manifest.custom_objects, 0) << "the failed save replaced the previous checkpoint";
}

TEST(CheckpointDisk, AReadOnlyDirectoryFailsTheSaveWithTheReason) {
  ScratchDir scratch;
  const std::string result = in_private_mounts([&] {
    if (::geteuid() == 0) {
      // Root ignores permissions: a read-only mount is what stops it.
      if (::mount("tmpfs", scratch.path.c_str(), "tmpfs", MS_RDONLY, "size=1m") != 0)
        return std::string("skip: mount failed");
    } else {
      ::chmod(scratch.path.c_str(), 0555);
    }
    Accelerator acc;
    auto model = torch::nn::Linear(4, 4);
    acc.prepare(model);
    try {
      acc.save_state(scratch.path + "/ckpt");
      return std::string("saved");
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
  });
  ::chmod(scratch.path.c_str(), 0755);
  if (contains(result, "skip:") && ::geteuid() == 0) GTEST_SKIP() << result;
  EXPECT_TRUE(contains(result, "read-only file system") || contains(result, "no permission"))
      << result;
  EXPECT_TRUE(contains(result, scratch.path)) << result;
  EXPECT_TRUE(contains(result, "Fix:")) << result;
}
