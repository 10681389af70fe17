// The one handshake the shared-memory set-up repeats: every rank publishes a string under
// prefix + rank and reads everyone's, so that all ranks take the same decision.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/torch_compat.h"

namespace accelerant::detail {

/// Sets `prefix`<rank> to `mine`, waits (up to `timeout`) for every rank's, returns them in rank
/// order. Throws the store's error on timeout.
std::vector<std::string> exchange_strings(c10d::Store& store, const std::string& prefix, int rank,
                                          int size, const std::string& mine,
                                          std::chrono::milliseconds timeout);

/// "rank r: <text>; ..." for every value that is not "ok" ("" when all are), naming rank r as
/// `job_rank(r)`.
std::string failures_of(
    const std::vector<std::string>& outcomes,
    const std::function<int(int)>& job_rank = [](int r) { return r; });

}  // namespace accelerant::detail
