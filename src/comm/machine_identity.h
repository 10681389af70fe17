// Which ranks can reduce through shared memory: those whose machine identity is equal.
#pragma once
#include <string>

namespace accelerant::detail {

/// The kernel's boot id, the host name and the network namespace: equal for processes of one
/// machine. The namespace is part of it because processes in separate network namespaces are
/// what this project's tests use to stand for separate machines, and containers on one host
/// (separate namespaces, usually separate /dev/shm) must not be taken for one machine.
/// ACCELERANT_SHM_GROUP, when set, is appended: ranks with different labels count as different
/// machines (tests stand for nodes this way; it can also keep groups of ranks apart).
std::string machine_identity();

/// ACCELERANT_SHM_ALLREDUCE, a bool (parse_bool): false turns the shared-memory all-reduce off
/// (Gloo carries every all-reduce); unset or true leaves it on. Anything else throws
/// EnvironmentError naming the accepted values.
bool shm_all_reduce_enabled();

}  // namespace accelerant::detail
