#include "accelerant/process_state.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <sstream>
#include <thread>

#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "base/text.h"
#include "base/torch_compat.h"
#include "base/uncaught_exception_recorder.h"
#include "comm/collective_diagnosis.h"
#include "comm/collective_watchdog.h"
#include "comm/communicator_impl.h"
#include "comm/cuda_presence.h"
#include "comm/machine_identity.h"
#include "comm/process_state_fork.h"
#include "comm/shared_memory_connect.h"

namespace accelerant {
namespace {

// Gloo writes to its sockets without MSG_NOSIGNAL: when a peer dies, the next write raises
// SIGPIPE, whose default action ends this process at once (the launcher reports "signal 13")
// instead of failing the collective with an error that names the dead rank. Python ignores SIGPIPE
// for PyTorch's users; a process does so here when it joins a group, unless its program has chosen
// what SIGPIPE does.
void ignore_broken_pipes() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && !(current.sa_flags & SA_SIGINFO) &&
      current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

std::mutex& state_mutex() {
  static std::mutex m;
  return m;
}
std::unique_ptr<ProcessState>& state_slot() {
  static std::unique_ptr<ProcessState> slot;
  return slot;
}

std::string host_name() {
  char name[256] = {0};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name)
                                                   : std::string("this machine");
}

bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

// The local address this machine would use to reach `host`: a UDP socket "connected" to it sends
// nothing, but makes the kernel pick the route and the source address. "" when there is no route.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    char text[INET6_ADDRSTRLEN] = {0};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      const void* raw =
          local.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return address;
}

// GLOO_SOCKET_IFNAME (comma-separated) wins, as in PyTorch; a loopback master means a one-machine
// job, which must not depend on the hostname resolving. Otherwise Gloo listens on the address that
// routes to the master: Gloo's own default (the hostname's address) is wrong wherever the hostname
// resolves to another interface than the one the job's machines share (several networks, network
// namespaces, /etc/hosts mapping it to 127.0.1.1).
std::vector<std::shared_ptr<gloo::transport::Device>> gloo_devices(const std::string& master_addr) {
  std::vector<std::shared_ptr<gloo::transport::Device>> devices;
  if (const auto ifnames = environment_value("GLOO_SOCKET_IFNAME"); ifnames && !ifnames->empty()) {
    std::stringstream list(*ifnames);
    for (std::string name; std::getline(list, name, ',');) {
      if (!name.empty()) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  } else if (is_loopback(master_addr)) {
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else if (const std::string local = local_address_towards(master_addr); !local.empty()) {
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
  } else {
    devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return devices;
}

}  // namespace

// What a ProcessState holds: the launcher's contract it was built from, the settings resolved
// from the options and that contract, and the job's store and communicator after the rendezvous.
struct ProcessState::Impl {
  Impl(LaunchContract env, const ProcessStateOptions& options);
  // Meets the other ranks through the job's store and opens the communicator's group.
  void rendezvous();
  // Returns once every rank has claimed its arrival key; throws naming the missing ranks after
  // the join timeout, or when the store goes away or the ranks disagree on the world size.
  void wait_for_arrivals(std::chrono::milliseconds join_timeout, const std::string& where);
  std::string rank_prefix() const;

  struct Rendezvous {
    c10::intrusive_ptr<c10d::TCPStore> tcp_store;
    c10::intrusive_ptr<c10d::Store> attempt_store;   // keys of this restart attempt only
    detail::CollectiveWatchdog* watchdog = nullptr;  // the communicator's, while it lives
  };

  LaunchContract env_;
  std::chrono::milliseconds timeout_;
  bool debug_;
  torch::Device device_;
  Communicator communicator_;
  std::unique_ptr<Rendezvous> rendezvous_;  // null when the job has one process
};

ProcessState::ProcessState(LaunchContract env, const ProcessStateOptions& options)
    : impl_(std::make_unique<Impl>(std::move(env), options)) {}

ProcessState::Impl::Impl(LaunchContract env, const ProcessStateOptions& options)
    : env_(std::move(env)),
      timeout_(options.collective_timeout().value_or(
          env_.collective_timeout.value_or(kDefaultCollectiveTimeout))),
      debug_(options.debug().value_or(env_.debug.value_or(false))),
      device_(torch::kCPU) {
  // For the launcher's failure report (ours, or torchrun's summary).
  detail::record_uncaught_exceptions_to(env_.error_file, env_.torchelastic_error_file);
  // Asked only when the CPU was not chosen: the query itself starts CUDA's driver.
  const int64_t gpus = options.cpu() ? 0 : detail::visible_cuda_devices();
  if (gpus > 0) {  // a worker: it will use CUDA
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env_.local_rank % gpus));
  }
  // A bad ACCELERANT_SHM_ALLREDUCE fails here, on every rank alike, before any rank meets the
  // others: read only after the rendezvous, the first rank to throw could leave the others failing
  // on its closed connection, and that failure could be the one the launcher reported.
  if (env_.distributed()) {
    detail::shm_all_reduce_enabled();
    rendezvous();
  }
}

ProcessState::~ProcessState() = default;

std::string ProcessState::Impl::rank_prefix() const {
  return env_.distributed() ? accelerant::rank_prefix(env_.rank, env_.world_size) : "";
}

const LaunchContract& ProcessState::env() const { return impl_->env_; }
int ProcessState::rank() const { return impl_->env_.rank; }
int ProcessState::world_size() const { return impl_->env_.world_size; }
int ProcessState::local_rank() const { return impl_->env_.local_rank; }
int ProcessState::local_world_size() const { return impl_->env_.local_world_size; }
int ProcessState::node_rank() const { return impl_->env_.node_rank; }
int ProcessState::num_nodes() const { return impl_->env_.num_nodes; }
bool ProcessState::is_main_process() const { return impl_->env_.rank == 0; }
bool ProcessState::is_local_main_process() const { return impl_->env_.local_rank == 0; }
bool ProcessState::distributed() const { return impl_->env_.world_size > 1; }
int ProcessState::restart_count() const { return impl_->env_.restart_count; }
bool ProcessState::debug() const { return impl_->debug_; }
std::chrono::milliseconds ProcessState::collective_timeout() const { return impl_->timeout_; }
torch::Device ProcessState::device() const { return impl_->device_; }
std::string ProcessState::rank_prefix() const { return impl_->rank_prefix(); }
Communicator& ProcessState::communicator() { return impl_->communicator_; }

void ProcessState::regroup() {
  Impl& s = *impl_;
  if (!s.env_.distributed()) return;
  // The broken group goes first: its shared-memory segment, Gloo's connections and the watchdog
  // of the last generation, which must not judge the new one.
  s.communicator_ = Communicator();
  ++s.env_.restart_count;
  try {
    s.rendezvous();
  } catch (const std::exception& e) {
    // Not a communicator of one process, whose collectives would return their input: one of the
    // whole group that refuses every collective, saying why.
    auto broken = std::make_unique<detail::CommunicatorAccess::Impl>();
    broken->rank = s.env_.rank;
    broken->size = s.env_.world_size;
    broken->rank_prefix = s.rank_prefix();
    broken->broken_reason = detail::str("forming the group again (generation ",
                                        s.env_.restart_count, ") failed: ", e.what());
    s.communicator_ = detail::CommunicatorAccess::make(std::move(broken));
    throw;
  }
}

namespace {

// How often a rank that waits for the others to join says whom it waits for: first soon enough
// that a rank never started is named within seconds, then rarely enough not to flood the log.
constexpr auto kFirstJoinNotice = std::chrono::seconds(5);
constexpr auto kJoinNoticeInterval = std::chrono::seconds(30);

// Whole seconds, for messages.
long long seconds_of(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

}  // namespace

void ProcessState::Impl::rendezvous() {
  const std::string where = detail::str(env_.master_addr, ":", env_.master_port);
  const auto join_timeout = env_.join_timeout.value_or(kDefaultJoinTimeout);
  rendezvous_ = std::make_unique<Rendezvous>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env_.master_port);
  store_options.isServer = env_.rank == 0 && !env_.agent_hosts_store;
  store_options.waitWorkers = false;
  // Start-up is held to the join timeout, not the collective timeout: a loaded machine may take
  // longer to start every process than a collective may take (8 processes on 2 cores and a 1 s
  // collective timeout must still meet).
  store_options.timeout = join_timeout;
  try {
    rendezvous_->tcp_store = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, store_options);
  } catch (const std::exception& e) {
    throw Error(detail::str(
        rank_prefix(), "Could not ", store_options.isServer ? "host" : "reach",
        " the job's store at ", where, " within the join timeout of ", seconds_of(join_timeout),
        " s: ", e.what(), "\nLikely cause: ",
        store_options.isServer ? "the port is in use by another job"
                               : "the process hosting the store (rank 0 or the launcher) has not "
                                 "started, failed, or MASTER_ADDR/MASTER_PORT point elsewhere",
        ". Fix: check MASTER_ADDR and MASTER_PORT on every machine, pick a free port, and make "
        "sure a firewall does not block it."));
  }
  const std::string prefix = detail::str(env_.job_secret.empty() ? "" : env_.job_secret + "/",
                                         "accelerant/attempt_", env_.restart_count);
  rendezvous_->attempt_store =
      c10::make_intrusive<c10d::PrefixStore>(prefix, rendezvous_->tcp_store);
  auto& store = *rendezvous_->attempt_store;

  // Who we are, so that a peer whose collective fails can tell that this process died.
  detail::publish_process(store, env_.rank, env_.torchelastic_error_file);
  // Every rank must have been started with the same WORLD_SIZE: the first to come records its
  // own, and a rank told another one says so under "world_size_mismatch" for all to read. It still
  // arrives, so that a rank of the smaller world ends its wait at once and reads that instead of
  // waiting in Gloo for a rank that will never join ("Socket Timeout" and 19 frames).
  const std::string my_size = std::to_string(env_.world_size);
  const std::vector<uint8_t> first =
      store.compareSet("world_size", {}, std::vector<uint8_t>(my_size.begin(), my_size.end()));
  if (std::string(first.begin(), first.end()) != my_size) {
    const std::string mismatch = detail::str(
        "rank ", env_.rank, " was started with WORLD_SIZE=", env_.world_size,
        ", but a rank before it with WORLD_SIZE=", std::string(first.begin(), first.end()),
        ". Fix: start every rank with the same WORLD_SIZE (and MASTER_ADDR, MASTER_PORT).");
    store.set("world_size_mismatch", std::vector<uint8_t>(mismatch.begin(), mismatch.end()));
  }
  // Our own arrival step before Gloo's, so that a rank that never comes is named. Claimed with
  // this process's identity: a second process claiming the same rank (another job whose ranks use
  // the same MASTER_PORT and reached this job's store, or a rank started twice) is told so here,
  // instead of joining this job's Gloo group and failing in it with "Connection refused".
  const std::string me = detail::str("pid ", ::getpid(), " on ", host_name());
  const std::vector<uint8_t> claim(me.begin(), me.end());
  const std::vector<uint8_t> holder =
      store.compareSet(detail::str("arrived/", env_.rank), {}, claim);
  if (holder != claim) {
    throw Error(detail::str(
        rank_prefix(), "Rank ", env_.rank, " of the job whose store is at ", where,
        " has already joined, from another process (", std::string(holder.begin(), holder.end()),
        "). Likely cause: another job uses the same MASTER_ADDR and MASTER_PORT, and this rank "
        "reached that job's store; or this rank was started twice. Fix: give each job its own "
        "MASTER_PORT (a free port), and start each rank once."));
  }
  wait_for_arrivals(join_timeout, where);

  auto impl = std::make_unique<detail::CommunicatorAccess::Impl>();
  impl->store = rendezvous_->attempt_store;
  impl->rank = env_.rank;
  impl->size = env_.world_size;
  impl->timeout = timeout_;
  impl->debug = debug_;
  impl->rank_prefix = rank_prefix();
  impl->error_file = env_.error_file;
  // Every rank has arrived: Gloo's own connection (held to the collective timeout, which it also
  // uses for every collective) starts together on all of them.
  ignore_broken_pipes();
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout_);
  gloo_options->devices = gloo_devices(env_.master_addr);
  impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", rendezvous_->attempt_store), env_.rank,
      env_.world_size, gloo_options);
  // The collective timeout: it is also the timeout of every shared-memory collective.
  auto plan = detail::connect_shared_memory(rendezvous_->attempt_store, env_.rank, env_.world_size,
                                            timeout_, gloo_options->devices);
  impl->shm = std::move(plan.shm);
  impl->all_reduce_path = plan.description;
#ifdef USE_C10D_NCCL
  if (device_.is_cuda()) {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = timeout_;
    impl->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("nccl", rendezvous_->attempt_store), env_.rank,
        env_.world_size, nccl_options);
  }
#endif
  rendezvous_->tcp_store->setTimeout(timeout_);  // joined: later waits are collectives' waits
  if (timeout_ > detail::kWatchdogMinTimeout) {
    detail::CollectiveWatchdog::Setup watch;
    watch.connect = [host = env_.master_addr, port = store_options.port, prefix] {
      c10d::TCPStoreOptions options;
      options.port = port;
      options.isServer = false;
      options.waitWorkers = false;
      options.timeout = std::chrono::seconds(10);
      return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::PrefixStore>(
          prefix, c10::make_intrusive<c10d::TCPStore>(host, options)));
    };
    watch.flight = &impl->flight;
    watch.blocked = &impl->blocked;
    watch.issued = &impl->sequence;
    watch.rank = env_.rank;
    watch.size = env_.world_size;
    watch.collective_timeout = timeout_;
    watch.rank_prefix = rank_prefix();
    watch.error_file = env_.error_file;
    impl->watchdog = std::make_unique<detail::CollectiveWatchdog>(std::move(watch));
    rendezvous_->watchdog = impl->watchdog.get();
  }
  communicator_ = detail::CommunicatorAccess::make(std::move(impl));
}

void ProcessState::Impl::wait_for_arrivals(std::chrono::milliseconds join_timeout,
                                           const std::string& where) {
  auto& store = *rendezvous_->attempt_store;
  const auto refuse_mismatch = [&] {
    std::vector<uint8_t> text;
    try {
      if (!store.check({"world_size_mismatch"})) return;
      text = store.get("world_size_mismatch");
    } catch (const std::exception&) {
      return;  // the store is gone (its host ended): the caller says what it can
    }
    throw Error(rank_prefix() + std::string(text.begin(), text.end()));
  };
  std::vector<std::string> keys;
  for (int r = 0; r < env_.world_size; ++r) keys.push_back(detail::str("arrived/", r));
  const auto missing_ranks = [&] {
    std::vector<int> missing;
    for (int r = 0; r < env_.world_size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    return missing;
  };
  // Polled with check (one request, one answer), not a wait sliced into short timeouts: a wait
  // that times out leaves c10d's client out of step with the server.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_notice = start + kFirstJoinNotice;
  while (true) {
    try {
      if (store.check(keys)) break;
      refuse_mismatch();
      const auto now = Clock::now();
      if (now - start >= join_timeout) {
        const auto missing = missing_ranks();
        throw CollectiveError(
            detail::str(rank_prefix(), "Rendezvous at ", where, ": after the join timeout of ",
                        seconds_of(join_timeout), " s, rank(s) ", detail::join(missing, ", "),
                        " of ", env_.world_size,
                        " never arrived. Likely cause: those processes were not started, crashed "
                        "before initialising, or use another MASTER_ADDR/MASTER_PORT or "
                        "WORLD_SIZE. Fix: start every rank with the same MASTER_ADDR, MASTER_PORT "
                        "and WORLD_SIZE, and look at the missing ranks' output; a launcher's "
                        "--join_timeout (ACCELERANT_JOIN_TIMEOUT_MS) sets how long to wait."),
            missing);
      }
      if (now >= next_notice) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
        std::fprintf(stderr,
                     "%sWaiting for rank(s) %s of %d to join at %s (%lld s of the join timeout of "
                     "%lld s). If they were not started, start them with the same MASTER_ADDR, "
                     "MASTER_PORT and WORLD_SIZE.\n",
                     rank_prefix().c_str(), detail::join(missing_ranks(), ", ").c_str(),
                     env_.world_size, where.c_str(), seconds_of(waited), seconds_of(join_timeout));
        next_notice = now + kJoinNoticeInterval;
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      refuse_mismatch();
      // Not a timeout: the store went away while this rank waited ("Broken pipe").
      throw Error(detail::str(
          rank_prefix(), "The job's store at ", where, " went away while this rank waited for ",
          "the others of its ", env_.world_size, " ranks to arrive (", e.what(),
          "). Likely cause: ",
          "the process hosting it (rank 0, or the launcher) ended; its output says why. Fix: ",
          "look at rank 0's output, and start every rank with the same MASTER_ADDR, MASTER_PORT ",
          "and WORLD_SIZE."));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  refuse_mismatch();
}

void ProcessState::wait_for_everyone() { impl_->communicator_.barrier(); }

ProcessState& ProcessState::get() {
  std::lock_guard<std::mutex> lock(state_mutex());
  auto& slot = state_slot();
  if (!slot) slot.reset(new ProcessState(read_launch_contract(), ProcessStateOptions()));
  return *slot;
}

ProcessState& ProcessState::initialize(const ProcessStateOptions& options) {
  std::lock_guard<std::mutex> lock(state_mutex());
  auto& slot = state_slot();
  if (slot) {
    throw Error(
        "ProcessState::initialize was called after the process state already existed (an "
        "earlier initialize, or ProcessState::get(), which initialises with default options). "
        "Fix: call initialize once, before anything else uses the process state.");
  }
  slot.reset(new ProcessState(read_launch_contract(), options));
  return *slot;
}

bool ProcessState::initialized() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return state_slot() != nullptr;
}

void ProcessState::shutdown() {
  std::lock_guard<std::mutex> lock(state_mutex());
  auto& slot = state_slot();
  if (!slot) return;
  const ProcessState::Impl& state = *slot->impl_;
  if (state.rendezvous_) {
    // A store-side barrier rather than a Gloo one: after it, no rank still waits on bytes from
    // another, so closing the Gloo sockets cannot cut a transfer short.
    if (state.rendezvous_->watchdog) state.rendezvous_->watchdog->mark_ended();
    auto& store = *state.rendezvous_->attempt_store;
    if (store.add("finished", 1) == state.env_.world_size) {
      store.set("all_finished", std::vector<uint8_t>{1});
    }
    // Other ranks may legitimately still be working (uneven ends), so this waits longer than a
    // collective would; a rank that died is the launcher's to report.
    store.wait({"all_finished"}, std::max(state.timeout_, kDefaultCollectiveTimeout));
  }
  slot.reset();
}

namespace detail {
void forget_process_state_after_fork() {
  // The parent's mutex may have been held by another thread at fork time: replace it by leaking.
  new (&state_mutex()) std::mutex();
  (void)state_slot().release();  // leaked on purpose: its threads live only in the parent
}
}  // namespace detail

}  // namespace accelerant
