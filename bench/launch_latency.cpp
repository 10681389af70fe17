// Launch latency. Three modes:
//   bench_launch_latency N          accelerant::launch forks N workers (the in-program launcher)
//   bench_launch_latency --worker   one worker of any launcher (accelerant launch, torchrun,
//   mpirun) bench_launch_latency --noop     returns at once: what starting a LibTorch program costs
// A worker joins the group, passes a barrier, then prints "READY <CLOCK_MONOTONIC seconds>".
// bench/compare_launch.py starts these and torchrun side by side and compares launch -> all ready.
#include <accelerant/accelerant.h>

#include <cstdio>
#include <cstring>
#include <ctime>

namespace {

void join_and_report_ready() {
  accelerant::ProcessState::get().wait_for_everyone();
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  std::printf("READY %.6f\n", now.tv_sec + now.tv_nsec * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--noop") == 0) return 0;
  if (argc > 1 && std::strcmp(argv[1], "--worker") == 0) {
    join_and_report_ready();
    accelerant::ProcessState::shutdown();
    return 0;
  }
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  accelerant::launch(join_and_report_ready,
                     accelerant::LaunchOptions().processes_per_node(n).verbose(false));
  return 0;
}
