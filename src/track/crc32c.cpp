// CRC32C (Castagnoli), the checksum of TFRecord framing. zlib has only the other CRC-32, so this is
// a small table-driven one; TensorBoard files are small and written rarely, so speed is no concern.
#include <array>

#include "accelerant/tracker.h"

namespace accelerant {
namespace {

constexpr uint32_t kCastagnoliReflected = 0x82f63b78u;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kCastagnoliReflected : 0u);
    table[i] = crc;
  }
  return table;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = make_table();
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  // TFRecord masks the CRC so that a CRC of data that itself holds CRCs is not degenerate.
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace accelerant
