// The safetensors codec: bytes <-> named tensors. Decoding treats the file as hostile (it may
// come from anywhere): the header parser (safetensors_header.cpp) checks every length, offset and
// shape before any tensor is built here.
#include "accelerant/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "accelerant/error.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_format.h"
#include "checkpoint/safetensors_stream.h"

namespace accelerant {
namespace {

using detail::str;

bool little_endian_host() {
  const uint16_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

}  // namespace

std::string encode_safetensors(const SafetensorsContents& contents) {
  if (!little_endian_host())
    throw Error(
        "safetensors files are little-endian; this build supports only little-endian hosts.");
  std::vector<detail::TensorLayout> layouts;
  std::vector<torch::Tensor> data;
  for (const auto& [name, tensor] : contents.tensors) {
    data.push_back(tensor.detach().to(torch::kCPU).contiguous());
    layouts.push_back(detail::layout_of(name, data.back()));
  }
  std::string out = detail::safetensors_header_bytes(layouts, contents.metadata);
  uint64_t total = 0;
  for (const auto& l : layouts) total += l.bytes();
  out.reserve(out.size() + total);
  for (const auto& t : data)
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return out;
}

SafetensorsContents decode_safetensors(const std::string& bytes, const std::string& where) {
  if (!little_endian_host())
    throw Error(
        "safetensors files are little-endian; this build supports only little-endian hosts.");
  // Every length, offset and shape is checked there, before any tensor is built.
  SafetensorsHeader header = detail::parse_safetensors_header(bytes, bytes.size(), where);
  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  const char* data = bytes.data() + bytes.size();
  for (const auto& e : header.tensors) data -= e.data_end - e.data_begin;  // the data's start
  detail::check_safetensors_data(header, data, where);
  for (const auto& e : header.tensors) {
    torch::ScalarType type = torch::kFloat;
    detail::safetensors_dtype_from_name(e.dtype, &type);  // the parser accepted only these
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(type));
    const uint64_t n = e.data_end - e.data_begin;
    if (n) std::memcpy(t.data_ptr(), data + e.data_begin, n);
    contents.tensors.emplace_back(e.name, t);
  }
  return contents;
}

void write_safetensors(const std::string& path, const SafetensorsContents& contents) {
  detail::replace_file_durably(path, encode_safetensors(contents), "the safetensors file");
}

SafetensorsContents read_safetensors(const std::string& path) {
  if (!detail::path_exists(path)) {
    throw CheckpointError(
        str("no safetensors file at ", path, ". Fix: check the path; save_model writes ",
            "model.safetensors or model-0000k-of-0000n.safetensors with an index."),
        path);
  }
  return decode_safetensors(detail::read_file(path), path);
}

int64_t parse_byte_size(const std::string& text) {
  static const std::pair<const char*, int64_t> kUnits[] = {{"KIB", 1LL << 10},
                                                           {"MIB", 1LL << 20},
                                                           {"GIB", 1LL << 30},
                                                           {"TIB", 1LL << 40},
                                                           {"KB", 1000LL},
                                                           {"MB", 1000LL * 1000},
                                                           {"GB", 1000LL * 1000 * 1000},
                                                           {"TB", 1000LL * 1000 * 1000 * 1000},
                                                           {"B", 1}};
  std::string upper;
  for (char c : text) {
    if (c != ' ') upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  int64_t unit = 1;
  for (const auto& [suffix, factor] : kUnits) {
    const size_t n = std::strlen(suffix);
    if (upper.size() > n && upper.compare(upper.size() - n, n, suffix) == 0) {
      upper.resize(upper.size() - n);
      unit = factor;
      break;
    }
  }
  const bool digits =
      !upper.empty() && upper.size() <= 15 &&
      std::all_of(upper.begin(), upper.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t value = digits ? std::stoll(upper) : 0;
  if (!digits || value <= 0 || value > std::numeric_limits<int64_t>::max() / unit) {
    throw Error(str(
        "\"", text,
        "\" is not a size. Fix: give a positive whole number of bytes, optionally with a unit: ",
        "KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. \"10GB\"."));
  }
  return value * unit;
}

}  // namespace accelerant
