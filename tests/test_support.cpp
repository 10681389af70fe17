#include "test_support.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "accelerant/error.h"

namespace accelerant::testing {

namespace {
std::filesystem::path test_binary_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}
}  // namespace

std::string launch_helper_path() { return (test_binary_dir() / "launch_helper").string(); }
std::string test_file_path(const std::string& name) { return (test_binary_dir() / name).string(); }
std::string cli_path() { return (test_binary_dir().parent_path() / "bin" / "accelerant").string(); }

bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close_paren = content.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= content.size()) return false;
  const char state = content[close_paren + 2];
  return state != 'Z' && state != 'X';
}

std::vector<pid_t> wait_until_dead(const std::vector<pid_t>& pids,
                                   std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    std::vector<pid_t> alive;
    for (pid_t p : pids) {
      if (process_alive(p)) alive.push_back(p);
    }
    if (alive.empty() || std::chrono::steady_clock::now() > deadline) return alive;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string make_temp_dir() {
  std::string pattern = "/tmp/accelerant-test-XXXXXX";
  return ::mkdtemp(pattern.data()) ? pattern : "";
}

void remove_tree(const std::string& dir) {
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

std::vector<pid_t> read_pid_files(const std::string& dir) {
  std::vector<pid_t> pids;
  for (auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("pid.", 0) != 0) continue;
    std::ifstream in(entry.path());
    pid_t pid = -1;
    if (in >> pid) pids.push_back(pid);
  }
  return pids;
}

ProgramRun start_program(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

int finish_program(ProgramRun& run, std::string& output, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buffer[4096];
  bool open = true;
  while (open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{run.out_fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = ::read(run.out_fd, buffer, sizeof buffer);
    if (n <= 0)
      open = false;
    else
      output.append(buffer, static_cast<size_t>(n));
  }
  ::close(run.out_fd);
  int status = 0;
  if (open) {  // timed out
    ::kill(run.pid, SIGKILL);
    ::waitpid(run.pid, &status, 0);
    return -1;
  }
  ::waitpid(run.pid, &status, 0);
  return status;
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  while (dirent* e = proc ? ::readdir(proc) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto paren = content.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(content.substr(paren + 2));
    char state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) children.push_back(pid);
  }
  if (proc) ::closedir(proc);
  return children;
}

std::string environment_of(pid_t pid, const std::string& name) {
  std::ifstream env("/proc/" + std::to_string(pid) + "/environ");
  std::string entry;
  while (std::getline(env, entry, '\0')) {
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::function<std::optional<std::string>(const std::string&)> env_of(
    std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::vector<std::string> torchrun_argv(int nproc) {
  return {"/usr/bin/python3",
          "-m",
          "torch.distributed.run",
          "--nnodes",
          "1",
          "--rdzv_backend",
          "c10d",
          "--rdzv_endpoint",
          "127.0.0.1:" + std::to_string(free_port()),
          "--rdzv_id",
          "test-" + std::to_string(::getpid()),
          "--nproc_per_node",
          std::to_string(nproc),
          "--redirects",
          "1",
          "--tee",
          "1",
          "--no_python"};
}

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

torch::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters())
    parts.push_back(p.detach().reshape({-1}).to(torch::kCPU).clone());
  return torch::cat(parts);
}

torch::nn::Sequential small_mlp() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 3));
}

}  // namespace accelerant::testing
