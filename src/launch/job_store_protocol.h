// The bytes of c10d's TCPStore protocol (LibTorch 1.10 to 1.13, job_store.h) that the job
// store's client and server share: one table, so that the two cannot drift apart.
#pragma once

#include <cstdint>

namespace accelerant::detail::store_protocol {

// The first byte of a query.
enum Query : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};
// CHECK's answer, and the byte that ends a WAIT.
constexpr uint8_t kReady = 0, kNotReady = 1, kStopWaiting = 0;
// What a WATCH_KEY callback reports.
constexpr uint8_t kKeyUpdated = 0, kKeyCreated = 1, kKeyDeleted = 2, kCallbackRegistered = 3;

}  // namespace accelerant::detail::store_protocol
