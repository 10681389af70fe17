// Objects built before launch are shared copy-on-write: four workers reading a 200 MB tensor
// must add far less than 4 x 200 MB to the total proportional set size (PSS).
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

#include <fstream>

using namespace accelerant;

namespace {

// Pss of a process in kB, from /proc/PID/smaps_rollup.
int64_t pss_kb(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/smaps_rollup");
  std::string key;
  int64_t value = 0;
  while (in >> key) {
    if (key == "Pss:") {
      in >> value;
      return value;
    }
  }
  return -1;
}

// Total PSS (kB) of the parent and four workers that each read `weights` entirely.
double total_pss_kb(const torch::Tensor& weights) {
  const double expected_sum = weights.sum().item<double>();
  auto results = launch(
      [expected_sum](int, const torch::Tensor& w) {
        auto& state = ProcessState::get();
        const double sum = w.sum().item<double>();  // reads every page
        state.wait_for_everyone();                  // all four alive and done reading
        const int64_t mine = pss_kb("self");
        const int64_t parent = state.is_main_process() ? pss_kb(std::to_string(::getppid())) : 0;
        state.wait_for_everyone();
        const bool same = std::abs(sum - expected_sum) <= 1e-3 * std::abs(expected_sum);
        return torch::tensor({static_cast<double>(mine + parent), same ? 1.0 : 0.0},
                             torch::kDouble);
      },
      std::cref(weights),
      LaunchOptions()
          .processes_per_node(4)
          .collective_timeout(std::chrono::seconds(120))
          .verbose(false));
  double total = 0;
  for (const auto& r : results) {
    EXPECT_EQ(r[1].item<double>(), 1.0) << "a worker read different values";
    total += r[0].item<double>();
  }
  return total;
}

}  // namespace

TEST(ForkSharing, FourWorkersShareA200MBTensorBuiltBeforeLaunch) {
  constexpr int64_t kElements = 50'000'000;  // 200 MB of float
  const double baseline_kb = total_pss_kb(torch::rand({1000}));
  auto model = torch::rand({kElements});
  const double with_model_kb = total_pss_kb(model);
  const double tensor_kb = kElements * 4 / 1024.0;
  const double added_kb = with_model_kb - baseline_kb;
  std::printf(
      "fork sharing: a %.0f MiB tensor built before launch adds %.0f MiB to the total PSS of "
      "parent + 4 workers (%.0f -> %.0f MiB); unshared copies would add %.0f MiB\n",
      tensor_kb / 1024, added_kb / 1024, baseline_kb / 1024, with_model_kb / 1024,
      5 * tensor_kb / 1024);
  EXPECT_LT(added_kb, 2 * tensor_kb) << "the workers copied the tensor instead of sharing it";
  EXPECT_GT(added_kb, 0.5 * tensor_kb) << "the measurement did not see the tensor at all";
}
