// `accelerant launch` is never wrong and never silent (issue 22): a rank that returns before the
// others ends the job at once, naming it; an unwritable --log_dir is refused before any worker
// starts; a worker's background processes go with it; output without newlines is relayed in
// bounded time and memory, '\r' progress at once; impossible input is refused in one line.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <iterator>
#include <thread>

#include "test_support.h"

using namespace accelerant::testing;

namespace {

using Clock = std::chrono::steady_clock;

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

ProgramRun start_launch(const std::vector<std::string>& args) {
  ::unsetenv("ACCELERANT_CONFIG_FILE");
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  std::vector<std::string> argv{cli_path(), "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  return start_program(argv);
}

int run(const std::vector<std::string>& args, std::string& output,
        std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto program = start_launch(args);
  return exit_code(finish_program(program, output, limit));
}

// Reads the program's output until it contains `what` or `limit` passes.
bool read_until(ProgramRun& program, const std::string& what, std::string& output,
                std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  char buffer[4096];
  while (output.find(what) == std::string::npos && Clock::now() < deadline) {
    pollfd fd{program.out_fd, POLLIN, 0};
    if (::poll(&fd, 1, 100) <= 0) continue;
    const ssize_t n = ::read(program.out_fd, buffer, sizeof buffer);
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  return output.find(what) != std::string::npos;
}

}  // namespace

// Before: rank 0 slept on until its own end (here 60 s, in a real job the collective timeout of
// 30 minutes), and the job then "succeeded".
TEST(EarlyExit, ARankThatReturnsWhileAnotherWaitsEndsTheJobNamingIt) {
  const auto start = Clock::now();
  std::string out;
  const int code = run({"-n", "2", "/bin/sh", "-c", "[ \"$RANK\" = 1 ] && exit 0; exec sleep 60"},
                       out, std::chrono::seconds(90));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << out;
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(contains(out, "worker rank 1 (local rank 1")) << out;
  EXPECT_TRUE(contains(out, "exited with exit code 0 while rank(s) 0 still ran")) << out;
  EXPECT_TRUE(contains(out, "returned before the others")) << out;
  EXPECT_TRUE(contains(out, "Fix: make every rank run the same collectives")) << out;
}

// The same in a real collective: rank 1 returns after the first all-reduce, rank 0 waits in the
// second. Whether rank 0 notices the missing peer itself or the launcher ends it, the report
// names rank 1 and its clean exit.
TEST(EarlyExit, ARankThatSkipsACollectiveIsNamedWithinSeconds) {
  ::setenv("ACCELERANT_TIMEOUT_MS", "600000", 1);  // far beyond the bound checked here
  const auto start = Clock::now();
  std::string out;
  const int code = run({"-n", "2", launch_helper_path(), "early"}, out, std::chrono::seconds(90));
  ::unsetenv("ACCELERANT_TIMEOUT_MS");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20)) << out;
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(contains(out, "worker rank 1 (local rank 1") ||
              contains(out, "Before that, worker rank 1 exited with exit code 0"))
      << out;
}

// Ranks of a healthy job may finish at different times when the last one still works (rank 0
// evaluating or saving after the others returned): busy, it is not stopped.
TEST(EarlyExit, ARankStillWorkingAfterTheOthersReturnedFinishes) {
  std::string out;
  ASSERT_EQ(run({"-n", "2", "/bin/bash", "-c",
                 "[ \"$RANK\" = 1 ] && exit 0; while [ $SECONDS -lt 6 ]; do :; done; echo rank 0 "
                 "done"},
                out),
            0)
      << out;
  EXPECT_TRUE(contains(out, "rank 0 done")) << out;
}

// The same for a rank that works with little CPU: writing its checkpoint to a slow disk or over
// the network (here about 1 MB/s through a pipe, for 6 s).
TEST(EarlyExit, ARankStillWritingAfterTheOthersReturnedFinishes) {
  ScratchDir dir;
  std::string out;
  ASSERT_EQ(run({"-n", "2", "/bin/sh", "-c",
                 "[ \"$RANK\" = 1 ] && exit 0; i=0; while [ $i -lt 12 ]; do head -c 500000 "
                 "/dev/zero; sleep 0.5; i=$((i+1)); done | cat > " +
                     dir.path + "/checkpoint; echo rank 0 saved"},
                out),
            0)
      << out;
  EXPECT_TRUE(contains(out, "rank 0 saved")) << out;
}

// Before: only the worker got the SIGTERM; its `sleep 1000 &` lived on, reparented to init.
TEST(ProcessGroups, AWorkersBackgroundProcessesEndWithTheJob) {
  ScratchDir dir;
  std::string out;
  EXPECT_EQ(
      run({"-n", "2", "/bin/sh", "-c",
           "sleep 1000 & echo $! > " + dir.path + "/pid.$RANK; [ \"$RANK\" = 1 ] && exit 3; wait"},
          out),
      1)
      << out;
  const auto pids = read_pid_files(dir.path);
  ASSERT_EQ(pids.size(), 2u) << out;
  EXPECT_TRUE(wait_until_dead(pids, std::chrono::seconds(10)).empty())
      << "a worker's background process outlived the job:\n"
      << out;
}

// Workers have their own process groups, so a terminal's ^C reaches only the launcher: it must
// pass the SIGINT on (a worker may handle it: save, then leave), not turn it into a SIGTERM.
TEST(ProcessGroups, SigintToTheLauncherIsForwardedToTheWorkers) {
  ScratchDir dir;
  auto program =
      start_launch({"-n", "2", "/bin/sh", "-c",
                    "trap 'echo rank $RANK got SIGINT; exit 7' INT; trap 'echo rank $RANK got "
                    "SIGTERM; exit 8' TERM; sleep 60 & echo $$ > " +
                        dir.path + "/pid.$RANK; wait"});
  std::vector<pid_t> workers;
  for (int i = 0; i < 100 && workers.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    workers = read_pid_files(dir.path);
  }
  ASSERT_EQ(workers.size(), 2u);
  ::kill(program.pid, SIGINT);
  std::string out;
  finish_program(program, out, std::chrono::seconds(30));
  EXPECT_TRUE(contains(out, "rank 0 got SIGINT")) << out;
  EXPECT_TRUE(contains(out, "rank 1 got SIGINT")) << out;
  EXPECT_TRUE(wait_until_dead(workers, std::chrono::seconds(10)).empty()) << out;
}

// Before: an unwritable directory was ignored, every line was lost and the job exited 0.
TEST(LogDir, AnUnwritableLogDirIsRefusedBeforeAnyWorkerStarts) {
  ScratchDir dir;
  std::ofstream(dir.path + "/a_file") << "not a directory\n";
  const std::string logs = dir.path + "/a_file/logs";
  std::string out;
  EXPECT_EQ(run({"-n", "2", "--log_dir", logs, "/bin/sh", "-c", "touch " + dir.path + "/ran"}, out),
            1);
  EXPECT_TRUE(contains(out, "cannot write the workers' logs in log_dir " + logs +
                                ": Not a "
                                "directory"))
      << out;
  EXPECT_FALSE(contains(out, "Launching")) << out;
  EXPECT_NE(::access((dir.path + "/ran").c_str(), F_OK), 0) << "a worker ran:\n" << out;
}

// Before: 50 MB without a newline took minutes and gigabytes (the line was searched again after
// every read). Now it goes out in 64 KiB pieces.
TEST(OutputRelay, AHugeLineWithoutNewlineIsRelayedInBoundedTimeAndMemory) {
  const auto start = Clock::now();
  std::string out;
  ASSERT_EQ(run({"-n", "1", "/bin/sh", "-c", "head -c 50000000 /dev/zero | tr '\\0' x"}, out), 0)
      << out.substr(0, 2000);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(std::count(out.begin(), out.end(), 'x'), 50000000);
  rusage usage{};
  ::getrusage(RUSAGE_CHILDREN, &usage);  // the largest descendant reaped: the launcher
  EXPECT_LT(usage.ru_maxrss, 100 * 1024) << "KiB";
}

// Before: "10%\r" waited for a '\n' that a progress display writes only at its end. The worker
// writes its "100%" line only once the test has seen the "10%\r" update on the launcher's output
// (it blocks reading a FIFO that the test writes to then), so the update must have been relayed
// before its line ended: ordering, not timing.
TEST(OutputRelay, AProgressUpdateIsRelayedBeforeItsLineEnds) {
  ScratchDir dir;
  const std::string go = dir.path + "/go";
  ASSERT_EQ(::mkfifo(go.c_str(), 0600), 0);
  auto program = start_launch(
      {"-n", "1", "--prefix_output", "/bin/sh", "-c",
       "printf '\\rprogress 10%%\\r'; read x < '" + go + "'; printf 'progress 100%%\\n'"});
  std::string out;
  const bool seen = read_until(program, "[rank 0/1] progress 10%\r", out, std::chrono::seconds(20));
  EXPECT_TRUE(seen) << out;
  EXPECT_FALSE(contains(out, "100%")) << out;
  if (seen) {
    const int fd = ::open(go.c_str(), O_WRONLY);  // the worker is waiting to read it
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "go\n", 3), 3);
    ::close(fd);
  } else {
    ::kill(program.pid, SIGTERM);
  }
  std::string rest;
  EXPECT_EQ(exit_code(finish_program(program, rest, std::chrono::seconds(30))), seen ? 0 : 1);
  out += rest;
  EXPECT_TRUE(contains(out, "[rank 0/1] progress 10%\r[rank 0/1] progress 100%\n")) << out;
  // The empty segment before the first '\r' moves nothing, so nothing shows for it.
  EXPECT_FALSE(contains(out, "[rank 0/1] \r")) << out;
}

// A log file keeps lines, not redraws: of the redraws before a line's end, the last (what a
// terminal shows then), and a redraw left at the end of the output. The console (tee) gets all.
TEST(OutputRelay, ALogFileKeepsTheLastRedrawOfEachLineNotEveryRedraw) {
  ScratchDir dir;
  const std::string logs = dir.path + "/logs";
  std::string out;
  ASSERT_EQ(run({"-n", "1", "--log_dir", logs, "--tee", "/bin/sh", "-c",
                 "printf '10%%\\r20%%\\r\\nsaved\\n30%%\\rdone\\n40%%\\r'"},
                out),
            0)
      << out;
  EXPECT_TRUE(contains(out, "10%\r20%\r\nsaved\n30%\rdone\n40%\r")) << out;
  std::ifstream file(logs + "/attempt_0/rank_0.stdout", std::ios::binary);
  const std::string logged((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
  EXPECT_EQ(logged, "20%\nsaved\ndone\n40%\n");
}

// Before: access(X_OK) says yes to a directory, so the workers started and each failed in exec.
TEST(Input, ADirectoryGivenAsTheProgramIsRefusedBeforeAnyWorkerStarts) {
  ScratchDir dir;
  std::string out;
  EXPECT_EQ(run({"-n", "2", dir.path}, out), 1);
  EXPECT_TRUE(contains(out, "cannot run '" + dir.path + "': it is a directory")) << out;
  EXPECT_FALSE(contains(out, "Launching")) << out;
}

// Before: workers started until the launcher ran out of descriptors for their pipes, half-way.
TEST(Input, MoreWorkersThanTheDescriptorLimitAllowsAreRefusedUpFront) {
  std::string out;
  auto program = start_program(
      {"/bin/sh", "-c", "ulimit -n 64 && exec \"$0\" launch -n 40 /bin/sh -c 'echo started'",
       cli_path()});
  EXPECT_EQ(exit_code(finish_program(program, out, std::chrono::seconds(60))), 1) << out;
  EXPECT_TRUE(contains(out, "above its limit RLIMIT_NOFILE of 64")) << out;
  EXPECT_TRUE(contains(out, "Fix: raise the limit (`ulimit -n ")) << out;
  EXPECT_FALSE(contains(out, "started")) << out;
}

// The kernel holds only other users than root to RLIMIT_NPROC, so as root the launcher runs as
// nobody (setpriv) to be held to it.
TEST(Input, MoreWorkersThanTheProcessLimitAllowsAreRefusedUpFront) {
  std::vector<std::string> argv;
  if (::getuid() == 0) {
    if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "needs setpriv (util-linux)";
    argv = {"/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"};
  }
  for (const char* arg : {"/bin/bash", "-c", "ulimit -u 3 && exec \"$0\" launch -n 8 /bin/true"})
    argv.push_back(arg);
  argv.push_back(cli_path());
  ::setenv("XDG_CACHE_HOME", "/nonexistent/accelerant-test-cache", 1);
  std::string out;
  auto program = start_program(argv);
  EXPECT_EQ(exit_code(finish_program(program, out, std::chrono::seconds(60))), 1) << out;
  EXPECT_TRUE(contains(out, "exceed its limit RLIMIT_NPROC of 3")) << out;
  EXPECT_TRUE(contains(out, "Fix: raise the limit (`ulimit -u ")) << out;
}

// Before: a name that does not resolve was retried on machine 0 until the collective timeout
// (30 minutes), then blamed on a taken port; on another machine the join timeout passed with
// "its launcher was not started". Machine 0 now says it at once; another machine, which may see
// the name only once machine 0 runs, after its join timeout.
TEST(Input, AMainProcessIpThatDoesNotResolveIsNamed) {
  const std::string port = std::to_string(free_port());
  for (const std::vector<std::string>& machine :
       {std::vector<std::string>{"-n", "1"},
        std::vector<std::string>{"-n", "2", "--num_machines", "2", "--machine_rank", "1",
                                 "--main_process_port", port, "--join_timeout", "2"}}) {
    std::vector<std::string> args = machine;
    for (const char* arg : {"--main_process_ip", "no-such-host.invalid", "/bin/true"})
      args.push_back(arg);
    const auto start = Clock::now();
    std::string out;
    EXPECT_EQ(run(args, out, std::chrono::seconds(90)), 1) << out;
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << out;
    EXPECT_TRUE(contains(out, "master_addr 'no-such-host.invalid' does not resolve")) << out;
    EXPECT_FALSE(contains(out, "port is taken")) << out;
    EXPECT_FALSE(contains(out, "was not started")) << out;
  }
}

// A refused join is one message naming the address and what the connection met.
TEST(Input, ARefusedJoinNamesTheAddressAndTheFailure) {
  const std::string port = std::to_string(free_port());
  std::string out;
  EXPECT_EQ(run({"-n", "2", "--num_machines", "2", "--machine_rank", "1", "--main_process_port",
                 port, "--join_timeout", "2", "/bin/true"},
                out, std::chrono::seconds(60)),
            1)
      << out;
  EXPECT_TRUE(contains(out, "at 127.0.0.1:" + port + ") did not answer")) << out;
  EXPECT_TRUE(contains(out, "Connection refused")) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << "one message, no stack of them:\n"
                                                         << out;
}

// A listening socket whose queue is full: the kernel drops new connection attempts, as a firewall
// or a machine that is down does. Closes its sockets when it goes out of scope.
struct SilentListener {
  int port = 0;
  std::vector<int> fds;
  SilentListener() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof a;
    ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener, 0);
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &size);
    port = ntohs(a.sin_port);
    fds.push_back(listener);
    for (int i = 0; i < 4; ++i) {  // never accepted: they fill the queue
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      fds.push_back(fd);
    }
  }
  ~SilentListener() {
    for (int fd : fds) ::close(fd);
  }
};

// Before: each connection attempt waited for the kernel's SYN retries (about two minutes),
// whatever the join timeout said.
TEST(Input, AMainMachineThatDoesNotAnswerIsNamedWithinTheJoinTimeout) {
  SilentListener silent;
  const std::string port = std::to_string(silent.port);
  const auto start = Clock::now();
  std::string out;
  EXPECT_EQ(run({"-n", "2", "--num_machines", "2", "--machine_rank", "1", "--main_process_port",
                 port, "--join_timeout", "2", "/bin/true"},
                out, std::chrono::seconds(60)),
            1)
      << out;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << out;
  EXPECT_TRUE(contains(out, "at 127.0.0.1:" + port + ") did not answer")) << out;
  EXPECT_TRUE(contains(out, "no answer (connection timed out)")) << out;
}
