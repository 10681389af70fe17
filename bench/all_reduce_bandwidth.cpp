// All-reduce bandwidth: the shared-memory path against Gloo over loopback and against memcpy (the
// machine's own limit), from 1 KB to 100 MB, on 2 and 4 forked ranks. Both transports run in one
// invocation, alternating rounds, so that they see the same machine. Bandwidth = tensor bytes /
// median time of one all-reduce (what a training step waits for).
//   bench_all_reduce_bandwidth [--ranks 2,4] [--rounds 2] [--markdown]
#include <accelerant/accelerant.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

const std::vector<int64_t> kSizes = {1 << 10, 16 << 10, 256 << 10, 1 << 20,
                                     4 << 20, 25 << 20, 100 << 20};

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `op` after 2 warm-up runs, over enough runs for about 0.3 s (5 to 200). Every
// rank must run the collective the same number of times, so the count comes from the first run's
// time as `agree` (the slowest rank's) makes it, the same on every rank.
template <class Op, class Agree>
double time_median(Op&& op, Agree&& agree) {
  op();
  op();
  auto timed = [&] {
    const auto t0 = Clock::now();
    op();
    return agree(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  std::vector<double> times{timed()};
  const int runs = static_cast<int>(std::clamp(0.3 / std::max(times[0], 1e-9), 5.0, 200.0));
  while (static_cast<int>(times.size()) < runs) times.push_back(timed());
  return median(times);
}

// One launch of `ranks` workers; rank 0 returns the median seconds per size.
std::vector<double> all_reduce_seconds(int ranks, bool shared_memory) {
  ::setenv("ACCELERANT_SHM_ALLREDUCE", shared_memory ? "1" : "0", 1);
  auto results = accelerant::launch(
      [shared_memory]() {
        auto& comm = accelerant::ProcessState::get().communicator();
        if (comm.shared_memory_all_reduce() != shared_memory) {
          throw accelerant::Error("the shared-memory path is not in the state this run asked for");
        }
        std::vector<double> medians;
        for (int64_t bytes : kSizes) {
          auto tensor = torch::rand({bytes / 4});
          // Each rank's time, maxed across ranks: the collective ends when the slowest rank's does.
          auto slowest = [&](double seconds) {
            auto t = torch::tensor({seconds}, torch::kDouble);
            comm.all_reduce_(t, accelerant::ReduceOp::kMax);
            return t.item<double>();
          };
          medians.push_back(time_median([&] { comm.all_reduce_(tensor); }, slowest));
        }
        return torch::tensor(medians, torch::kDouble);
      },
      accelerant::LaunchOptions().processes_per_node(ranks).verbose(false));
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
  const auto& t = results[0];
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

// --series: one launch; `iterations` times, three timings of `bytes`, each maxed across ranks:
// the shared-memory all-reduce, a memcpy on every rank at once (a private buffer to another),
// and a memcpy on rank 0 alone while the others wait; then the round trip of a cache line
// between ranks 0 and 1. Rank 0 returns them, one row per iteration. The copies are the
// machine's own rates at that moment and the round trip where its two CPUs sit, so a slow
// all-reduce can be told apart from a machine that copies slowly (run it under `perf sched
// record` too).
torch::Tensor shared_memory_series(int ranks, int64_t bytes, int iterations) {
  ::setenv("ACCELERANT_SHM_ALLREDUCE", "1", 1);
  // Shared with the forked workers: the ping-pong's cache line.
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw accelerant::Error("mmap of the ping-pong page failed");
  auto* ping = new (page) std::atomic<uint32_t>(0);
  auto results = accelerant::launch(
      [bytes, iterations, ping]() {
        auto& comm = accelerant::ProcessState::get().communicator();
        auto tensor = torch::rand({bytes / 4});
        std::vector<char> from(bytes, 1), to(bytes, 0);
        auto slowest = [&](Clock::time_point t0) {
          auto t = torch::tensor({std::chrono::duration<double>(Clock::now() - t0).count()},
                                 torch::kDouble);
          comm.all_reduce_(t, accelerant::ReduceOp::kMax);
          return t.item<double>();
        };
        auto rows = torch::zeros({iterations, 4}, torch::kDouble);
        for (int i = 0; i < iterations; ++i) {
          comm.barrier();
          auto t0 = Clock::now();
          comm.all_reduce_(tensor);
          rows[i][0] = slowest(t0);
          comm.barrier();
          t0 = Clock::now();
          std::memcpy(to.data(), from.data(), bytes);
          rows[i][1] = slowest(t0);
          comm.barrier();
          if (comm.rank() == 0) {
            t0 = Clock::now();
            std::memcpy(to.data(), from.data(), bytes);
            rows[i][2] = std::chrono::duration<double>(Clock::now() - t0).count();
          }
          comm.barrier();
          // A cache line handed back and forth between ranks 0 and 1: its round trip tells how
          // far apart their CPUs are (SMT siblings, cores sharing a cache, or further).
          if (comm.rank() == 0) ping->store(0);
          comm.barrier();
          constexpr uint32_t kTrips = 2000;
          t0 = Clock::now();
          for (uint32_t k = 0; k < kTrips && comm.rank() < 2; ++k) {
            const uint32_t mine = 2 * k + (comm.rank() == 0 ? 1 : 2);
            if (comm.rank() == 0) ping->store(mine, std::memory_order_release);
            while (ping->load(std::memory_order_acquire) !=
                   (comm.rank() == 0 ? mine + 1 : mine - 1))
              spin_pause();
            if (comm.rank() == 1) ping->store(mine, std::memory_order_release);
          }
          rows[i][3] = std::chrono::duration<double>(Clock::now() - t0).count() / kTrips;
          comm.barrier();
        }
        return rows;
      },
      accelerant::LaunchOptions().processes_per_node(ranks).verbose(false));
  ::unsetenv("ACCELERANT_SHM_ALLREDUCE");
  ::munmap(page, 4096);
  return results[0];
}

double memcpy_seconds(int64_t bytes) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  return time_median([&] { std::memcpy(to.data(), from.data(), bytes); },
                     [](double s) { return s; });
}

std::string size_text(int64_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MB"
                            : std::to_string(bytes >> 10) + " KB";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"All-reduce bandwidth: shared memory vs Gloo vs memcpy"};
  std::vector<int> world_sizes{2, 4};
  int rounds = 2;
  app.add_option("--ranks", world_sizes, "world sizes to measure")->delimiter(',');
  app.add_option("--rounds", rounds, "alternating rounds per transport; the median is kept")
      ->check(CLI::PositiveNumber);
  int64_t series_mb = 0;
  int iterations = 200;
  app.add_option("--series", series_mb,
                 "instead of the tables: the shared-memory all-reduce of this many MB, "
                 "--iterations times in one run on the first --ranks, each time printed with "
                 "the memcpy rates of that moment (every rank at once, rank 0 alone) and a "
                 "cache line's round trip between ranks 0 and 1");
  app.add_option("--iterations", iterations, "all-reduces of --series")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (series_mb > 0) {
    const int64_t bytes = series_mb << 20;
    const auto rows = shared_memory_series(world_sizes.front(), bytes, iterations);
    const double gb = bytes / 1e9;
    std::vector<std::vector<double>> rates(3);
    std::vector<double> latency_ns;
    std::printf(
        "iteration  all-reduce GB/s  memcpy on every rank GB/s  memcpy alone GB/s  "
        "cache-line round trip ns\n");
    for (int64_t i = 0; i < rows.size(0); ++i) {
      for (int k = 0; k < 3; ++k) rates[k].push_back(gb / rows[i][k].item<double>());
      latency_ns.push_back(rows[i][3].item<double>() * 1e9);
      std::printf("%lld %.2f %.2f %.2f %.1f\n", static_cast<long long>(i), rates[0].back(),
                  rates[1].back(), rates[2].back(), latency_ns.back());
    }
    const double all_reduce = median(rates[0]), every = median(rates[1]), alone = median(rates[2]);
    std::printf(
        "median all-reduce %.2f GB/s, memcpy on every rank %.2f GB/s, memcpy alone %.2f "
        "GB/s, cache-line round trip %.0f ns; all-reduce / memcpy alone %.2f, every "
        "rank / alone %.2f\n",
        all_reduce, every, alone, median(latency_ns), all_reduce / alone, every / alone);
    return 0;
  }

  std::vector<double> copy;
  for (int64_t bytes : kSizes) copy.push_back(memcpy_seconds(bytes));
  bool goal_met = true;
  double goal_ratio = 0;
  for (int ranks : world_sizes) {
    std::map<bool, std::vector<std::vector<double>>> runs;
    for (int round = 0; round < rounds; ++round) {
      for (bool shm : {true, false}) runs[shm].push_back(all_reduce_seconds(ranks, shm));
    }
    std::printf("\n%d ranks%s:\n\n", ranks,
                ranks > 2 ? " (4 processes on 2 cores: oversubscribed)" : "");
    std::printf("| size | memcpy GB/s | Gloo GB/s | shared memory GB/s | shared memory / Gloo |\n");
    std::printf("|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < kSizes.size(); ++i) {
      auto pick = [&](bool shm) {
        std::vector<double> v;
        for (const auto& run : runs[shm]) v.push_back(run[i]);
        return median(v);
      };
      const double gb = kSizes[i] / 1e9, shm = pick(true), gloo = pick(false);
      std::printf("| %s | %.2f | %.2f | %.2f | %.2fx |\n", size_text(kSizes[i]).c_str(),
                  gb / copy[i], gb / gloo, gb / shm, gloo / shm);
      if (ranks == 2 && kSizes[i] == (25 << 20)) {
        goal_met = gloo / shm >= 4.0;
        goal_ratio = gloo / shm;
      }
    }
    if (ranks == 2 && goal_ratio > 0) {  // after the table: a line inside it would end it
      std::printf("\nGOAL %s: shared memory at 25 MB on 2 ranks is %.2fx Gloo (goal >= 4x)\n",
                  goal_met ? "met" : "MISSED", goal_ratio);
    }
  }
  return 0;
}
