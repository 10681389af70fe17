// Which public API call issued a collective, for the flight record and the diagnosis of a failed
// collective (docs/collectives.md "Ranks in different collectives"). The public entry points
// of the layers above (the Accelerator's methods, the gradient reducer's buckets, the checkpoint
// protocol) put a ScopedCollectiveLabel on the stack; the communicator reads it, on the same
// thread, when it numbers a collective. The outermost label wins, so a gather_for_metrics that
// gathers through gather() reads "gather_for_metrics". Labels are string literals (the recorder
// keeps the pointer), so labelling costs two stores and no allocation.
#pragma once

#include <cstdint>

namespace accelerant::detail {

struct CollectiveLabel {
  const char* api = nullptr;  // a string literal, or null: a direct Communicator call
  int64_t index = -1;         // appended when >= 0: "backward bucket" 3 -> "backward bucket 3"
};

/// The label of the public call running on this thread.
inline CollectiveLabel& current_collective_label() {
  thread_local CollectiveLabel label;
  return label;
}

/// Labels the collectives this scope issues on this thread, unless an outer scope already did.
class ScopedCollectiveLabel {
 public:
  explicit ScopedCollectiveLabel(const char* api, int64_t index = -1)
      : saved_(current_collective_label()) {
    if (!saved_.api) current_collective_label() = {api, index};
  }
  ~ScopedCollectiveLabel() { current_collective_label() = saved_; }
  ScopedCollectiveLabel(const ScopedCollectiveLabel&) = delete;
  ScopedCollectiveLabel& operator=(const ScopedCollectiveLabel&) = delete;

 private:
  CollectiveLabel saved_;
};

}  // namespace accelerant::detail
