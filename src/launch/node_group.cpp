#include "launch/node_group.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

#include "accelerant/error.h"
#include "accelerant/version.h"
#include "base/text.h"
#include "base/torch_version.h"
#include "launch/agent.h"

namespace accelerant::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How long machine 0 tries to connect to its own store (a local connection takes microseconds).
constexpr std::chrono::milliseconds kReachOwnStore{10000};

std::string seconds(std::chrono::milliseconds d) { return str(d.count() / 1000.0, " s"); }

// A port free now, for rank 0's store (it binds it a moment later; c10d sets SO_REUSEADDR).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof a;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) ::close(fd);
  if (port == 0)
    throw LaunchError("accelerant::launch: found no free TCP port for the job's store");
  return port;
}

// 128 random bits as hex: the job's keys live under it, so a process that can reach the store but
// was not given the secret can neither read nor overwrite them (docs/security.md).
std::string random_secret() {
  unsigned char bits[16];
  size_t have = 0;
  while (have < sizeof bits) {
    const ssize_t got = ::getrandom(bits + have, sizeof bits - have, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw LaunchError(
          str("accelerant::launch: cannot draw the job's secret from the kernel's "
              "random source (getrandom: ",
              std::strerror(errno), ")"));
    }
    have += static_cast<size_t>(got);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string text;
  for (unsigned char b : bits) {
    text += kHex[b >> 4];
    text += kHex[b & 15];
  }
  return text;
}

// Why `host` (master_addr) does not resolve, with the fix; "" when it does, or when the
// failure may pass (EAI_AGAIN: no answer from the DNS server yet).
std::string resolve_failure(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc == 0) ::freeaddrinfo(found);
  if (rc == 0 || rc == EAI_AGAIN || rc == EAI_SYSTEM || rc == EAI_MEMORY) return "";
  return str("accelerant launch: master_addr '", host, "' does not resolve (", ::gai_strerror(rc),
             "). Likely cause: a typo, or a name this machine's DNS or /etc/hosts does not know "
             "(yet). Fix: pass machine 0's IP address, or a name that `getent hosts ",
             host, "` finds on every machine.");
}

// "0,2,3" (as machine 0 writes the members) as node ranks.
std::vector<int> node_list(const std::string& text) {
  std::vector<int> nodes;
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    nodes.push_back(std::stoi(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return nodes;
}

}  // namespace

NodeGroup::NodeGroup(const LaunchOptions& options) : options_(options) {
  // A job on one machine is private to it: the store listens on 127.0.0.1 only and every key
  // lives under a secret only the workers are told. On several machines the store must be
  // reachable from the network, and the machines share no secret: a trusted network is assumed,
  // as torchrun and NCCL assume (docs/security.md).
  if (!multi_node()) secret_ = random_secret();
  // Machine 0 names itself, which must resolve now: said at once, instead of after the collective
  // timeout (30 minutes) of retries blamed on a taken port. The others wait for machine 0 up to
  // the join timeout, as its name may resolve only once it runs (a Kubernetes service), then say
  // that the name did not resolve (join_as_other).
  if (options_.node_rank() == 0) {
    const std::string failure = resolve_failure(options_.master_addr());
    if (!failure.empty()) throw LaunchError(failure);
  }
  if (options_.node_rank() == 0) {
    join_as_main();
  } else {
    join_as_other();
  }
}

NodeGroup::~NodeGroup() {
  if (left_) return;
  try {
    leave(str("machine ", options_.node_rank(), "'s launcher stopped before its workers finished"));
  } catch (...) {
    // Leaving is a courtesy to the other machines; their links tell them anyway.
  }
}

int NodeGroup::store_port() const { return server_ ? server_->port() : port_; }

bool NodeGroup::generation_formed(int generation, int world_size) {
  if (!workers_use_launchers_store()) return false;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(worker_key(generation, str("arrived/", r)));
  try {
    return store_->check(keys);
  } catch (const std::exception&) {
    return false;
  }
}

std::string NodeGroup::in_place_refusal(int generation) {
  if (!workers_use_launchers_store()) return "";
  const std::string refusal = worker_key(generation, "in_place_refused");
  try {
    return store_->check({refusal}) ? store_->get(refusal) : "";
  } catch (const std::exception&) {
    return "";
  }
}

int NodeGroup::latest_generation(int known) {
  if (!workers_use_launchers_store()) return known;
  try {
    while (store_->check({key(str("generation_", known + 1))})) ++known;
  } catch (const std::exception&) {
    // Unreadable: the store's loss ends the attempt through poll().
  }
  return known;
}

bool NodeGroup::claim_generation(int generation) {
  // Without the launchers' store no worker is replaced in place: this launcher alone numbers.
  if (!workers_use_launchers_store()) return true;
  return store_->add(key(str("generation_", generation)), 1) == 1;
}

void NodeGroup::count_replacement(int count) {
  replacements_ += count;  // at once for this launcher; the others' news comes with check_store
  if (!workers_use_launchers_store()) return;
  try {
    replacements_ = static_cast<int>(store_->add(key("replacements"), count));
  } catch (const std::exception&) {
    // Machine 0's store is gone: the job ends (poll says why); the local count stands.
  }
}

std::string NodeGroup::worker_key(int generation, const std::string& name) const {
  // ProcessState::Impl::rendezvous's prefix for the generation.
  return str(secret_.empty() ? "" : secret_ + "/", "accelerant/attempt_", generation, "/", name);
}

std::string NodeGroup::attempt_key(int attempt, const std::string& name) const {
  return key(str("attempt_", attempt, "/", name));
}

std::string NodeGroup::key(const std::string& name) const {
  return (secret_.empty() ? "" : secret_ + "/") + "accelerant/launch/" + name;
}

std::string NodeGroup::workers_store_addr() const {
  return server_ && !multi_node() ? "127.0.0.1" : options_.master_addr();
}

void NodeGroup::join_as_main() {
  if (!workers_speak_agent_store_protocol()) {
    // Our server speaks LibTorch 1.x's TCPStore protocol (job_store.h); the workers' does not.
    // On one machine rank 0 hosts c10d's store, as under torchrun without its agent store.
    if (multi_node()) {
      throw LaunchError(str(
          "accelerant::launch: a job on several machines needs the launchers' store, which speaks "
          "the c10d TCPStore protocol of LibTorch 1.x, and this build's LibTorch is ",
          torch_version(),
          ". Fix: run one machine per launch, or start the workers with torchrun or srun."));
    }
    port_ = options_.master_port() != 0 ? options_.master_port() : free_port();
    return;
  }
  try {
    server_ = std::make_unique<StoreServer>(
        options_.master_port(), multi_node() ? StoreReach::kNetwork : StoreReach::kThisMachine);
  } catch (const std::exception& e) {
    throw LaunchError(str("accelerant::launch: machine 0 could not host the job's store on port ",
                          options_.master_port(), ": ", e.what(),
                          "\nLikely cause: the port is taken by another job. Fix: pick a free port "
                          "(and tell every machine the same one), or 0 on one machine."));
  }
  // The workers reach the store where workers_store_addr() says (master_addr on several
  // machines), so it must lead to this machine: a bounded try, as an address of another machine
  // may not answer at all.
  const auto reach = std::min(resolved_timeout(options_), kReachOwnStore);
  try {
    store_ = std::make_unique<StoreClient>(workers_store_addr(), server_->port(), reach,
                                           resolved_timeout(options_));
  } catch (const std::exception& e) {
    throw LaunchError(str(
        "accelerant launch: machine 0 cannot reach its own store at ", workers_store_addr(), ":",
        server_->port(), " within ", seconds(reach), ": ", e.what(),
        ". Likely cause: master_addr is not an address of this machine (machine 0 is the main "
        "machine). Fix: pass an address of this machine, as every machine must (127.0.0.1 on one "
        "machine)."));
  }
  if (!multi_node()) return;
  links_ = NodeLinks::listen({0, options_.num_nodes(), options_.processes_per_node()});
  store_->set(key("links_port"), std::to_string(links_.port()));
  const auto join_deadline = Clock::now() + options_.join_timeout();
  // Elastic: enough machines first, then the rest for up to rejoin_timeout.
  const int fewest = elastic() ? *options_.min_nodes() : options_.num_nodes();
  auto missing = links_.accept_nodes(join_deadline, fewest - 1);
  if (elastic() && options_.num_nodes() - static_cast<int>(missing.size()) >= fewest &&
      !missing.empty()) {
    missing =
        links_.accept_nodes(std::min(join_deadline, Clock::now() + options_.rejoin_timeout()));
    if (!missing.empty() && options_.verbose()) {
      std::fprintf(stderr,
                   "accelerant::launch: machine(s) %s of %d did not join within the rejoin "
                   "timeout of %s; the job starts with the %d there (at least %d).\n",
                   join(missing, ", ").c_str(), options_.num_nodes(),
                   seconds(options_.rejoin_timeout()).c_str(),
                   options_.num_nodes() - static_cast<int>(missing.size()), fewest);
    }
    return;
  }
  if (missing.empty()) return;
  const std::string why =
      str("machine(s) ", join(missing, ", "), " of ", options_.num_nodes(),
          elastic() ? str(" (at least ", fewest, " needed)") : std::string(),
          " did not join within the join "
          "timeout of ",
          seconds(options_.join_timeout()), " (machine 0 waits at ", options_.master_addr(), ":",
          store_port(),
          "). Likely cause: their launchers were not started, use another master_addr "
          "or master_port, or a firewall blocks the port. Fix: start `accelerant launch` on "
          "every "
          "machine with its --node_rank and the same --master_addr and --master_port, or "
          "raise --join_timeout.");
  leave(why);
  throw LaunchError("accelerant launch: " + why);
}

void NodeGroup::join_as_other() {
  port_ = options_.master_port();
  const auto deadline = Clock::now() + options_.join_timeout();
  const std::string where = str(options_.master_addr(), ":", options_.master_port());
  auto not_there = [&](const std::string& detail) {
    const std::string unresolved = resolve_failure(options_.master_addr());
    if (!unresolved.empty()) {
      return LaunchError(
          str(unresolved, " (Waited the join timeout of ", seconds(options_.join_timeout()), ".)"));
    }
    return LaunchError(str("accelerant launch: machine 0 (the main machine, at ", where,
                           ") did not answer within the join "
                           "timeout of ",
                           seconds(options_.join_timeout()), ": ", detail,
                           "\nLikely cause: its launcher was "
                           "not started, has stopped, or master_addr/master_port differ "
                           "from machine 0's. Fix: "
                           "start `accelerant launch --node_rank 0` on the main machine with "
                           "the same --master_addr "
                           "and --master_port, or raise --join_timeout."));
  };
  try {
    store_ = std::make_unique<StoreClient>(options_.master_addr(), options_.master_port(),
                                           options_.join_timeout(), options_.join_timeout());
    store_->wait(
        {key("links_port")},
        std::max(std::chrono::milliseconds(1),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
  } catch (const std::exception& e) {
    throw not_there(e.what());
  }
  store_->set_timeout(resolved_timeout(options_));
  const int port = std::stoi(store_->get(key("links_port")));
  links_ = NodeLinks::connect(
      options_.master_addr(), port,
      {options_.node_rank(), options_.num_nodes(), options_.processes_per_node()}, deadline);
}

NodeEvent NodeGroup::check_links(int attempt) {
  const auto lost = links_.lost();
  if (lost.empty()) return {};
  if (options_.node_rank() != 0) {
    return {
        NodeEvent::kAbort,
        str("the connection to machine 0's launcher (", options_.master_addr(),
            ") broke: it was "
            "stopped or killed, or its machine went down or became unreachable. Likely cause: see "
            "machine 0's output. Fix: restart the job on every machine (from the last "
            "checkpoint).")};
  }
  std::vector<std::string> reasons;
  for (int node : lost) {
    if (std::find(members_.begin(), members_.end(), node) == members_.end()) {
      // A launcher taken in to join the next attempt, gone before it: no worker of it runs.
      if (options_.verbose()) {
        std::fprintf(stderr,
                     "accelerant::launch: machine %d's launcher, which waited to join, left.\n",
                     node);
      }
      continue;
    }
    const std::string said = key(str("left/node_", node));
    if (store_->check({said})) {
      const std::string why = store_->get(said);
      if (why.empty()) continue;  // it left after the job was done
      reasons.push_back(str("machine ", node, " stopped: ", why));  // its own fix included
      continue;
    }
    const std::string reason =
        str("machine ", node,
            "'s launcher disconnected without a word: it was killed (SIGKILL, out of memory) or "
            "its machine went down or became unreachable.");
    // A launcher stopped on purpose said so above; one lost while the workers finish is not
    // replaced (the survivors are done with the group).
    const int generation =
        replace_lost_machine_ && !finishing_ ? replace_lost_machine_(attempt) : -1;
    if (generation >= 0) {
      // Its workers are replaced in place by the launcher that comes back (rejoin_running_attempt)
      // while the others' recover their step and wait for them (check_awaited).
      try {
        store_->set(attempt_key(attempt, str("rejoin/node_", node)), std::to_string(generation));
      } catch (const std::exception&) {
        // Our own store: it fails only as this machine goes down.
      }
      awaited_[node] = Clock::now() + options_.rejoin_timeout();
      if (options_.verbose()) {
        std::fprintf(stderr,
                     "accelerant::launch: %s Its workers are replaced in place (generation %d): "
                     "waiting up to the rejoin timeout of %s for a launcher with --node_rank %d; "
                     "the other machines' workers keep running.\n",
                     reason.c_str(), generation, seconds(options_.rejoin_timeout()).c_str(), node);
      }
      continue;
    }
    reasons.push_back(elastic() ? reason
                                : str(reason,
                                      " Its workers are gone, so the job cannot go on. Fix: find "
                                      "out on machine ",
                                      node,
                                      " what ended it, then restart the job on every machine "
                                      "(from the last checkpoint)."));
  }
  return lost_for_good(attempt, reasons);
}

NodeEvent NodeGroup::lost_for_good(int attempt, const std::vector<std::string>& reasons) {
  if (reasons.empty()) return {};
  const int left = 1 + static_cast<int>(links_.connected().size());
  if (elastic() && left >= *options_.min_nodes()) {
    // Elastic: the others restart too (check_store), and the next attempt goes on without it.
    const std::string text =
        str(join(reasons, "\n"), "\nUnder elastic membership (", *options_.min_nodes(), ":",
            options_.num_nodes(),
            " machines) the job goes on while max_restarts allows: the group "
            "restarts on the ",
            left, " machine(s) left, after waiting up to the rejoin timeout of ",
            seconds(options_.rejoin_timeout()), " for missing ones, from the last checkpoint.");
    // Before the go, start_attempt chooses the members again; the others hear nothing.
    if (running_) {
      try {
        store_->set(attempt_key(attempt, "lost"), text);
      } catch (const std::exception&) {
        // Our own store: it fails only as this machine goes down.
      }
    }
    return {NodeEvent::kRestart, text};
  }
  if (!elastic()) return {NodeEvent::kAbort, join(reasons, "\n")};  // each says its fix
  std::vector<int> there{0};
  for (int node : links_.connected()) there.push_back(node);
  std::sort(there.begin(), there.end());
  return {NodeEvent::kAbort, str(join(reasons, "\n"), "\n", too_few_machines(there, " now"))};
}

bool NodeGroup::accept_launchers(Clock::time_point deadline) {
  try {
    links_.accept_nodes(deadline);
    return true;
  } catch (const LaunchError& e) {
    // A launcher started for another job shape was refused (it says why); this job goes on.
    if (options_.verbose()) std::fprintf(stderr, "accelerant::launch: %s\n", e.what());
    return false;
  }
}

NodeEvent NodeGroup::check_awaited(int attempt) {
  if (awaited_.empty()) return {};
  accept_launchers(Clock::now());  // without waiting: a launcher already knocking
  const auto connected = links_.connected();
  std::vector<std::string> reasons;
  for (auto it = awaited_.begin(); it != awaited_.end();) {
    const int node = it->first;
    if (std::find(connected.begin(), connected.end(), node) != connected.end()) {
      if (options_.verbose()) {
        std::fprintf(stderr,
                     "accelerant::launch: machine %d's launcher is back; its workers join the "
                     "running group.\n",
                     node);
      }
      it = awaited_.erase(it);
    } else if (Clock::now() >= it->second) {
      count_replacement(-1);  // not replaced after all: the loss is counted as what follows
      reasons.push_back(str("machine ", node,
                            "'s launcher was lost and none came back with --node_rank ", node,
                            " within the rejoin timeout of ", seconds(options_.rejoin_timeout()),
                            " to replace its workers.",
                            elastic() ? ""
                                      : " The job cannot go on without them. Fix: restart the "
                                        "job on every machine (from the last checkpoint), or "
                                        "raise --rejoin_timeout."));
      it = awaited_.erase(it);
    } else {
      ++it;
    }
  }
  return lost_for_good(attempt, reasons);
}

std::optional<int> NodeGroup::rejoin_running_attempt() {
  if (!multi_node() || options_.node_rank() == 0) return std::nullopt;
  try {
    if (!store_->check({key("running_attempt")})) return std::nullopt;
    const int attempt = std::stoi(store_->get(key("running_attempt")));
    if (attempt < 0) return std::nullopt;  // between attempts
    const std::string rejoin = attempt_key(attempt, str("rejoin/node_", options_.node_rank()));
    if (!store_->check({rejoin})) return std::nullopt;
    generation_ = std::stoi(store_->get(rejoin));
    members_ = node_list(store_->get(attempt_key(attempt, "members")));
    return attempt;
  } catch (const std::exception&) {
    return std::nullopt;  // the lost store is phrased by start_attempt
  }
}

NodeEvent NodeGroup::check_store(int attempt) {
  try {
    if (store_->check({key("abort")})) {
      return {NodeEvent::kAbort, "machine 0 ended the job: " + store_->get(key("abort"))};
    }
    refresh_counts();
    if (elastic()) {
      const std::string lost = attempt_key(attempt, "lost");
      if (store_->check({lost})) return {NodeEvent::kRestart, store_->get(lost)};
      const std::string regroup = attempt_key(attempt, "regroup");
      if (store_->check({regroup})) return {NodeEvent::kRegroup, store_->get(regroup)};
    }
    const std::string failures = attempt_key(attempt, "failures");
    if (store_->add(failures, 0) == 0) return {};
    std::vector<std::string> reports;
    for (int node = 0; node < options_.num_nodes(); ++node) {
      const std::string report = attempt_key(attempt, str("failure/node_", node));
      if (node != options_.node_rank() && store_->check({report})) {
        reports.push_back(str("machine ", node, " reported: ", store_->get(report)));
      }
    }
    if (reports.empty()) return {};  // only our own failure
    return {NodeEvent::kRestart, "a worker on another machine failed; " + join(reports, "\n")};
  } catch (const std::exception& e) {
    return lost_store(e.what());
  }
}

NodeEvent NodeGroup::lost_store(const std::string& detail) const {
  return {NodeEvent::kAbort,
          str("lost the job's store on machine 0 (", options_.master_addr(), ":",
              options_.master_port(), "): ", detail,
              ". Likely cause: machine 0's launcher stopped or its machine went down. "
              "Fix: restart the job on every machine (from the last checkpoint).")};
}

NodeEvent NodeGroup::store_failed(int attempt) {
  NodeEvent event = check_store(attempt);  // phrases the lost store, or what machine 0 said
  if (event.kind != NodeEvent::kNone) return event;
  return lost_store("a call to it failed");
}

NodeEvent NodeGroup::poll(int attempt) {
  if (!multi_node()) return {};
  if (options_.node_rank() != 0) {
    // Without machine 0 there is no store to ask (and asking a vanished machine would block).
    NodeEvent event = check_links(attempt);
    return event.kind != NodeEvent::kNone ? event : check_store(attempt);
  }
  // A failure another machine published is more telling than the disconnect that follows it.
  NodeEvent event = check_store(attempt);
  if (event.kind == NodeEvent::kNone) event = check_links(attempt);
  // Launchers are taken in while the attempt runs (before its go, by choose_members): one taken in
  // earlier would read the attempt being started, not the next.
  if (event.kind == NodeEvent::kNone && running_) event = check_awaited(attempt);
  if (event.kind == NodeEvent::kNone && running_ && machines_may_join())
    event = take_arrivals(attempt);
  return event;
}

void NodeGroup::report_failure(int attempt, const std::string& report) {
  if (!multi_node()) return;
  try {
    // The report before the count, so that whoever sees the count finds the report.
    store_->set(attempt_key(attempt, str("failure/node_", options_.node_rank())), report);
    store_->add(attempt_key(attempt, "failures"), 1);
  } catch (const std::exception&) {
    // Machine 0 is gone; the others learn it from their own links.
  }
}

bool NodeGroup::elastic() const {
  return multi_node() && options_.min_nodes() && *options_.min_nodes() < options_.num_nodes();
}

int NodeGroup::first_attempt() {
  if (!elastic() || options_.node_rank() == 0) return 0;
  // Machine 0 records the attempt it forms before it takes launchers in (choose_members), and the
  // next one once it started an attempt (take_arrivals takes them in while it runs): a launcher
  // accepted now joins that attempt.
  try {
    return store_->check({key("attempt")}) ? std::stoi(store_->get(key("attempt"))) : 0;
  } catch (const std::exception&) {
    return 0;  // the lost store is phrased by start_attempt
  }
}

bool NodeGroup::machines_may_join() const {
  return elastic() && static_cast<int>(members_.size()) < options_.num_nodes();
}

void NodeGroup::refresh_counts() {
  // Read along with the news (check_store), so that counting never waits on a store whose
  // machine vanished: only the link checks, which come first, notice that within seconds.
  if (options_.recovery() == Recovery::kReplaceFailedWorker && workers_use_launchers_store())
    replacements_ = static_cast<int>(store_->add(key("replacements"), 0));
  if (elastic()) free_restarts_ = static_cast<int>(store_->add(key("free_restarts"), 0));
}

NodeEvent NodeGroup::take_arrivals(int attempt) {
  const int processes = static_cast<int>(members_.size()) * options_.processes_per_node();
  try {
    // The workers' generation now: a worker replaced in place since the go moved them on.
    generation_ = latest_generation(generation_);
    if (arrival_.empty()) {
      if (!accept_launchers(Clock::now())) return {};  // without waiting: one already knocking
      std::vector<int> arrived;
      for (int node : links_.connected()) {
        if (std::find(members_.begin(), members_.end(), node) == members_.end())
          arrived.push_back(node);
      }
      if (arrived.empty()) return {};
      arrival_ = str("machine(s) ", join(arrived, ", "), " arrived");
      // The workers of this generation read it at their next batch (membership_watch.cpp).
      store_->set(worker_key(generation_, "membership_change"), arrival_);
      if (options_.verbose()) {
        std::fprintf(stderr,
                     "accelerant::launch: %s; the workers stop at their next step boundary and "
                     "save a checkpoint, then the group restarts with it from there.\n",
                     arrival_.c_str());
      }
      return {};
    }
    std::vector<std::string> parked;
    for (int r = 0; r < processes; ++r)
      parked.push_back(worker_key(generation_, str("parked/", r)));
    if (!store_->check(parked)) return {};
    const std::string text =
        str(arrival_,
            ": every worker saved a checkpoint at the same step boundary, so the group "
            "restarts with it from there (not counted as a restart).");
    free_restarts_ =
        static_cast<int>(store_->add(key("free_restarts"), 1));  // before the news: read with it
    store_->set(attempt_key(attempt, "regroup"), text);
    return {NodeEvent::kRegroup, text};
  } catch (const std::exception&) {
    return {};  // our own store: it fails only as this machine goes down
  }
}

int NodeGroup::member_index() const {
  const auto it = std::find(members_.begin(), members_.end(), options_.node_rank());
  return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

std::string NodeGroup::choose_members(int attempt, const std::function<bool()>& interrupted) {
  for (int node : links_.lost()) {  // a machine lost since the last look is not a member
    if (options_.verbose()) {
      std::fprintf(stderr,
                   "accelerant::launch: machine %d's launcher left before attempt %d, which "
                   "goes on without it.\n",
                   node, attempt + 1);
    }
  }
  std::vector<int> connected = links_.connected();
  if (attempt > 0 && static_cast<int>(connected.size()) < options_.num_nodes() - 1) {
    if (options_.verbose()) {
      std::fprintf(stderr,
                   "accelerant::launch: %d of %d machines are there; waiting up to the rejoin "
                   "timeout of %s for the others.\n",
                   1 + static_cast<int>(connected.size()), options_.num_nodes(),
                   seconds(options_.rejoin_timeout()).c_str());
    }
    const auto deadline = Clock::now() + options_.rejoin_timeout();
    while (Clock::now() < deadline && !interrupted() &&
           static_cast<int>(links_.connected().size()) < options_.num_nodes() - 1) {
      accept_launchers(std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
    }
    links_.lost();  // one lost while waiting is not a member
    connected = links_.connected();
  }
  members_ = {0};
  members_.insert(members_.end(), connected.begin(), connected.end());
  std::sort(members_.begin(), members_.end());
  if (static_cast<int>(members_.size()) < *options_.min_nodes()) {
    return too_few_machines(members_,
                            " after the rejoin timeout of " + seconds(options_.rejoin_timeout()));
  }
  return "";
}

std::string NodeGroup::too_few_machines(const std::vector<int>& there,
                                        const std::string& when) const {
  return str("only ", there.size(), " machine(s) (", join(there, ", "), ") of the at least ",
             *options_.min_nodes(), " the job needs (--num_nodes ", *options_.min_nodes(), ":",
             options_.num_nodes(), ") are there", when,
             ". Fix: bring the lost machines back (start `accelerant launch` with their "
             "--node_rank), then restart the job from the last checkpoint.");
}

NodeEvent NodeGroup::start_attempt(int attempt, int proposed_generation,
                                   const std::function<bool()>& interrupted) {
  generation_ = proposed_generation;
  arrival_.clear();
  running_ = false;
  finishing_ = false;
  if (!awaited_.empty()) {
    // The group restarts while machine 0 waits for a lost machine's launcher: a launcher that
    // comes back now could join only a running group, which there is not. Its workers were not
    // replaced after all (the restart counts instead); an elastic job goes on without it.
    std::vector<std::string> reasons;
    for (const auto& [node, deadline] : awaited_) {
      count_replacement(-1);
      reasons.push_back(str("machine ", node,
                            " was lost and the group restarted before a launcher came back for "
                            "it. Fix: restart the job on every machine (from the last "
                            "checkpoint)."));
    }
    awaited_.clear();
    if (!elastic()) return {NodeEvent::kAbort, join(reasons, "\n")};
  }
  members_.clear();
  for (int node = 0; node < options_.num_nodes(); ++node) members_.push_back(node);
  if (options_.node_rank() == 0 && multi_node()) {
    try {
      store_->set(key("running_attempt"), "-1");  // none runs until the go
    } catch (const std::exception&) {
      return store_failed(attempt);
    }
  }
  if (options_.node_rank() == 0) {
    // Claimed like a replacement's, so that a machine replacing a worker for the same generation
    // meanwhile (before it heard of the failure behind this restart) does not share it.
    try {
      while (!claim_generation(generation_)) ++generation_;
    } catch (const std::exception&) {
      return store_failed(attempt);
    }
  }
  if (!multi_node()) return {NodeEvent::kGo, ""};
  const std::string go = attempt_key(attempt, "go");
  const std::string chosen = attempt_key(attempt, "members");
  const std::string generation = attempt_key(attempt, "generation");
  if (elastic() && options_.node_rank() == 0) {
    try {
      store_->set(key("attempt"), std::to_string(attempt));
    } catch (const std::exception&) {
      return store_failed(attempt);
    }
    const std::string too_few = choose_members(attempt, interrupted);
    if (!too_few.empty()) return {NodeEvent::kAbort, too_few};
  }
  std::vector<std::string> joined;
  const auto list_joined = [&] {
    joined.clear();
    for (int node : members_) joined.push_back(attempt_key(attempt, str("joined/node_", node)));
  };
  list_joined();
  // Machine 0 gives up first, so that the others hear its verdict naming the missing machines.
  // Under elastic membership the others wait as long as machine 0 is there: one that arrived
  // while a group runs waits for that group's restart, however long it runs.
  const auto deadline =
      elastic() && options_.node_rank() != 0
          ? Clock::time_point::max()
          : Clock::now() + options_.join_timeout() +
                (options_.node_rank() == 0 ? std::chrono::seconds(0) : std::chrono::seconds(10));
  try {
    store_->set(attempt_key(attempt, str("joined/node_", options_.node_rank())), "1");
  } catch (const std::exception&) {
    return store_failed(attempt);
  }
  while (true) {
    if (interrupted()) return {NodeEvent::kInterrupted, ""};
    NodeEvent event = poll(attempt);
    if (event.kind == NodeEvent::kAbort) return event;
    if (event.kind == NodeEvent::kRestart && elastic() && options_.node_rank() == 0) {
      // A chosen machine was lost before the go: choose again among those there.
      const std::string too_few = choose_members(attempt, interrupted);
      if (!too_few.empty()) return {NodeEvent::kAbort, too_few};
      list_joined();
    }
    try {
      if (elastic() && options_.node_rank() != 0 && store_->check({key("done")})) {
        return {NodeEvent::kDone,
                "the job finished on the other machines before this one "
                "could join it"};
      }
      if (options_.node_rank() == 0 && store_->check(joined)) {
        store_->set(chosen, join(members_, ","));
        store_->set(generation, std::to_string(generation_));
        store_->set(go, "1");
        store_->set(key("running_attempt"), std::to_string(attempt));
        running_ = true;
        // A launcher that arrives while this attempt runs joins the next one.
        if (elastic()) store_->set(key("attempt"), std::to_string(attempt + 1));
        return {NodeEvent::kGo, ""};
      }
      if (options_.node_rank() != 0 && store_->check({go})) {
        members_ = node_list(store_->get(chosen));
        generation_ = std::stoi(store_->get(generation));
        if (member_index() < 0) {
          return {NodeEvent::kAbort,
                  str("machine 0 started attempt ", attempt + 1, " with machines ",
                      join(members_, ", "), ", without this one (", options_.node_rank(),
                      "), which it had taken in. Fix: restart this machine's launcher.")};
        }
        return {NodeEvent::kGo, ""};
      }
    } catch (const std::exception&) {
      return store_failed(attempt);
    }
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (size_t i = 0; i < members_.size(); ++i) {
        if (!store_->check({joined[i]})) missing.push_back(members_[i]);
      }
      return {
          NodeEvent::kAbort,
          str("machine(s) ", join(missing, ", "), " did not get ready for attempt ", attempt + 1,
              " within the join timeout of ", seconds(options_.join_timeout()),
              ". Likely cause: their workers do not stop (stuck in uninterruptible I/O). Fix: look "
              "at those machines, or raise --join_timeout.")};
    }
    std::this_thread::sleep_for(
        std::min(options_.monitor_interval(), std::chrono::milliseconds(100)));
  }
}

NodeEvent NodeGroup::finish(int attempt, const std::function<bool()>& interrupted) {
  if (!multi_node()) return {NodeEvent::kDone, ""};
  const std::string succeeded = attempt_key(attempt, "succeeded");
  const std::string done = attempt_key(attempt, "done");
  finishing_ = true;
  try {
    store_->add(succeeded, 1);
  } catch (const std::exception&) {
    return store_failed(attempt);
  }
  // No deadline: another machine's workers may rightly run much longer; the links tell if it dies.
  while (true) {
    if (interrupted()) return {NodeEvent::kInterrupted, ""};
    NodeEvent event = poll(attempt);
    if (event.kind != NodeEvent::kNone) return event;
    try {
      if (options_.node_rank() == 0 &&
          store_->add(succeeded, 0) >= static_cast<int64_t>(members_.size())) {
        store_->set(done, "1");
        return {NodeEvent::kDone, ""};
      }
      if (options_.node_rank() != 0 && store_->check({done})) {
        return {NodeEvent::kDone, ""};
      }
    } catch (const std::exception&) {
      return store_failed(attempt);
    }
    std::this_thread::sleep_for(
        std::min(options_.monitor_interval(), std::chrono::milliseconds(100)));
  }
}

void NodeGroup::leave(const std::string& reason) {
  if (left_) return;
  left_ = true;
  if (!multi_node()) return;
  try {
    if (options_.node_rank() == 0) {
      if (!reason.empty()) store_->set(key("abort"), reason);
      // A launcher waiting to join the next attempt (elastic) hears that there is none.
      if (reason.empty()) store_->set(key("done"), "1");
      // Machine 0 hosts the store: the others must read the verdict before it goes away.
      wait_for_others_to_disconnect(options_.stop_grace_period() + std::chrono::seconds(10));
    } else if (!links_.connected().empty()) {
      // set, then a round trip: the reason is in the store before machine 0 sees the link close.
      store_->set(key(str("left/node_", options_.node_rank())), reason);
      store_->check({key(str("left/node_", options_.node_rank()))});
    }
  } catch (const std::exception&) {
    // Machine 0 is gone; nobody is left to tell.
  }
  links_.close_all();
}

void NodeGroup::wait_for_others_to_disconnect(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!links_.connected().empty() && Clock::now() < deadline) {
    links_.lost();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace accelerant::detail
