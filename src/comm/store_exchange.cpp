#include "comm/store_exchange.h"

#include "base/text.h"

namespace accelerant::detail {

std::vector<std::string> exchange_strings(c10d::Store& store, const std::string& prefix, int rank,
                                          int size, const std::string& mine,
                                          std::chrono::milliseconds timeout) {
  store.set(str(prefix, rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(str(prefix, r));
  store.wait(keys, timeout);
  std::vector<std::string> all;
  for (const auto& key : keys) {
    const auto value = store.get(key);
    all.emplace_back(value.begin(), value.end());
  }
  return all;
}

std::string failures_of(const std::vector<std::string>& outcomes,
                        const std::function<int(int)>& job_rank) {
  std::string failures;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r] == "ok") continue;
    failures += str(failures.empty() ? "" : "; ", "rank ", job_rank(static_cast<int>(r)), ": ",
                    outcomes[r]);
  }
  return failures;
}

}  // namespace accelerant::detail
