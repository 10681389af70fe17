#include "comm/shared_memory_connect.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "base/text.h"
#include "comm/machine_identity.h"
#include "comm/reduce_op.h"
#include "comm/store_exchange.h"

namespace accelerant::detail {

SharedMemoryConnection connect_shared_memory(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout,
    const std::vector<std::shared_ptr<gloo::transport::Device>>& gloo_devices) {
  SharedMemoryConnection plan;
  const bool enabled = shm_all_reduce_enabled();
  const auto machines = exchange_strings(
      *store, "machine/", rank, size, str(enabled ? "on|" : "off|", machine_identity()), timeout);
  for (int r = 0; r < size; ++r) {
    if (machines[r].rfind("on|", 0) != 0) {
      plan.description = str("Gloo (ACCELERANT_SHM_ALLREDUCE=0 on rank ", r, ")");
      return plan;
    }
  }
  // Nodes in order of their first rank; ranks of a node in rank order.
  std::vector<std::vector<int>> nodes;
  std::map<std::string, size_t> node_of_machine;
  for (int r = 0; r < size; ++r) {
    auto [it, fresh] = node_of_machine.emplace(machines[r], nodes.size());
    if (fresh) nodes.emplace_back();
    nodes[it->second].push_back(r);
  }
  size_t largest = 0;
  std::vector<std::string> counts;
  for (const auto& node : nodes) {
    largest = std::max(largest, node.size());
    counts.push_back(std::to_string(node.size()));
  }
  if (largest < 2) {
    plan.description = "Gloo (one rank per machine)";
    return plan;
  }
  const bool hierarchical = nodes.size() > 1;
  const size_t node = node_of_machine.at(machines[rank]);
  const auto& members = nodes[node];
  const int local_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());

  auto node_store = c10::make_intrusive<c10d::PrefixStore>(str("shm/node", node), store);
  std::string why_not;
  auto shm = ShmAllReduce::connect(*node_store, local_rank, static_cast<int>(members.size()),
                                   timeout, &why_not, hierarchical, members);
  // Every node must have its segment, or every rank takes Gloo: the paths must not mix.
  const std::string failures = failures_of(
      exchange_strings(*store, "shm/outcome/", rank, size, shm ? "ok" : why_not, timeout));
  if (!failures.empty()) {
    if (rank == 0) {
      std::fprintf(
          stderr,
          "accelerant: all-reduce through Gloo: the shared-memory path is unavailable (%s)\n",
          failures.c_str());
    }
    plan.description = "Gloo (shared memory unavailable)";
    return plan;
  }
  if (hierarchical && local_rank == 0) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices = gloo_devices;
    c10::intrusive_ptr<CommBackend> leaders = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("leaders_gloo", store), static_cast<int>(node),
        static_cast<int>(nodes.size()), options);
    shm->set_cross_node([leaders](const torch::Tensor& tensor, ReduceOp op) {
      c10d::AllreduceOptions opts;
      opts.reduceOp = to_c10d(op);
      std::vector<torch::Tensor> tensors{tensor};
      leaders->allreduce(tensors, opts)->wait();
    });
  }
  plan.shm = std::move(shm);
  plan.description = hierarchical
                         ? str("hierarchical: shared memory in each of ", nodes.size(), " nodes (",
                               join(counts, "+"), " ranks), Gloo between the node leaders")
                         : str("shared memory (", size, " ranks)");
  return plan;
}

}  // namespace accelerant::detail
