// The safetensors codec: bytes <-> named tensors. Decoding treats the file as hostile (it may
// come from anywhere): every length, offset and shape is checked before any tensor is built.
#include "accelerant/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "accelerant/error.h"
#include "base/bounded_input.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/durable_files.h"

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

// Headers above this are refused before they are read or parsed, as the reference implementation
// does (docs/checkpoints.md "Limits"): a legitimate header is about 100 bytes per tensor.
constexpr uint64_t kMaxHeaderBytes = 100u * 1000u * 1000u;

[[noreturn]] void bad_file(const std::string& where, const std::string& problem) {
  throw CheckpointError(
      str(where, " is not a valid safetensors file: ", problem,
          ". Likely cause: the file is truncated, damaged, or not a safetensors file. Fix: write "
          "it again (save_model) or use another copy."),
      where);
}

struct Entry {
  std::string name;
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& where, const std::string& name, const nlohmann::json& info) {
  const std::string what = "tensor \"" + name + "\"";
  if (!info.is_object())
    bad_file(where, what + " is described by " + std::string(info.type_name()) + ", not an object");
  Entry e;
  e.name = name;
  auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string())
    bad_file(where, what + " has no \"dtype\" string");
  if (!dtype_from_name(dtype->get<std::string>(), &e.type)) {
    throw CheckpointError(str(where, ": ", what, " has dtype ", dtype->get<std::string>(),
                              ", which this build cannot ", "hold. Supported: ",
                              supported_dtype_names(), ". Fix: convert the tensor before saving."),
                          where);
  }
  auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) bad_file(where, what + " has no \"shape\" array");
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      bad_file(where, what + " has a shape entry that is not a non-negative integer: " + d.dump());
    }
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    bad_file(where, what + " has no \"data_offsets\" pair of non-negative integers");
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  if (e.end < e.begin)
    bad_file(where, str(what, " ends (", e.end, ") before it begins (", e.begin, ")"));
  for (const auto& key : info.items()) {
    if (key.key() != "dtype" && key.key() != "shape" && key.key() != "data_offsets") {
      bad_file(where, what + " has an unknown field \"" + key.key() + "\"");
    }
  }
  // numel * element size must equal the byte range; computed without overflow.
  uint64_t bytes = c10::elementSize(e.type);
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      bad_file(where, what + " has a shape too large to address: " + shape->dump());
    }
  }
  if (bytes != e.end - e.begin) {
    bad_file(where, str(what, " of dtype ", dtype->get<std::string>(), " and shape ", shape->dump(),
                        " needs ", bytes, " bytes, its data_offsets [", e.begin, ", ", e.end,
                        "] hold ", e.end - e.begin));
  }
  return e;
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
  if (bytes.size() < 8)
    bad_file(where, str("it has ", bytes.size(), " bytes, fewer than the 8 of the header length"));
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > kMaxHeaderBytes)
    bad_file(where,
             str("its header length is ", header_size, " bytes (at most ", kMaxHeaderBytes, ")"));
  if (header_size > bytes.size() - 8) {
    bad_file(where, str("its header length is ", header_size, " bytes but only ", bytes.size() - 8,
                        " follow"));
  }
  const std::string_view header_text(bytes.data() + 8, header_size);
  if (header_text.empty() || header_text[0] != '{')
    bad_file(where, "its header does not start with '{'");
  std::string problem;
  auto parsed = detail::parse_bounded_json(header_text, &problem);  // note "Bounded input"
  if (!parsed) bad_file(where, detail::said_of("its header", problem));
  const nlohmann::json header = std::move(*parsed);
  if (!header.is_object()) bad_file(where, "its header is not a JSON object");

  SafetensorsContents contents;
  std::vector<Entry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) bad_file(where, "its __metadata__ is not an object");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string())
          bad_file(where, "its __metadata__ value of \"" + m.key() + "\" is not a string");
        contents.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(where, item.key(), item.value()));
  }
  // The tensors must tile the data exactly: sorted by offset, each begins where the last ended.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = bytes.size() - 8 - header_size;
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.begin != expected) {
      bad_file(where,
               str("tensor \"", e.name, "\" begins at byte ", e.begin, " of the data, expected ",
                   expected,
                   e.begin < expected ? " (it overlaps the one before)" : " (a gap before it)"));
    }
    expected = e.end;
  }
  if (expected != data_size) {
    bad_file(where, str("its tensors cover ", expected, " bytes of data but it holds ", data_size,
                        expected > data_size ? " (truncated)" : " (bytes left over)"));
  }
  const char* data = bytes.data() + 8 + header_size;
  for (const auto& e : entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.type));
    const uint64_t n = e.end - e.begin;
    if (e.type == torch::kBool) {
      for (uint64_t i = 0; i < n; ++i) {
        const auto byte = static_cast<unsigned char>(data[e.begin + i]);
        if (byte > 1)
          bad_file(where, str("bool tensor \"", e.name, "\" holds the byte ", int(byte),
                              " (only 0 and 1)"));
      }
    }
    if (n) std::memcpy(t.data_ptr(), data + e.begin, n);
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
  // The header's length and nesting are checked before the rest of the file is read: a bad
  // header must not cost the file's size (note "Bounded input").
  {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    const auto file_size = static_cast<uint64_t>(std::max<std::streamoff>(in.tellg(), 0));
    in.seekg(0);
    char prefix[8] = {};
    uint64_t header_size = 0;
    if (file_size >= 8 && in.read(prefix, 8)) {
      std::memcpy(&header_size, prefix, 8);
      if (header_size > kMaxHeaderBytes) {
        bad_file(path, str("its header length is ", header_size, " bytes (at most ",
                           kMaxHeaderBytes, ")"));
      }
      std::string header(std::min(header_size, file_size - 8), '\0');
      if (in.read(&header[0], static_cast<std::streamsize>(header.size()))) {
        const std::string nesting = detail::nesting_problem(header, detail::Syntax::kJson);
        if (!nesting.empty()) bad_file(path, detail::said_of("its header", nesting));
      }
    }
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
