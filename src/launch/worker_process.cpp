#include "launch/worker_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "accelerant/error.h"
#include "base/exit_hooks.h"
#include "base/file_io.h"
#include "base/text.h"
#include "launch/signal_guard.h"

namespace accelerant::detail {
namespace {

void flush_all_output() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

int report_uncaught(const WorkerSpec& spec, const std::string& text) {
  write_file_atomically(spec.error_path, text);
  std::fprintf(stderr, "%sworker failed with an uncaught exception: %s\n",
               rank_prefix(spec.rank, spec.world_size).c_str(), text.c_str());
  return 1;
}

std::string describe(const AgentHooks& hooks, std::exception_ptr exception) {
  if (hooks.describe_exception) return hooks.describe_exception(exception);
  try {
    std::rethrow_exception(exception);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of a type not derived from std::exception";
  }
}

[[noreturn]] void run_in_child(const WorkerSpec& spec, const WorkerBody& body,
                               const AgentHooks& hooks) {
  int code = 0;
  try {
    std::vector<char> result = body(spec.rank);
    if (!write_file_atomically(spec.result_path, std::string(result.begin(), result.end()))) {
      throw Error(str("could not write the worker's result to ", spec.result_path,
                      " (disk full or directory removed?)"));
    }
    if (hooks.finish_worker) hooks.finish_worker();
  } catch (...) {
    code = report_uncaught(spec, describe(hooks, std::current_exception()));
  }
  run_exit_hooks();  // _exit skips atexit, where they would run
  flush_all_output();
  ::_exit(code);
}

// What the process has read and written through system calls (files, sockets, pipes), in bytes.
long long io_bytes(const char* pid) {
  std::istringstream file(read_proc_file(std::string("/proc/") + pid + "/io"));
  std::string name;
  long long value = 0, total = 0;
  while (file >> name >> value) {
    if (name == "rchar:" || name == "wchar:") total += value;
  }
  return total;
}

}  // namespace

WorkerProcess start_worker(const WorkerSpec& spec, const WorkerBody& body, const AgentHooks& hooks,
                           OutputRelay& relay) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw LaunchError(str("accelerant::launch could not create pipes for rank ", spec.rank,
                          " (too many open files?). Fix: raise `ulimit -n`."));
  }
  flush_all_output();  // or the child would print the parent's buffered output again
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    throw LaunchError(
        str("accelerant::launch: fork() failed for rank ", spec.rank, ": ", std::strerror(errno),
            ". Likely cause: too many processes or too little "
            "memory. Fix: lower processes_per_node (accelerant launch: --world_size)."));
  }
  if (pid == 0) {
    ::setsid();  // its own session and group: see start_worker in worker_process.h
    SignalGuard::reset_in_child();
    // Die with the launcher, whatever kills it; and do not start if it is already gone.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kExitParentGone);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a pipe would otherwise be block-buffered
    for (const auto& [name, value] : spec.environment) ::setenv(name.c_str(), value.c_str(), 1);
    if (hooks.prepare_worker) hooks.prepare_worker(spec.threads);
    run_in_child(spec, body, hooks);
  }
  ::close(out[1]);
  ::close(err[1]);
  relay.add(out[0], spec.rank, /*is_stderr=*/false);
  relay.add(err[0], spec.rank, /*is_stderr=*/true);
  WorkerProcess worker;
  worker.spec = spec;
  worker.pid = pid;
  worker.running = true;
  return worker;
}

void signal_worker(pid_t pid, int signal) {
  // ESRCH: the worker has not called setsid yet (or its whole group is gone).
  if (::kill(-pid, signal) != 0 && errno == ESRCH) ::kill(pid, signal);
}

std::vector<GroupUsage> process_group_usage(const std::vector<pid_t>& groups, bool with_io) {
  std::vector<GroupUsage> usage(groups.size());
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return usage;
  while (const dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    const std::string stat = read_proc_file(std::string("/proc/") + entry->d_name + "/stat");
    // After the command name (in parentheses, which may hold anything): state ppid pgrp ... with
    // utime, stime, cutime and cstime as the 12th to 15th fields after the state, and the start
    // time the 20th.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state, skip;
    long long ppid = 0, pgrp = 0, utime = 0, stime = 0, cutime = 0, cstime = 0;
    unsigned long long start = 0;
    fields >> state >> ppid >> pgrp;
    for (int i = 0; i < 8; ++i) fields >> skip;
    fields >> utime >> stime >> cutime >> cstime;  // with its ended children's (a script's tools)
    for (int i = 0; i < 4; ++i) fields >> skip;
    fields >> start;
    if (!fields || state == "Z" || state == "X") continue;
    const unsigned long long pid = std::strtoull(entry->d_name, nullptr, 10);
    for (size_t i = 0; i < groups.size(); ++i) {
      if (groups[i] != pgrp) continue;
      ++usage[i].alive;
      usage[i].cpu_ticks += utime + stime + cutime + cstime;
      usage[i].members += (pid * 0x9E3779B97F4A7C15ULL) ^ start;  // order-free: a sum
      if (with_io) usage[i].io_bytes += io_bytes(entry->d_name);
    }
  }
  ::closedir(proc);
  return usage;
}

}  // namespace accelerant::detail
