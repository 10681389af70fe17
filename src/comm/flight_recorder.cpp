#include "comm/flight_recorder.h"

#include <algorithm>
#include <chrono>

#include "base/text.h"

namespace accelerant::detail {
namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}  // namespace

int64_t steady_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void FlightRecorder::start(int64_t sequence, const char* op, const CollectiveLabel& api,
                           const char* dtype, int64_t elements) {
  Slot& slot = slots_[static_cast<size_t>(sequence % kFlightRecorderSlots)];
  slot.sequence.store(0, kRelaxed);  // a record taken meanwhile skips the half-written slot
  slot.op.store(op, kRelaxed);
  slot.api.store(api.api, kRelaxed);
  slot.api_index.store(api.index, kRelaxed);
  slot.dtype.store(dtype, kRelaxed);
  slot.elements.store(elements, kRelaxed);
  slot.start_ns.store(steady_clock_ns(), kRelaxed);
  slot.end_ns.store(0, kRelaxed);
  slot.state.store(static_cast<int>(CollectiveState::kStarted), kRelaxed);
  slot.sequence.store(sequence, std::memory_order_release);
}

void FlightRecorder::finish(int64_t sequence, CollectiveState state) {
  Slot& slot = slots_[static_cast<size_t>(sequence % kFlightRecorderSlots)];
  if (slot.sequence.load(std::memory_order_acquire) != sequence) return;
  slot.end_ns.store(steady_clock_ns(), kRelaxed);
  slot.state.store(static_cast<int>(state), std::memory_order_release);
}

RankFlightRecord FlightRecorder::record(int rank, int world_size) const {
  const int64_t now_ns = steady_clock_ns();
  RankFlightRecord record;
  record.rank = rank;
  record.world_size = world_size;
  record.written_ms = wall_clock_ms();
  auto to_wall_ms = [&](int64_t ns) { return record.written_ms - (now_ns - ns) / 1000000; };
  for (const Slot& slot : slots_) {
    const int64_t sequence = slot.sequence.load(std::memory_order_acquire);
    if (sequence == 0) continue;
    CollectiveRecord c;
    c.sequence = sequence;
    const char* op = slot.op.load(kRelaxed);
    const char* api = slot.api.load(kRelaxed);
    const char* dtype = slot.dtype.load(kRelaxed);
    const int64_t index = slot.api_index.load(kRelaxed);
    c.op = op ? op : "?";
    c.api = api ? (index >= 0 ? str(api, " ", index) : std::string(api)) : "";
    c.dtype = dtype ? dtype : "?";
    c.elements = slot.elements.load(kRelaxed);
    c.state = static_cast<CollectiveState>(slot.state.load(std::memory_order_acquire));
    c.start_ms = to_wall_ms(slot.start_ns.load(kRelaxed));
    const int64_t end_ns = slot.end_ns.load(kRelaxed);
    c.end_ms = end_ns ? to_wall_ms(end_ns) : 0;
    if (slot.sequence.load(std::memory_order_acquire) != sequence) continue;  // reused meanwhile
    record.collectives.push_back(std::move(c));
  }
  std::sort(record.collectives.begin(), record.collectives.end(),
            [](const auto& x, const auto& y) { return x.sequence < y.sequence; });
  return record;
}

}  // namespace accelerant::detail
