// Launch latency: accelerant::launch starts N workers that each join the group and pass a
// barrier, then print "READY <CLOCK_MONOTONIC seconds>". bench/compare_launch.py starts this
// program and torchrun side by side and compares launch -> all workers ready.
//   bench_launch_latency N
#include <accelerant/accelerant.h>

#include <cstdio>
#include <ctime>

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  accelerant::launch(
      [] {
        accelerant::ProcessState::get().wait_for_everyone();
        timespec now{};
        clock_gettime(CLOCK_MONOTONIC, &now);
        std::printf("READY %.6f\n", now.tv_sec + now.tv_nsec * 1e-9);
      },
      accelerant::LaunchOptions().num_processes(n).verbose(false));
  return 0;
}
