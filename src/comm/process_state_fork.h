// ProcessState across fork(), for the fork launcher (src/launch/worker_process.cpp).
#pragma once

namespace accelerant::detail {

/// In a freshly forked worker: drop (without destroying) the parent's state, whose threads and
/// sockets do not exist in the child, so that the worker reads its own environment.
void forget_process_state_after_fork();

}  // namespace accelerant::detail
