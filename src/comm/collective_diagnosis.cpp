#include "comm/collective_diagnosis.h"

#include <algorithm>
#include <thread>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {
namespace {

std::string key(const char* kind, const CollectiveCall& call, int rank) {
  return str(kind, "/", call.sequence, "/", rank);
}

std::vector<int> ranks_without_key(c10d::Store& store, const char* kind, const CollectiveCall& call,
                                   int size) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (!store.check({key(kind, call, r)})) missing.push_back(r);
  }
  return missing;
}

std::string rank_list(const std::vector<int>& ranks) {
  return str(ranks.size() == 1 ? "Rank " : "Ranks ", join(ranks, ", "));
}

std::string bytes_to_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

constexpr const char* kSameCallsFix =
    "make every rank call the same collectives in the same order with the same shapes and dtypes "
    "(use gather or pad_across_processes for per-rank lengths)";

}  // namespace

void check_signatures(c10d::Store& store, const CollectiveCall& call, int rank, int size,
                      std::chrono::milliseconds timeout, const std::string& rank_prefix) {
  const std::string mine = call.signature;
  store.set(key("debug", call, rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key("debug", call, r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    auto missing = ranks_without_key(store, "debug", call, size);
    throw CollectiveError(
        str(rank_prefix, "Debug mode: ", call.name, " #", call.sequence, " (", mine, ") waited ",
            timeout.count(), " ms but ", rank_list(missing), " never reached it. Likely cause: ",
            missing.size() == 1 ? "that rank is" : "those ranks are",
            " stuck, slower than the timeout, or on a code path that skips this collective. Fix: ",
            kSameCallsFix, "; check the missing ranks' own output for an earlier error."),
        missing);
  }
  std::vector<std::string> all;
  bool equal = true;
  for (int r = 0; r < size; ++r) {
    all.push_back(r == rank ? mine : bytes_to_string(store.get(keys[r])));
    equal = equal && all[r] == mine;
  }
  if (equal) return;
  std::string table;
  for (int r = 0; r < size; ++r) table += str("\n  rank ", r, ": ", all[r]);
  throw CollectiveMismatchError(str(rank_prefix,
                                    "Debug mode: the ranks disagree about collective #",
                                    call.sequence, ":", table, "\nFix: ", kSameCallsFix, "."));
}

std::string diagnose_failure(c10d::Store& store, const CollectiveCall& call, int rank, int size,
                             std::chrono::milliseconds timeout, const std::string& rank_prefix,
                             const std::string& cause, std::vector<int>& missing) {
  const std::string head =
      str(rank_prefix, call.name, " #", call.sequence, " (", call.signature, ") failed: ", cause);
  // Long enough for peers that hit the same timeout to report, short enough that the whole
  // failure surfaces well within twice the timeout.
  const auto grace =
      std::clamp(timeout / 2, std::chrono::milliseconds(200), std::chrono::milliseconds(5000));
  try {
    store.set(key("failed", call, rank), std::vector<uint8_t>{1});
    const auto deadline = std::chrono::steady_clock::now() + grace;
    do {
      missing = ranks_without_key(store, "failed", call, size);
      if (missing.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
  } catch (const std::exception& e) {
    missing.clear();
    return str(head, "\nThe job's store could not be reached either (", e.what(),
               "). Likely cause: the process hosting it (rank 0 or the launcher) has exited. "
               "Fix: look at rank 0's or the launcher's output for the first error.");
  }
  if (missing.empty()) {
    return str(
        head,
        "\nEvery rank reached this collective, so it failed in the transport or on its input "
        "(see the cause above). Likely cause: a rank died during the transfer, the network "
        "between ranks dropped, or the backend does not support this dtype. Fix: look for "
        "an earlier error from another rank; set GLOO_SOCKET_IFNAME to the interface the "
        "machines share if they have several.");
  }
  return str(
      head, "\n", rank_list(missing), " did not reach this collective (no report within ",
      grace.count(), " ms of the failure; timeout ", timeout.count(),
      " ms). Likely cause: ", missing.size() == 1 ? "that rank is" : "those ranks are",
      " stuck, slower than the timeout, dead, or on a code path that skips this collective. "
      "Fix: ",
      kSameCallsFix,
      "; check the missing ranks' output for an earlier error; if they are "
      "only slow, raise the timeout (ProcessStateOptions::timeout or ACCELERANT_TIMEOUT_MS); "
      "ACCELERANT_DEBUG_MODE=1 checks every call across ranks.");
}

}  // namespace accelerant::detail
