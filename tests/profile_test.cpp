// Accelerator::profile on real forked ranks: each rank's Chrome trace holds LibTorch's operators
// (with shapes), the all-reduce buckets and a checkpoint, on one clock across ranks; the merged
// trace has a process per rank; a step range records only its steps; nothing is recorded outside
// a profile; an unwritable folder fails on every rank; a missing rank file is named.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/trace_events.h"  // trace_step_ended: what the prepared optimizer calls each step
#include "test_support.h"

using namespace accelerant;
namespace t = accelerant::testing;

namespace {

LaunchOptions ranks(int n) {
  return LaunchOptions()
      .processes_per_node(n)
      .collective_timeout(std::chrono::seconds(60))
      .verbose(false);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path << " missing";
  return nlohmann::json::parse(in);
}

int64_t steady_us() { return accelerant::detail::trace_now_us(); }

// The events of `trace` named `name` (all when empty) of phase `ph`.
std::vector<nlohmann::json> events(const nlohmann::json& trace, const std::string& ph,
                                   const std::string& name = "") {
  std::vector<nlohmann::json> found;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == ph && (name.empty() || e.value("name", "") == name)) {
      found.push_back(e);
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const nlohmann::json& a, const nlohmann::json& b) {
                     return a.value("ts", int64_t{0}) < b.value("ts", int64_t{0});
                   });
  return found;
}

std::vector<nlohmann::json> named_like(const nlohmann::json& trace, const std::string& prefix) {
  std::vector<nlohmann::json> found;
  for (const auto& e : events(trace, "X")) {
    if (e["name"].get<std::string>().rfind(prefix, 0) == 0) found.push_back(e);
  }
  return found;
}

// Three steps of a toy regression on random batches of 4 (what the profiles record).
template <class Model, class Optimizer>
void train_three_steps(Accelerator& acc, Model& model, Optimizer& optimizer) {
  for (int step = 0; step < 3; ++step) {
    acc.backward(model->forward(torch::randn({4, 8})).pow(2).mean());
    optimizer.step();
    optimizer.zero_grad();
  }
}

torch::nn::Sequential mlp() {
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

}  // namespace

TEST(Profile, AScopeOverTrainingWritesEachRanksTraceAndTheMergedOne) {
  t::ScratchDir scratch;
  const std::string project = scratch.path;
  const int64_t before = steady_us();
  launch(
      [project](int) {
        Accelerator acc(AcceleratorOptions().project_dir(project));
        auto model = mlp();
        torch::optim::SGD sgd(model->parameters(), 0.1);
        auto [m, o] = acc.prepare(model, sgd);
        {
          ProfileScope scope = acc.profile();
          train_three_steps(acc, m, o);
          acc.save_state();
        }  // stops: writes the files
        acc.end_training();
        return 0;
      },
      ranks(2));
  const int64_t after = steady_us();
  const std::string dir = project + "/traces";
  nlohmann::json rank_trace[2] = {read_json(dir + "/trace_rank0.json"),
                                  read_json(dir + "/trace_rank1.json")};
  nlohmann::json merged = read_json(dir + "/trace.json");
  EXPECT_EQ(merged["displayTimeUnit"], "ms");
  nlohmann::json save_span[2];
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json& trace = rank_trace[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    // LibTorch's operators, with their input shapes.
    auto addmm = events(trace, "X", "aten::addmm");
    ASSERT_EQ(addmm.size(), 6u) << "3 steps x 2 Linear layers";
    EXPECT_EQ(addmm[0]["cat"], "cpu_op");
    EXPECT_EQ(addmm[0]["args"]["Input Dims"][1], nlohmann::json({4, 8}));
    // Accelerant's spans: one all-reduce per backward (one bucket), the checkpoint.
    auto buckets = named_like(trace, "all-reduce bucket ");
    ASSERT_EQ(buckets.size(), 3u);
    EXPECT_EQ(buckets[0]["cat"], "comm");
    EXPECT_EQ(buckets[0]["args"]["bytes"], (8 * 16 + 16 + 16 * 4 + 4) * 4);
    auto saves = events(trace, "X", "save_state");
    ASSERT_EQ(saves.size(), 1u);
    save_span[r] = saves[0];
    EXPECT_EQ(save_span[r]["cat"], "checkpoint");
    // The step-time breakdown's spans, from the prepared optimizer and the reducer's wait.
    EXPECT_EQ(events(trace, "X", "optimizer").size(), 3u);
    EXPECT_EQ(events(trace, "X", "all-reduce wait").size(), 3u);
    // One clock: every event lies within the run as the test's steady clock saw it, and each
    // bucket's all-reduce starts inside its backward's operators.
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] == "M") continue;
      EXPECT_EQ(e["pid"], r);
      EXPECT_GE(e["ts"].get<int64_t>(), before) << e.dump();
      EXPECT_LE(e["ts"].get<int64_t>() + e.value("dur", int64_t{0}), after) << e.dump();
    }
    EXPECT_LT(addmm[0]["ts"].get<int64_t>(), buckets[0]["ts"].get<int64_t>());
    EXPECT_GT(addmm[2]["ts"].get<int64_t>(), buckets[0]["ts"].get<int64_t>());
    auto names = events(trace, "M", "process_name");
    ASSERT_EQ(names.size(), 1u);
    EXPECT_EQ(names[0]["args"]["name"], "rank " + std::to_string(r));
  }
  // save_state is a collective: on one clock the two ranks' spans overlap.
  for (int r = 0; r < 2; ++r) {
    const int o = 1 - r;
    EXPECT_LT(save_span[r]["ts"].get<int64_t>(),
              save_span[o]["ts"].get<int64_t>() + save_span[o]["dur"].get<int64_t>())
        << save_span[0].dump() << save_span[1].dump();
  }
  // The merged trace: both ranks as processes named after them, with all their events.
  std::set<int> pids;
  for (const auto& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  std::set<std::string> process_names;
  for (const auto& e : events(merged, "M", "process_name")) {
    process_names.insert(std::to_string(e["pid"].get<int>()) + "=" +
                         e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(process_names, (std::set<std::string>{"0=rank 0", "1=rank 1"}));
  EXPECT_EQ(events(merged, "X", "aten::addmm").size(), 12u);
}

// The step markers are what trace_step_ended records; PreparedOptimizer calls it after each step.
// Here a plain optimizer and explicit calls drive it, so the count is exact.
TEST(Profile, AStepRangeRecordsOnlyItsSteps) {
  t::ScratchDir scratch;
  const std::string dir = scratch.path + "/range";
  auto stopped_in_time = launch(
      [dir](int) {
        Accelerator acc;
        auto model = mlp();
        torch::optim::SGD sgd(model->parameters(), 0.1);
        auto m = acc.prepare(model);
        ProfileScope scope = acc.profile(ProfileOptions().dir(dir).steps(3, 5));
        bool ok = !scope.recording();
        for (int64_t step = 1; step <= 7; ++step) {
          acc.backward(m->forward(torch::randn({4, 8})).pow(2).mean());
          sgd.step();
          sgd.zero_grad();
          accelerant::detail::trace_step_ended(step);
          ok = ok && scope.recording() == (step >= 2 && step < 5) &&
               accelerant::detail::tracing() == scope.recording();
        }
        // Written when step 5 ended, before the scope goes.
        ok = ok && std::filesystem::exists(dir + "/trace.json");
        return ok;
      },
      ranks(2));
  for (bool ok : stopped_in_time) EXPECT_TRUE(ok) << "recording() followed steps 3..5";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto trace = read_json(dir + "/trace_rank" + std::to_string(r) + ".json");
    std::vector<int64_t> steps;
    for (const auto& e : events(trace, "i")) {
      if (e["cat"] == "step") steps.push_back(e["args"]["step"].get<int64_t>());
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{3, 4, 5}));
    EXPECT_EQ(events(trace, "X", "aten::addmm").size(), 6u) << "3 steps x 2 Linear layers";
    EXPECT_EQ(named_like(trace, "all-reduce bucket ").size(), 3u);
  }
}

// ZeRO stage 3: each block's parameter all-gathers and gradient reduce-scatter are spans on lanes
// of their own (they overlap other blocks' compute), with their bytes.
TEST(Profile, Stage3NamesItsAllGathersAndReduceScatters) {
  t::ScratchDir scratch;
  const std::string project = scratch.path;
  launch(
      [project](int) {
        Accelerator acc(AcceleratorOptions().project_dir(project).zero_stage(3));
        torch::manual_seed(1);
        torch::nn::Sequential model(Sharded(torch::nn::Linear(8, 16)), torch::nn::Tanh(),
                                    Sharded(torch::nn::Linear(16, 4)));
        torch::optim::SGD sgd(model->parameters(), 0.1);
        auto [m, o] = acc.prepare(model, sgd);
        {
          ProfileScope scope = acc.profile();
          train_three_steps(acc, m, o);
        }
        acc.end_training();
        return 0;
      },
      ranks(2));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto trace = read_json(project + "/traces/trace_rank" + std::to_string(r) + ".json");
    // Each step gathers each block for its forward and again for its backward.
    const auto gathers = events(trace, "X", "ZeRO-3 all-gather");
    EXPECT_EQ(gathers.size(), 3u * 2 * 2);
    ASSERT_FALSE(gathers.empty());
    EXPECT_EQ(gathers[0]["cat"], "comm");
    // The first block's first gather: its weight and bias, each cut into 2 equal pieces whose
    // length is rounded up to a multiple of 16 elements.
    const int64_t bytes = gathers[0]["args"]["bytes"].get<int64_t>();
    EXPECT_GE(bytes, (8 * 16 + 16) * 4);
    EXPECT_LE(bytes, (8 * 16 + 16) * 4 + 2 * 2 * 16 * 4);
    const auto scatters = events(trace, "X", "ZeRO-3 gradient reduce-scatter");
    EXPECT_EQ(scatters.size(), 3u * 2) << "one per block per step";
    // The block's wait for each gather: a phase of the step-time breakdown (all_reduce).
    const auto waits = events(trace, "X", "ZeRO-3 all-gather wait");
    EXPECT_EQ(waits.size(), gathers.size());
    if (!waits.empty()) EXPECT_EQ(waits[0]["cat"], "step");
  }
}

TEST(Profile, NothingIsRecordedOutsideAProfile) {
  t::ScratchDir scratch;
  const std::string dir = scratch.path;
  auto ok = launch(
      [dir](int) {
        Accelerator acc;
        bool fine = !accelerant::detail::tracing();
        accelerant::detail::add_trace_span("before", "test", accelerant::detail::trace_now_us(), 1);
        {
          ProfileScope scope = acc.profile(ProfileOptions().dir(dir));
          fine = fine && accelerant::detail::tracing();
          accelerant::detail::add_trace_span("inside", "test", accelerant::detail::trace_now_us(),
                                             1);
          scope.stop();
          fine = fine && !accelerant::detail::tracing() && !scope.recording();
          accelerant::detail::add_trace_span("after", "test", accelerant::detail::trace_now_us(),
                                             1);
        }
        return fine;
      },
      ranks(1));
  EXPECT_TRUE(ok.at(0)) << "tracing() is on exactly while the scope records";
  auto trace = read_json(dir + "/trace_rank0.json");
  EXPECT_EQ(events(trace, "X", "inside").size(), 1u);
  EXPECT_TRUE(events(trace, "X", "before").empty());
  EXPECT_TRUE(events(trace, "X", "after").empty());
}

TEST(Profile, AnUnwritableFolderFailsOnEveryRankNamingIt) {
  t::ScratchDir scratch;
  const std::string blocker = scratch.path + "/a_file";
  std::ofstream(blocker) << "x";
  const std::string dir = blocker + "/traces";  // below a regular file: cannot be created
  auto messages = launch(
      [dir](int) {
        Accelerator acc;
        return t::error_message([&] { acc.profile(ProfileOptions().dir(dir)); });
      },
      ranks(2));
  for (const auto& message : messages) {
    EXPECT_TRUE(t::contains(message, dir)) << message;
    EXPECT_TRUE(t::contains(message, "ProfileOptions().dir")) << message;
  }
}

TEST(Profile, MergingNamesTheRankFilesItCannotSee) {
  t::ScratchDir scratch;
  for (int r : {0, 2}) {
    const nlohmann::json op = {{"ph", "X"}, {"name", "op"}, {"pid", 7},
                               {"tid", 1},  {"ts", 10 * r}, {"dur", 1}};
    const nlohmann::json trace = {{"traceEvents", nlohmann::json::array({op})}};
    std::ofstream(trace_rank_file(scratch.path, r)) << trace.dump();
  }
  const TraceMergeResult result = merge_trace_files(scratch.path, 3);
  EXPECT_EQ(result.merged_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(result.missing_files, (std::vector<std::string>{scratch.path + "/trace_rank1.json"}));
  auto merged = read_json(result.merged_file);
  std::set<int> pids;
  for (const auto& e : events(merged, "X", "op")) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 2})) << "pid = rank, whatever the file said";
  EXPECT_EQ(merge_trace_files(scratch.path).merged_ranks, (std::vector<int>{0, 2}));
}

// `accelerant trace merge` (the LibTorch-free front end): the same merge, exit status 1 and the
// missing file named when -n expects more ranks than it finds.
TEST(Profile, TheCommandLineMergesAndNamesAMissingRank) {
  t::ScratchDir scratch;
  const nlohmann::json op = {{"ph", "X"}, {"name", "op"}, {"pid", 0},
                             {"tid", 1},  {"ts", 5},      {"dur", 1}};
  std::ofstream(trace_rank_file(scratch.path, 0))
      << nlohmann::json({{"traceEvents", nlohmann::json::array({op})}}).dump();
  auto run = t::start_program({t::cli_path(), "trace", "merge", "-n", "2", scratch.path});
  std::string output;
  const int status = t::finish_program(run, output, std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 1) << output;
  EXPECT_TRUE(t::contains(output, scratch.path + "/trace_rank1.json")) << output;
  EXPECT_EQ(events(read_json(scratch.path + "/trace.json"), "X", "op").size(), 1u);
}
