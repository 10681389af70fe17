// Connects the ranks that share a machine through shared memory after the rendezvous. The
// all-reduce path a job takes is decided alike by every rank:
//   - every rank on one machine: one shared-memory segment among all of them;
//   - several machines, some with more than one rank: hierarchical, a segment per machine and a
//     Gloo group of the machines' first ranks (the node leaders) between them;
//   - one rank per machine, or ACCELERANT_SHM_ALLREDUCE=0 on any rank: Gloo only.
// "Machine" is machine_identity(), which ACCELERANT_SHM_GROUP can split further (a label: ranks
// with different labels never share a segment; tests use it to stand for nodes).
#pragma once
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/torch_compat.h"
#include "comm/shm_all_reduce.h"

namespace gloo::transport {
class Device;
}

namespace accelerant::detail {

/// What connect_shared_memory attached this rank to: a shared-memory all-reduce, or none.
struct SharedMemoryConnection {
  std::unique_ptr<ShmAllReduce> shm;  // null: Gloo only
  std::string description = "Gloo";
};

/// Meets every rank through `store` (this attempt's keys). `gloo_devices` are for the node
/// leaders' group. Throws only for store failures.
SharedMemoryConnection connect_shared_memory(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout,
    const std::vector<std::shared_ptr<gloo::transport::Device>>& gloo_devices);

}  // namespace accelerant::detail
