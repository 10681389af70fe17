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

namespace accelerant {
namespace {

using detail::str;

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};

// The names the safetensors specification gives to the dtypes LibTorch 1.13 has.
constexpr DtypeName kDtypes[] = {
    {torch::kBool, "BOOL"},  {torch::kUInt8, "U8"},      {torch::kInt8, "I8"},
    {torch::kInt16, "I16"},  {torch::kInt32, "I32"},     {torch::kInt64, "I64"},
    {torch::kHalf, "F16"},   {torch::kBFloat16, "BF16"}, {torch::kFloat, "F32"},
    {torch::kDouble, "F64"},
};

const char* dtype_name(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return nullptr;
}

bool dtype_from_name(const std::string& name, torch::ScalarType* type) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *type = d.type;
      return true;
    }
  }
  return false;
}

std::string supported_dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.push_back(d.name);
  return detail::join(names, ", ");
}

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
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!contents.metadata.empty()) header["__metadata__"] = contents.metadata;
  std::vector<torch::Tensor> data;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : contents.tensors) {
    if (name.empty() || name == "__metadata__") {
      throw Error(str("a safetensors tensor cannot be named \"", name,
                      "\". Fix: give every tensor a non-empty name "
                      "other than __metadata__."));
    }
    if (!names.insert(name).second) {
      throw Error(str("the tensor name \"", name,
                      "\" appears twice; safetensors names are unique. Fix: rename one."));
    }
    const char* dtype = dtype_name(tensor.scalar_type());
    if (!dtype) {
      throw Error(detail::str("tensor \"", name, "\" has dtype ", tensor.scalar_type(),
                              ", which safetensors cannot hold here. ",
                              "Supported: ", supported_dtype_names(),
                              ". Fix: convert it (e.g. .to(torch::kFloat)) first."));
    }
    torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = cpu.numel() * cpu.element_size();
    header[name] = {
        {"dtype", dtype}, {"shape", cpu.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(cpu);
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = header_text.size();
  std::memcpy(&out[0], &n, 8);  // little-endian host, checked above
  out += header_text;
  out.reserve(out.size() + offset);
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
    dtype_from_name(e.dtype, &type);  // the parser accepted only names of kDtypes
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
