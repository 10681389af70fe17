// ProcessState inside launched workers and in a plain process.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_support.h"

using namespace accelerant;

TEST(ProcessState, PlainProcessIsAWorldOfOneOnTheCpu) {
  auto& state = ProcessState::get();
  EXPECT_FALSE(state.distributed());
  EXPECT_EQ(state.world_size(), 1);
  EXPECT_TRUE(state.is_main_process());
  EXPECT_TRUE(state.is_local_main_process());
  EXPECT_EQ(state.device(), torch::Device(torch::kCPU));
  EXPECT_EQ(state.rank_prefix(), "");
  state.wait_for_everyone();  // a no-op, not a hang
  try {
    ProcessState::initialize(ProcessStateOptions().collective_timeout(std::chrono::seconds(5)));
    FAIL() << "initialize after get() must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Fix: call initialize once"), std::string::npos)
        << e.what();
  }
}

TEST(ProcessState, MainProcessFirstRunsTheMainProcessBeforeTheOthers) {
  const std::string dir = accelerant::testing::make_temp_dir();
  auto saw_marker = launch(
      [&dir](int index) {
        auto& state = ProcessState::initialize(
            ProcessStateOptions().collective_timeout(std::chrono::seconds(30)));
        bool found = false;
        state.main_process_first([&] {
          if (state.is_main_process()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));  // others would overtake
            std::ofstream(dir + "/prepared") << "cache";
          }
          found = std::filesystem::exists(dir + "/prepared");
        });
        return found;
      },
      LaunchOptions().processes_per_node(3).verbose(false));
  EXPECT_EQ(saw_marker, std::vector<bool>({true, true, true}));
  accelerant::testing::remove_tree(dir);
}

TEST(ProcessState, WorkersKnowTheirPlace) {
  auto places = launch(
      [](int index) {
        auto& s = ProcessState::get();
        return torch::tensor({s.rank(), s.world_size(), s.local_rank(), s.local_world_size(),
                              s.node_rank(), s.num_nodes(), static_cast<int>(s.is_main_process()),
                              index});
      },
      LaunchOptions().processes_per_node(2).verbose(false));
  EXPECT_TRUE(torch::equal(places[0], torch::tensor({0, 2, 0, 2, 0, 1, 1, 0})));
  EXPECT_TRUE(torch::equal(places[1], torch::tensor({1, 2, 1, 2, 0, 1, 0, 1})));
}

// A peer that dies mid-collective must fail the survivors' collective with an error naming it,
// not end them by SIGPIPE (Gloo writes to its sockets without MSG_NOSIGNAL; ShmAllReduce's
// ALeaderThatDies... saw a survivor die of "signal 13"). A worker ignores SIGPIPE once it joins a
// group, and a program that chose its own handling keeps it.
namespace {
void program_handles_broken_pipes(int) {}
}  // namespace

TEST(ProcessState, AWorkerInAGroupIgnoresSigpipeUnlessItsProgramHandlesIt) {
  auto dispositions = launch(
      [](int index) {
        if (index == 1) ::signal(SIGPIPE, program_handles_broken_pipes);
        ProcessState::get();
        struct sigaction now {};
        ::sigaction(SIGPIPE, nullptr, &now);
        return torch::tensor({static_cast<int>(now.sa_handler == SIG_IGN),
                              static_cast<int>(now.sa_handler == program_handles_broken_pipes)});
      },
      LaunchOptions().processes_per_node(2).verbose(false));
  EXPECT_TRUE(torch::equal(dispositions[0], torch::tensor({1, 0}))) << "rank 0 ignores SIGPIPE";
  EXPECT_TRUE(torch::equal(dispositions[1], torch::tensor({0, 1}))) << "rank 1 keeps its handler";
}
