// The launchers of one job, seen from one of them. Node 0's launcher hosts the job's store (where
// the workers meet too); every launcher keeps a NodeLinks connection to node 0 for liveness; and
// through the store they
//   - join: node 0 waits up to join_timeout for every machine, each side naming who is missing;
//   - start each attempt together (a barrier, so no machine runs attempt n+1 beside attempt n);
//   - tell each other of a worker failure, so that every machine restarts its group;
//   - finish together: a machine whose group succeeded waits until every machine's has, since a
//     late failure elsewhere still restarts everyone; node 0 leaves last, as it hosts the store;
//   - leave: a launcher that stops for good says why before closing its link, so the others stop
//     with that reason; a launcher that dies without a word is named as lost.
// A lost machine ends the job on every machine whatever max_restarts says: its workers are gone
// and a group cannot be formed without them. Under elastic membership (LaunchOptions::min_nodes)
// machine 0 instead tells the others to restart (a restart), waits up to rejoin_timeout for
// missing machines at the next attempt, and starts it with the machines there (members()); a
// launcher that arrives while an attempt runs is taken in (take_arrivals), the workers stop at a
// step boundary, and the next attempt includes it. Under Recovery::kReplaceFailedWorker a lost
// machine's workers are replaced in place instead when its launcher comes back
// (on_lost_machine). Machine 0 itself, which hosts the store, cannot be lost. On one machine all
// of this reduces to the store.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "accelerant/launch_options.h"
#include "launch/job_store.h"
#include "launch/node_links.h"

namespace accelerant::detail {

/// What the other machines' launchers said.
struct NodeEvent {
  enum Kind {
    kNone,         ///< nothing new
    kGo,           ///< every machine is ready for the attempt
    kRestart,      ///< a worker failed on another machine, or one was lost (elastic): restart
    kRegroup,      ///< a machine arrived and the workers saved a checkpoint: restart with it
    kAbort,        ///< the job ends on every machine (text says why)
    kDone,         ///< every machine's group succeeded
    kInterrupted,  ///< this launcher caught a signal while waiting
  };
  Kind kind = kNone;
  std::string text;
};

class NodeGroup {
 public:
  /// Hosts (node 0) or reaches the job's store, and on several machines connects the launchers.
  /// Throws LaunchError when a machine does not arrive within options.join_timeout, naming it.
  explicit NodeGroup(const LaunchOptions& options);
  /// Leaves (without a reason) if leave() was not called.
  ~NodeGroup();
  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  /// The store's port (the one chosen when master_port is 0).
  int store_port() const;
  /// Whether this launcher hosts the store the workers use (ACCELERANT_AGENT_STORE); else rank 0
  /// hosts c10d's own (a LibTorch whose TCPStore protocol our server does not speak).
  bool hosts_workers_store() const { return server_ != nullptr; }

  /// Where this machine's workers reach the store (MASTER_ADDR): 127.0.0.1 for a job on one
  /// machine, whose store listens there only; otherwise options.master_addr.
  std::string workers_store_addr() const;
  /// The secret the job's keys live under (ACCELERANT_JOB_SECRET); empty on several machines.
  const std::string& job_secret() const { return secret_; }
  /// Whether every one of `world_size` workers has joined generation `generation` of the group
  /// (ProcessState's rendezvous claims one key per rank); false when the workers' store is not
  /// the launchers' (rank 0 hosts it), or it cannot be read.
  bool generation_formed(int generation, int world_size);
  /// Why the workers of `generation` said a failed worker cannot be replaced in place (the
  /// Accelerator under ZeRO, whose shards have one copy each), or "" when none did.
  std::string in_place_refusal(int generation);
  /// `known`, or the newest generation claimed after it (claim_generation) without a gap: a
  /// worker replaced on another machine moves the group to a generation this launcher did not
  /// start itself.
  int latest_generation(int known);
  /// Claims `generation` for a replacement on this machine (or, on machine 0, for the attempt
  /// start_attempt starts): false when a machine claimed it first (two failures on two machines
  /// at once, which the group cannot both replace).
  bool claim_generation(int generation);
  /// Counts `count` replacements in place (a worker, or a lost machine's workers; -1 takes one
  /// back), on any machine: every launcher's max_restarts counts them (replacements()).
  void count_replacement(int count = 1);
  /// The replacements counted by every machine's launcher, as last read with the other machines'
  /// news (poll) or counted here, without waiting on the store.
  int replacements() const { return replacements_; }

  /// Under elastic membership: min_nodes below num_nodes on several machines.
  bool elastic() const;
  /// The attempt to start with: 0, or for a launcher that joined a running elastic job, the one
  /// machine 0 is forming.
  int first_attempt();
  /// Waits until every machine is ready to start `attempt` (under elastic membership, after
  /// waiting up to rejoin_timeout for missing ones, every machine there): kGo, kAbort or
  /// kInterrupted; kDone for a launcher that waited to join an elastic job that finished. With kGo,
  /// members() and generation() are those of the attempt, generation() machine 0's
  /// `proposed_generation`.
  NodeEvent start_attempt(int attempt, int proposed_generation,
                          const std::function<bool()>& interrupted);
  /// The machines (node ranks, ascending) of the attempt start_attempt started.
  const std::vector<int>& members() const { return members_; }
  /// This machine's index among members(): its node rank for the workers.
  int member_index() const;
  /// The workers' generation for the attempt start_attempt started.
  int generation() const { return generation_; }
  /// Under elastic membership, whether the attempt runs on fewer machines than num_nodes, so that
  /// one may arrive (machine 0 takes it in while polling, and the workers, told through the store,
  /// stop at a step boundary after a checkpoint: then poll says kRegroup).
  bool machines_may_join() const;
  /// The restarts that were membership changes (kRegroup), which max_restarts does not count, as
  /// last read with the other machines' news (poll), without waiting on the store.
  int free_restarts() const { return free_restarts_; }
  /// Machine 0: asked, with the attempt, when a machine's launcher is lost while its group runs,
  /// whether that machine's workers are replaced in place (Recovery::kReplaceFailedWorker): the
  /// generation they join as, which the answer claimed, or -1 for no (the loss then ends or,
  /// elastic, restarts the group). Replaced in place, machine 0 waits up to rejoin_timeout for a
  /// launcher with its node_rank (check_awaited) while the others' workers go on. Default: -1.
  void on_lost_machine(std::function<int(int attempt)> replace) {
    replace_lost_machine_ = std::move(replace);
  }
  /// A launcher that came back for a lost machine whose workers are replaced in place: the
  /// running attempt it joins (members() and generation() then set), without start_attempt;
  /// std::nullopt otherwise.
  std::optional<int> rejoin_running_attempt();
  /// Without waiting for anything (reading a knocking launcher's hello takes at most 5 s): kNone,
  /// kRestart (a failure elsewhere in `attempt`, or an elastic loss), kRegroup (a machine arrived
  /// and the workers stopped for it) or kAbort.
  NodeEvent poll(int attempt);
  /// Tells the other machines that a worker here failed in `attempt`.
  void report_failure(int attempt, const std::string& report);
  /// After this machine's group succeeded in `attempt`: waits for kDone, kRestart, kRegroup,
  /// kAbort or kInterrupted.
  NodeEvent finish(int attempt, const std::function<bool()>& interrupted);
  /// This launcher is leaving: after kDone `reason` is empty, otherwise it says why, and the other
  /// machines stop with it. Node 0 waits (bounded) until the others have disconnected.
  void leave(const std::string& reason);

 private:
  bool multi_node() const { return options_.num_nodes() > 1; }
  // Whether the workers meet in the launchers' store (on machine 0), which this launcher reads.
  bool workers_use_launchers_store() const { return store_ && (server_ || multi_node()); }
  std::string key(const std::string& name) const;
  // A launcher key of attempt `attempt` (joined, go, members, failures, lost, ...).
  std::string attempt_key(int attempt, const std::string& name) const;
  // Machine 0: accepts knocking launchers until `deadline` (not waiting when it is now); false
  // when one started for another job shape was refused (said with verbose).
  bool accept_launchers(std::chrono::steady_clock::time_point deadline);
  // Elastic: why the job cannot go on with the machines `there` (fewer than min_nodes), `when`
  // completing "are there", with the fix.
  std::string too_few_machines(const std::vector<int>& there, const std::string& when) const;
  // The abort for a store that no longer answers, `detail` saying how.
  NodeEvent lost_store(const std::string& detail) const;
  // A key of generation `generation`'s workers (ProcessState's rendezvous prefix).
  std::string worker_key(int generation, const std::string& name) const;
  void join_as_main();
  void join_as_other();
  NodeEvent check_store(int attempt);
  // After a store call failed: what check_store says, else an abort naming the store.
  NodeEvent store_failed(int attempt);
  // Reads replacements_ and free_restarts_ from the store (check_store, which catches).
  void refresh_counts();
  NodeEvent check_links(int attempt);
  // Machine 0 under elastic membership: waits up to rejoin_timeout for missing machines, then
  // chooses the attempt's members; "" or why the job cannot go on (fewer than min_nodes).
  std::string choose_members(int attempt, const std::function<bool()>& interrupted);
  // Machine 0 while machines_may_join(): takes in a launcher that arrived and tells the workers;
  // kRegroup once every worker has saved and stopped.
  NodeEvent take_arrivals(int attempt);
  // Machine 0: lost machines whose launchers it waits for (on_lost_machine), until they connect
  // or their deadline passes (then lost_for_good).
  NodeEvent check_awaited(int attempt);
  // Machine 0: machines lost for good, `reasons` saying how: an elastic restart on the machines
  // left, or the end of the job; kNone without reasons.
  NodeEvent lost_for_good(int attempt, const std::vector<std::string>& reasons);
  void wait_for_others_to_disconnect(std::chrono::milliseconds limit);

  const LaunchOptions& options_;
  std::unique_ptr<StoreServer> server_;  // on machine 0
  std::unique_ptr<StoreClient> store_;
  NodeLinks links_;
  int port_ = 0;        // without server_: the port rank 0's store will use
  std::string secret_;  // see job_secret()
  bool left_ = false;
  std::vector<int> members_;  // see members()
  int generation_ = 0;        // see generation()
  std::string arrival_;       // machine 0: which machines arrived in this attempt ("" none)
  bool running_ = false;      // machine 0: the attempt's go was given (arrivals taken from then)
  bool finishing_ = false;    // this machine's workers are done (finish): no replacement now
  int replacements_ = 0;      // see replacements()
  int free_restarts_ = 0;     // see free_restarts()
  std::function<int(int)> replace_lost_machine_;                  // see on_lost_machine()
  std::map<int, std::chrono::steady_clock::time_point> awaited_;  // lost node -> deadline
};

}  // namespace accelerant::detail
