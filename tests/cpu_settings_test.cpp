// The default thread count of a process (src/base/cpu_settings.h): the usable CPUs shared among
// the machine's processes, or what srun -c allotted each task, at most the usable CPUs.
#include "base/cpu_settings.h"

#include <gtest/gtest.h>

using accelerant::detail::default_thread_count;

TEST(CpuSettings, DefaultThreadCount) {
  struct Case {
    int usable, local_processes, cpus_per_process, expected;
  };
  const std::vector<Case> cases = {
      {16, 1, 0, 16},                 // one process: every usable CPU
      {16, 4, 0, 4},                  // shared among the machine's processes
      {16, 3, 0, 5},                  // rounded down
      {2, 4, 0, 1},                   // at least one
      {1, 1, 0, 1},   {16, 2, 0, 8},  // srun without -c, task/none: the mask is the machine's
      {16, 2, 4, 4},  // srun -c 4, task/none: the task's allotment, not half the machine
      {4, 2, 4, 4},   // srun -c 4, task/affinity: the mask is the task's own 4 CPUs
      {2, 2, 4, 2},   // -c above the usable CPUs: bounded by them
      {8, 0, 0, 8},   // an unknown process count counts as one
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "usable " << c.usable << ", local processes "
                                      << c.local_processes << ", -c " << c.cpus_per_process);
    EXPECT_EQ(default_thread_count(c.usable, c.local_processes, c.cpus_per_process), c.expected);
  }
}
