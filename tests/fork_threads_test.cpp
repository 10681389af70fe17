// A parent that has run LibTorch ops on several threads must not make its forked workers hang
// (docs/launching.md "Threads and fork"). Own binary: the parent's thread pools stay alive.
#include <accelerant/accelerant.h>
#include <gtest/gtest.h>

using namespace accelerant;

TEST(ForkThreads, WorkersOfAMultiThreadedParentRunMultiThreadedOpsWithoutHanging) {
  torch::set_num_threads(2);
  auto a = torch::rand({512, 512});
  auto warm = a.matmul(a).add_(1).sum().item<float>();  // starts OpenMP and BLAS threads
  ASSERT_GT(warm, 0);
  auto results = launch(
      [](int) {
        auto x = torch::rand({512, 512});
        // Large enough that LibTorch would split it across its pool if it had one.
        auto y = x.matmul(x).add_(1).sigmoid().sum().item<float>();
        return torch::tensor({static_cast<float>(torch::get_num_threads()), y > 0 ? 1.0f : 0.0f});
      },
      LaunchOptions()
          .processes_per_node(2)
          .threads_per_process(2)
          .collective_timeout(std::chrono::seconds(60))
          .verbose(true));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r[0].item<float>(), 1.0f)
        << "workers of a multi-threaded parent must run single-threaded";
    EXPECT_EQ(r[1].item<float>(), 1.0f);
  }
  // The parent keeps its own threads.
  EXPECT_EQ(torch::get_num_threads(), 2);
}
