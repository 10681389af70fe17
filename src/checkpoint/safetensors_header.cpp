// The safetensors header parser: treats the file as hostile (it may come from anywhere), so every
// length, offset and shape is checked before anyone trusts it. No LibTorch here: the tensor codec
// (safetensors.cpp) builds tensors from what this returns, and `accelerant checkpoint` prints it.
#include "accelerant/safetensors_header.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "accelerant/error.h"
#include "base/bounded_input.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_format.h"

namespace accelerant {
namespace detail {
namespace {

struct Dtype {
  const char* name;
  uint64_t size;
};

// The names the safetensors specification gives to the dtypes LibTorch 1.13 has.
constexpr Dtype kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},   {"I16", 2}, {"I32", 4},
    {"I64", 8},  {"F16", 2}, {"BF16", 2}, {"F32", 4}, {"F64", 8},
};

std::string supported_dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.push_back(d.name);
  return join(names, ", ");
}

// Headers above this are refused before parsing, as the reference implementation does: a
// legitimate header is a few bytes per tensor.
constexpr uint64_t kMaxHeaderBytes = 100u * 1000u * 1000u;

[[noreturn]] void bad_file(const std::string& where, const std::string& problem) {
  throw CheckpointError(
      str(where, " is not a valid safetensors file: ", problem,
          ". Likely cause: the file is truncated, damaged, or not a safetensors file. Fix: write "
          "it again (save_model) or use another copy."),
      where);
}

SafetensorsTensorInfo parse_entry(const std::string& where, const std::string& name,
                                  const nlohmann::json& info) {
  const std::string what = "tensor \"" + name + "\"";
  if (!info.is_object())
    bad_file(where, what + " is described by " + std::string(info.type_name()) + ", not an object");
  SafetensorsTensorInfo e;
  e.name = name;
  auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string())
    bad_file(where, what + " has no \"dtype\" string");
  e.dtype = dtype->get<std::string>();
  const uint64_t element_size = safetensors_element_size(e.dtype);
  if (element_size == 0) {
    throw CheckpointError(str(where, ": ", what, " has dtype ", e.dtype,
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
  e.data_begin = (*offsets)[0].get<uint64_t>();
  e.data_end = (*offsets)[1].get<uint64_t>();
  if (e.data_end < e.data_begin)
    bad_file(where, str(what, " ends (", e.data_end, ") before it begins (", e.data_begin, ")"));
  for (const auto& key : info.items()) {
    if (key.key() != "dtype" && key.key() != "shape" && key.key() != "data_offsets") {
      bad_file(where, what + " has an unknown field \"" + key.key() + "\"");
    }
  }
  // numel * element size must equal the byte range; computed without overflow.
  uint64_t bytes = element_size;
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      bad_file(where, what + " has a shape too large to address: " + shape->dump());
    }
  }
  if (bytes != e.data_end - e.data_begin) {
    bad_file(where, str(what, " of dtype ", e.dtype, " and shape ", shape->dump(), " needs ", bytes,
                        " bytes, its data_offsets [", e.data_begin, ", ", e.data_end, "] hold ",
                        e.data_end - e.data_begin));
  }
  return e;
}

}  // namespace

uint64_t safetensors_element_size(const std::string& dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.name) return d.size;
  }
  return 0;
}

SafetensorsHeader parse_safetensors_header(const std::string& bytes, uint64_t file_size,
                                           const std::string& where) {
  if (file_size < 8)
    bad_file(where, str("it has ", file_size, " bytes, fewer than the 8 of the header length"));
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);  // little-endian: the format's and the host's
  if (header_size > kMaxHeaderBytes)
    bad_file(where,
             str("its header length is ", header_size, " bytes (at most ", kMaxHeaderBytes, ")"));
  if (header_size > file_size - 8) {
    bad_file(where, str("its header length is ", header_size, " bytes but only ", file_size - 8,
                        " follow"));
  }
  const std::string header_text = bytes.substr(8, header_size);
  if (header_text.empty() || header_text[0] != '{')
    bad_file(where, "its header does not start with '{'");
  std::string problem;
  auto parsed_json = parse_bounded_json(header_text, &problem);  // note "Bounded input"
  if (!parsed_json) bad_file(where, said_of("its header", problem));
  const nlohmann::json header = std::move(*parsed_json);
  if (!header.is_object()) bad_file(where, "its header is not a JSON object");

  SafetensorsHeader parsed;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) bad_file(where, "its __metadata__ is not an object");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string())
          bad_file(where, "its __metadata__ value of \"" + m.key() + "\" is not a string");
        parsed.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    parsed.tensors.push_back(parse_entry(where, item.key(), item.value()));
  }
  // The tensors must tile the data exactly: sorted by offset, each begins where the last ended.
  auto& entries = parsed.tensors;
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  const uint64_t data_size = file_size - 8 - header_size;
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.data_begin != expected) {
      bad_file(where, str("tensor \"", e.name, "\" begins at byte ", e.data_begin,
                          " of the data, expected ", expected,
                          e.data_begin < expected ? " (it overlaps the one before)"
                                                  : " (a gap before it)"));
    }
    expected = e.data_end;
  }
  if (expected != data_size) {
    bad_file(where, str("its tensors cover ", expected, " bytes of data but it holds ", data_size,
                        expected > data_size ? " (truncated)" : " (bytes left over)"));
  }
  return parsed;
}

void check_safetensors_data(const SafetensorsHeader& header, const char* data,
                            const std::string& where) {
  for (const auto& e : header.tensors) {
    if (e.dtype != "BOOL") continue;
    for (uint64_t i = e.data_begin; i < e.data_end; ++i) {
      const auto byte = static_cast<unsigned char>(data[i]);
      if (byte > 1)
        bad_file(where,
                 str("bool tensor \"", e.name, "\" holds the byte ", int(byte), " (only 0 and 1)"));
    }
  }
}

void for_each_model_safetensors_file(
    const std::string& dir,
    const std::function<std::vector<std::string>(const std::string&)>& read) {
  const std::string index_path = dir + "/" + kSafetensorsIndexFile;
  if (!path_exists(index_path)) {
    const std::string single = dir + "/" + kSafetensorsSingleFile;
    if (!path_exists(single)) {
      throw CheckpointError(
          str("no model weights in ", dir, ": neither ", kSafetensorsSingleFile, " nor ",
              kSafetensorsIndexFile, ". Fix: pass the directory given to save_model."),
          dir);
    }
    read(single);
    return;
  }
  // Bounded (note "Bounded input"): a nesting bomb or a huge file is refused, not parsed.
  const auto file = read_bounded_file(index_path, layout::kMaxJsonBytes);
  std::string problem = file.problem;
  std::optional<nlohmann::json> parsed;
  if (problem.empty()) parsed = parse_bounded_json(file.bytes, &problem);
  if (!parsed) {
    throw CheckpointError(str(said_of(index_path, problem),
                              ". Likely cause: it was damaged or is not an index save_model "
                              "wrote. Fix: save the model again."),
                          index_path);
  }
  nlohmann::json index = std::move(*parsed);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw CheckpointError(
        str(index_path, " has no \"weight_map\" object. Fix: save the model again."), index_path);
  }
  std::vector<std::string> files;
  std::set<std::string> unique;
  for (const auto& item : index["weight_map"].items()) {
    if (!item.value().is_string() ||
        item.value().get<std::string>().find('/') != std::string::npos) {
      throw CheckpointError(str(index_path, " maps \"", item.key(), "\" to ", item.value().dump(),
                                ", not a file name in ", dir, ". Fix: save the model again."),
                            index_path);
    }
    if (unique.insert(item.value().get<std::string>()).second)
      files.push_back(item.value().get<std::string>());
  }
  std::set<std::string> held;
  for (const auto& file : files) {
    for (const auto& name : read(dir + "/" + file)) {
      auto listed = index["weight_map"].find(name);
      if (listed == index["weight_map"].end() || *listed != file) {
        throw CheckpointError(
            str(dir, "/", file, " holds \"", name, "\", which ", index_path,
                listed == index["weight_map"].end() ? " does not list" : " places in another file",
                ". Likely cause: shards of two saves mixed. Fix: save the model again."),
            dir + "/" + file);
      }
      held.insert(name);
    }
  }
  for (const auto& item : index["weight_map"].items()) {
    if (!held.count(item.key())) {
      throw CheckpointError(
          str(index_path, " lists \"", item.key(), "\" in ", item.value().get<std::string>(),
              ", which does not hold it. Fix: save the model again."),
          index_path);
    }
  }
}

}  // namespace detail

SafetensorsHeader read_safetensors_header(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
    throw CheckpointError(
        detail::str("no safetensors file at ", path, ". Fix: check the path; save_model writes ",
                    "model.safetensors or model-0000k-of-0000n.safetensors with an index."),
        path);
  }
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);
  std::ifstream in(path, std::ios::binary);
  std::string bytes(8, '\0');
  in.read(bytes.data(), 8);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  // Only a header the parser will accept is read; the parser words the refusal otherwise.
  if (file_size >= 8 && header_size <= std::min<uint64_t>(detail::kMaxHeaderBytes, file_size - 8)) {
    bytes.resize(8 + header_size);
    in.read(bytes.data() + 8, static_cast<std::streamsize>(header_size));
  }
  return detail::parse_safetensors_header(bytes, file_size, path);
}

namespace {

std::map<std::string, SafetensorsTensorInfo> model_headers(
    const std::string& dir, SafetensorsHeader (*read)(const std::string&)) {
  std::map<std::string, SafetensorsTensorInfo> tensors;
  detail::for_each_model_safetensors_file(dir, [&tensors, read](const std::string& path) {
    std::vector<std::string> names;
    for (auto& t : read(path).tensors) {
      names.push_back(t.name);
      tensors[t.name] = std::move(t);
    }
    return names;
  });
  return tensors;
}

}  // namespace

std::map<std::string, SafetensorsTensorInfo> read_model_safetensors_header(const std::string& dir) {
  return model_headers(dir, read_safetensors_header);
}

SafetensorsHeader verify_safetensors(const std::string& path) {
  if (!detail::path_exists(path)) return read_safetensors_header(path);  // words the absence
  const std::string bytes = detail::read_file(path);
  SafetensorsHeader header = detail::parse_safetensors_header(bytes, bytes.size(), path);
  uint64_t data_bytes = 0;
  for (const auto& t : header.tensors) data_bytes += t.data_end - t.data_begin;
  detail::check_safetensors_data(header, bytes.data() + bytes.size() - data_bytes, path);
  return header;
}

std::map<std::string, SafetensorsTensorInfo> verify_model_safetensors(const std::string& dir) {
  return model_headers(dir, verify_safetensors);
}

}  // namespace accelerant
