// The shared-memory all-reduce between forked ranks of this machine: the same bits as Gloo on two
// ranks, a fixed summation order on four, a dead peer named at once, nothing left in /dev/shm; and
// the hierarchical path on ranks labelled into two nodes (reduce in the node, all-reduce between
// node leaders, hand out in the node); reduce-scatter and all-gather on the segment and on the
// fallbacks.
#include <accelerant/accelerant.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>

#include "../src/comm/shared_memory_segment.h"
#include "test_support.h"

using namespace accelerant;
using Clock = std::chrono::steady_clock;
using accelerant::testing::ScratchDir;
namespace segments = accelerant::detail;

namespace {

using accelerant::testing::contains;

// Sizes around the 256 KiB chunk (65536 floats): one element, a partial chunk, several chunks.
const std::vector<int64_t> kSizes = {1, 17, 65536, 70001, 300000};

// Each rank's results of sums, max and min in float, double and int64, flattened into one
// double tensor; the first element says whether the shared-memory path carried them.
torch::Tensor reduce_everything(int index) {
  auto& comm = ProcessState::get().communicator();
  std::vector<torch::Tensor> out{
      torch::tensor({comm.shared_memory_all_reduce() ? 1.0 : 0.0}, torch::kDouble)};
  torch::manual_seed(100 + index);
  for (int64_t n : kSizes) {
    auto f = torch::randn({n}) * std::pow(10.0f, index);
    auto d = torch::randn({n}, torch::kDouble);
    auto l = torch::randint(-1000, 1000, {n}, torch::kLong);
    out.push_back(comm.all_reduce(f, ReduceOp::kSum).to(torch::kDouble));
    out.push_back(comm.all_reduce(f, ReduceOp::kMean).to(torch::kDouble));
    out.push_back(comm.all_reduce(d, ReduceOp::kMax));
    out.push_back(comm.all_reduce(l, ReduceOp::kMin).to(torch::kDouble));
    out.push_back(comm.all_reduce(l, ReduceOp::kSum).to(torch::kDouble));
  }
  return torch::cat(out);
}

std::vector<torch::Tensor> run_with_shm(bool on, int ranks) {
  ::setenv("ACCELERANT_SHM_ALLREDUCE", on ? "1" : "0", 1);
  auto results = launch(reduce_everything, LaunchOptions()
                                               .processes_per_node(ranks)
                                               .collective_timeout(std::chrono::seconds(60))
                                               .verbose(false));
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
  return results;
}

bool shm_has_segment_of(pid_t pid) {
  const std::string prefix = "accelerant-shm-" + std::to_string(pid) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// In a worker: runs `collectives` until one throws, then writes "<ms waited>\n<message>" (or
// "no error") to `path` and leaves at once, without the orderly shutdown of a broken group.
[[noreturn]] void report_first_error(const std::string& path,
                                     const std::function<void()>& collectives) {
  const auto t0 = Clock::now();
  std::string text = "no error";
  try {
    collectives();
  } catch (const CollectiveError& e) {
    text = e.what();
  }
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  { std::ofstream(path) << waited << "\n" << text; }
  ::_exit(0);
}

}  // namespace

TEST(ShmAllReduce, TwoRanksGetGloosBitsExactly) {
  const auto shm = run_with_shm(true, 2);
  const auto gloo = run_with_shm(false, 2);
  ASSERT_EQ(shm.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(shm[r][0].item<double>(), 1.0)
        << "the shared-memory path should carry the all-reduces";
    EXPECT_EQ(gloo[r][0].item<double>(), 0.0) << "ACCELERANT_SHM_ALLREDUCE=0 should turn it off";
    EXPECT_TRUE(torch::equal(shm[r].slice(0, 1), gloo[r].slice(0, 1))) << "rank " << r;
    EXPECT_TRUE(torch::equal(shm[r], shm[0]));
  }
}

TEST(ShmAllReduce, FourRanksSumInRankOrderAndAgreeBitForBit) {
  const int64_t n = 200003;
  auto results = launch(
      [n](int index) {
        torch::manual_seed(7 + index);
        auto mine =
            torch::randn({n}) * std::pow(1000.0f, index);  // magnitudes make the order matter
        return ProcessState::get().communicator().all_reduce(mine);
      },
      LaunchOptions()
          .processes_per_node(4)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  torch::Tensor expected;
  for (int index = 0; index < 4; ++index) {
    torch::manual_seed(7 + index);
    auto t = torch::randn({n}) * std::pow(1000.0f, index);
    expected = index == 0 ? t : expected + t;  // ((t0 + t1) + t2) + t3, in float
  }
  ASSERT_EQ(results.size(), 4u);
  for (const auto& r : results) EXPECT_TRUE(torch::equal(r, expected));
}

TEST(ShmAllReduce, APeerThatDiesIsNamedWithinSecondsAndNothingStaysInDevShm) {
  ScratchDir scratch;
  const std::string report = scratch.path + "/rank0.txt";
  const auto start = Clock::now();
  // The peer vanishes with exit status 0, so that the launcher does not stop rank 0 first (it
  // would on a failure) and rank 0 meets the death inside the all-reduce.
  try {
    launch(
        [&](int index) {
          auto& comm = ProcessState::get().communicator();
          auto big = torch::ones({1 << 20});
          comm.all_reduce_(big);
          if (index == 1) ::_exit(0);
          { std::ofstream(report + ".pid") << ::getpid(); }
          report_first_error(report, [&] {
            for (int i = 0; i < 1000; ++i) comm.all_reduce_(big);
          });
        },
        LaunchOptions()
            .processes_per_node(2)
            .collective_timeout(std::chrono::seconds(60))
            .verbose(false));
  } catch (const LaunchError&) {
    // rank 1 returned no result; what matters is rank 0's report
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  pid_t pid = 0;
  std::ifstream(report + ".pid") >> pid;
  std::ifstream in(report);
  long waited = 0;
  in >> waited;
  const std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SCOPED_TRACE(message);
  EXPECT_TRUE(contains(message, "rank 1 (pid")) << "the dead rank and its pid are named";
  EXPECT_TRUE(contains(message, "exited while this rank waited for it"));
  EXPECT_TRUE(contains(message, "[rank 0/2]"));
  EXPECT_LT(waited, 10000) << "a dead peer is noticed long before the 60 s timeout";
  EXPECT_FALSE(shm_has_segment_of(pid)) << "the segment is unlinked once every rank mapped it";
}

TEST(ShmAllReduce, SegmentsOfDeadCreatorsAreRemovedLiveOnesKept) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  auto make = [](pid_t pid) {
    const std::string name =
        segments::SharedMemorySegment::kNamePrefix + std::to_string(pid) + "-test";
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    ::close(fd);
    return name;
  };
  const std::string dead = make(child), live = make(::getpid());
  EXPECT_GE(segments::remove_stale_segments(), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + dead));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + live));
  ::shm_unlink(live.c_str());
}

TEST(ShmAllReduce, ABadSettingIsAClearError) {
  ::setenv("ACCELERANT_SHM_ALLREDUCE", "maybe", 1);  // a bool (parse_bool): yes would be accepted
  auto run = [] {
    launch([](int) { ProcessState::get(); }, LaunchOptions()
                                                 .processes_per_node(2)
                                                 .collective_timeout(std::chrono::seconds(20))
                                                 .verbose(false));
  };
  try {
    run();
    ADD_FAILURE() << "ACCELERANT_SHM_ALLREDUCE=maybe was accepted";
  } catch (const LaunchError& e) {
    EXPECT_TRUE(contains(e.what(), "ACCELERANT_SHM_ALLREDUCE=maybe is not a boolean")) << e.what();
  }
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
}

namespace {

// Ranks labelled into nodes by ACCELERANT_SHM_GROUP (what separate machines look like).
// Ranks 0 and 1 on node "a", the rest on node "b".
const char* node_label(int index) { return index < 2 ? "a" : "b"; }

std::vector<torch::Tensor> run_on_simulated_nodes(int ranks) {
  return launch(
      [](int index) {
        ::setenv("ACCELERANT_SHM_GROUP", node_label(index), 1);
        auto& comm = ProcessState::get().communicator();
        const bool hierarchical = contains(comm.all_reduce_path(), "hierarchical");
        auto out = reduce_everything(index);
        out[0] = hierarchical ? 1.0 : 0.0;
        return out;
      },
      LaunchOptions()
          .processes_per_node(ranks)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
}

}  // namespace

TEST(ShmAllReduce, TwoNodesReduceInTheNodeThenBetweenLeadersAndAgreeWithGloo) {
  for (int ranks : {4, 3}) {  // nodes of 2 + 2 and of 2 + 1 ranks
    SCOPED_TRACE(ranks);
    const auto nodes = run_on_simulated_nodes(ranks);
    const auto gloo = run_with_shm(false, ranks);
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(nodes[r][0].item<double>(), 1.0)
          << "rank " << r << " did not take the hierarchical path";
      EXPECT_TRUE(torch::equal(nodes[r], nodes[0]))
          << "rank " << r << " got other bits than rank 0";
      // Another summation order than Gloo's ring: equal within float rounding, ints exactly.
      EXPECT_TRUE(torch::allclose(nodes[r].slice(0, 1), gloo[r].slice(0, 1), 1e-5, 1e-3))
          << "rank " << r;
    }
  }
}

TEST(ShmAllReduce, TwoNodesSumInTheNodeFirstThenAcrossNodes) {
  const int64_t n = 100003;
  auto results = launch(
      [n](int index) {
        ::setenv("ACCELERANT_SHM_GROUP", node_label(index), 1);
        torch::manual_seed(7 + index);
        auto mine = torch::randn({n}) * std::pow(1000.0f, index);
        return ProcessState::get().communicator().all_reduce(mine);
      },
      LaunchOptions()
          .processes_per_node(4)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  std::vector<torch::Tensor> t;
  for (int index = 0; index < 4; ++index) {
    torch::manual_seed(7 + index);
    t.push_back(torch::randn({n}) * std::pow(1000.0f, index));
  }
  const auto expected = (t[0] + t[1]) + (t[2] + t[3]);  // each node's sum, then the two nodes'
  for (const auto& r : results) EXPECT_TRUE(torch::equal(r, expected));
}

TEST(ShmAllReduce, ALeaderThatDiesFailsBothNodesWithinSeconds) {
  ScratchDir scratch;
  std::string launcher_report = "(none: the job succeeded)";
  const auto start = Clock::now();
  try {
    launch(
        [&](int index) {
          ::setenv("ACCELERANT_SHM_GROUP", node_label(index), 1);
          auto& comm = ProcessState::get().communicator();
          auto big = torch::ones({1 << 20});
          // The first all-reduce inside the report too: a peer may still be finishing it when
          // node b's leader vanishes, and its failure there must be reported, not lost.
          report_first_error(scratch.path + "/rank" + std::to_string(index), [&] {
            comm.all_reduce_(big);
            if (index == 2) ::_exit(0);  // node b's leader vanishes
            for (int i = 0; i < 1000; ++i) comm.all_reduce_(big);
          });
        },
        LaunchOptions()
            .processes_per_node(4)
            .collective_timeout(std::chrono::seconds(60))
            .verbose(false));
  } catch (const LaunchError& e) {
    launcher_report = e.what();
  }
  SCOPED_TRACE("the launcher's report: " + launcher_report);  // what ended the job, on failure
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(40))
      << "the job ended long before the 60 s timeout";
  int reports = 0;
  for (int index : {0, 1, 3}) {
    std::ifstream in(scratch.path + "/rank" + std::to_string(index));
    long waited = -1;
    in >> waited;
    // A rank still inside the failure diagnosis may be stopped by the launcher before it writes.
    if (waited < 0) continue;
    ++reports;
    std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE("rank " + std::to_string(index) + ": " + message);
    EXPECT_FALSE(contains(message, "no error"));
    EXPECT_LT(waited, 15000) << "noticed long before the 60 s timeout";
    std::transform(message.begin(), message.end(), message.begin(), ::tolower);
    EXPECT_TRUE(contains(message, "rank 2") || contains(message, "ranks 2"))
        << "the dead leader is named";
    // Rank 3 learns it either from its leader's pid (it waited for rank 2 in shared memory) or
    // from rank 0 giving up first (rank 0's socket to rank 2 was reset at once), and then names
    // rank 2 as dead while it waits for its record: both name the job's rank and its process.
    if (index == 3) {
      EXPECT_TRUE(contains(message, "rank 2 (pid") || contains(message, "rank 2 died: its process"))
          << "named by its rank in the job";
    }
    if (index == 0) EXPECT_TRUE(contains(message, "all-reduce between node leaders failed"));
  }
  EXPECT_GE(reports, 1) << "no surviving rank reported its error";
}

TEST(ShmAllReduce, RanksThatDisagreeAboutTheSizeFailNamingBothInsteadOfMixingData) {
  ScratchDir scratch;
  const auto start = Clock::now();
  try {
    launch(
        [&](int index) {
          auto& comm = ProcessState::get().communicator();
          report_first_error(scratch.path + "/rank" + std::to_string(index), [&] {
            auto mine = torch::ones({index == 0 ? 1000 : 999});
            comm.all_reduce_(mine);
          });
        },
        LaunchOptions()
            .processes_per_node(2)
            .collective_timeout(std::chrono::seconds(60))
            .verbose(false));
  } catch (const LaunchError&) {
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30))
      << "found at the first barrier, not at the timeout";
  for (int index : {0, 1}) {
    std::ifstream in(scratch.path + "/rank" + std::to_string(index));
    const std::string message((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    SCOPED_TRACE("rank " + std::to_string(index) + ": " + message);
    EXPECT_TRUE(contains(message, "the ranks disagree about this all-reduce"));
    EXPECT_TRUE(contains(message, "1000 Float elements (sum)"));
    EXPECT_TRUE(contains(message, "999 Float elements (sum)"));
  }
}

// Reduce-scatter and all-gather (issue 23): with slots of 4 KiB a shard takes many steps (on 4
// ranks a window is 256 floats); the shards equal all_reduce's elements bit for bit; on
// simulated nodes they take the documented fallbacks; ranks in different kinds fail at once.
namespace {

// Integer-valued: sums are exact whatever the order.
torch::Tensor sharded_input(int rank, int64_t n) {
  torch::manual_seed(300 + rank);
  return torch::randint(-1000, 1000, {n}, torch::kLong).to(torch::kFloat);
}

// On every rank: reduce-scatter (sum, max), all-gather, and reduce-scatter against the
// all-reduce's bits; returns what differed ("" when nothing), after `path_ok`'s check.
std::string check_sharded(int index, const std::function<std::string()>& path_check) {
  auto& comm = ProcessState::get().communicator();
  const int n = comm.world_size();
  std::string wrong = path_check();
  for (int64_t shard : {int64_t{1}, int64_t{1001}, int64_t{70001}}) {
    const std::string at = "S=" + std::to_string(shard) + " ";
    std::vector<torch::Tensor> inputs, parts;
    for (int q = 0; q < n; ++q) {
      inputs.push_back(sharded_input(q, n * shard).narrow(0, index * shard, shard));
      parts.push_back(sharded_input(q, shard));
    }
    const auto input = sharded_input(index, n * shard);
    auto out = torch::empty({shard});
    comm.reduce_scatter_(input, out);
    if (!torch::equal(out, torch::stack(inputs).sum(0))) wrong += at + "sum; ";
    comm.reduce_scatter_(input, out, ReduceOp::kMax);
    if (!torch::equal(out, std::get<0>(torch::stack(inputs).max(0)))) wrong += at + "max; ";
    auto gathered = torch::empty({n * shard});
    comm.all_gather_(sharded_input(index, shard), gathered);
    if (!torch::equal(gathered, torch::cat(parts))) wrong += at + "all_gather; ";
    torch::manual_seed(7 + index);
    const auto noisy = torch::randn({n * shard}) * std::pow(1000.0f, index);
    comm.reduce_scatter_(noisy, out);
    if (!torch::equal(out, comm.all_reduce(noisy).narrow(0, index * shard, shard))) {
      wrong += at + "differs from all_reduce's bits; ";
    }
  }
  return wrong;
}

}  // namespace

TEST(ShmAllReduce, ReduceScatterAndAllGatherInManySmallSteps) {
  ::setenv("ACCELERANT_SHM_CHUNK_BYTES", "4096", 1);
  auto results = launch(
      [](int index) {
        return check_sharded(index, [] {
          return ProcessState::get().communicator().shared_memory_all_reduce()
                     ? std::string()
                     : std::string("not on shared memory; ");
        });
      },
      LaunchOptions()
          .processes_per_node(4)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(false));
  ::unsetenv("ACCELERANT_SHM_CHUNK_BYTES");
  for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
}

TEST(ShmAllReduce, ReduceScatterAndAllGatherOnTwoNodesTakeTheFallbacks) {
  for (int ranks : {4, 3}) {  // nodes of 2 + 2 and of 2 + 1 ranks
    SCOPED_TRACE(ranks);
    auto results = launch(
        [](int index) {
          ::setenv("ACCELERANT_SHM_GROUP", node_label(index), 1);
          return check_sharded(index, [] {
            return contains(ProcessState::get().communicator().all_reduce_path(), "hierarchical")
                       ? std::string()
                       : std::string("not hierarchical; ");
          });
        },
        LaunchOptions()
            .processes_per_node(ranks)
            .collective_timeout(std::chrono::seconds(60))
            .verbose(false));
    for (size_t r = 0; r < results.size(); ++r) EXPECT_EQ(results[r], "") << "rank " << r;
  }
}

TEST(ShmAllReduce, RanksInDifferentKindsOfCollectiveFailNamingBoth) {
  ScratchDir scratch;
  const auto start = Clock::now();
  try {
    launch(
        [&](int index) {
          auto& comm = ProcessState::get().communicator();
          report_first_error(scratch.path + "/rank" + std::to_string(index), [&] {
            auto whole = torch::ones({2000});
            if (index == 0) {
              comm.reduce_scatter_(whole, torch::empty({1000}));
            } else {
              comm.all_reduce_(whole);
            }
          });
        },
        LaunchOptions()
            .processes_per_node(2)
            .collective_timeout(std::chrono::seconds(60))
            .verbose(false));
  } catch (const LaunchError&) {
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30)) << "found at the first barrier";
  for (int index : {0, 1}) {
    std::ifstream in(scratch.path + "/rank" + std::to_string(index));
    const std::string message((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    SCOPED_TRACE("rank " + std::to_string(index) + ": " + message);
    EXPECT_TRUE(contains(message, "the ranks disagree about this"));
    EXPECT_TRUE(contains(message, "reduce-scatter of 2000 Float elements (sum)"));
    EXPECT_TRUE(contains(message, "all-reduce of 2000 Float elements (sum)"));
  }
}
