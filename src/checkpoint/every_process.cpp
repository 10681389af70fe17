#include "checkpoint/every_process.h"

#include "accelerant/error.h"
#include "base/text.h"
#include "base/uncaught_exception_recorder.h"

namespace accelerant::detail {

ProcessOutcomes outcomes_everywhere(const CheckpointRanks& ranks,
                                    const std::function<std::string()>& step) {
  std::string outcome;
  try {
    outcome = "ok:" + step();
  } catch (...) {
    // Without LibTorch's C++ backtrace (a hundred frames that say nothing to the user).
    outcome = "error:" + exception_text(std::current_exception());
  }
  ProcessOutcomes all;
  const auto reports = ranks.communicator->gather_bytes(outcome);
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    const bool ok = reports[rank].rfind("ok:", 0) == 0;
    all.results.push_back(ok ? reports[rank].substr(3) : "");
    if (!ok) {
      all.failures.push_back(rank_prefix(static_cast<int>(rank), static_cast<int>(reports.size())) +
                             reports[rank].substr(6));
    }
  }
  return all;
}

void on_every_process(const CheckpointRanks& ranks, const std::string& what,
                      const std::function<void()>& step) {
  const auto failures = outcomes_everywhere(ranks, [&] {
                          step();
                          return std::string();
                        }).failures;
  if (!failures.empty()) {
    throw CheckpointError(str(ranks.rank_prefix, what, " failed on ", failures.size(), " of ",
                              ranks.world_size, " process(es):\n  ", join(failures, "\n  ")));
  }
}

}  // namespace accelerant::detail
