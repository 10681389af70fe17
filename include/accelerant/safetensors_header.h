// What a safetensors file holds, read from its header alone and without LibTorch: names, dtypes,
// shapes and where each tensor's bytes lie. `accelerant checkpoint inspect|verify` reads weights
// this way (it does not load LibTorch); read_safetensors (safetensors.h) checks the same header
// before it builds tensors, so both refuse the same files with the same errors.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace accelerant {

/// One tensor as a safetensors header describes it.
struct SafetensorsTensorInfo {
  std::string name;            ///< unique in its file, not empty, not "__metadata__"
  std::string dtype;           ///< the specification's name: "F32", "BF16", "I64", "BOOL", ...
  std::vector<int64_t> shape;  ///< empty for a scalar
  uint64_t data_begin = 0;     ///< its first byte, counted from the start of the data
  uint64_t data_end = 0;       ///< one past its last byte
};

/// A safetensors file's header, checked.
struct SafetensorsHeader {
  /// The tensors in the order of their bytes in the file.
  std::vector<SafetensorsTensorInfo> tensors;
  /// The header's "__metadata__": free-form string pairs.
  std::map<std::string, std::string> metadata;
};

/// Reads and checks the header of the safetensors file `path` (not its data): the header length,
/// the JSON, each dtype, shape and data range, and that the ranges tile the rest of the file
/// exactly. Throws CheckpointError naming the file and the problem.
SafetensorsHeader read_safetensors_header(const std::string& path);

/// The headers of the model weights saved in `dir` (model.safetensors, or the index and its
/// shards, checked against each other as read_model_safetensors does), by tensor name. Throws
/// CheckpointError.
std::map<std::string, SafetensorsTensorInfo> read_model_safetensors_header(const std::string& dir);

/// read_safetensors_header, then the data too, as read_safetensors checks it (every bool byte is 0
/// or 1): the whole file is read. Throws CheckpointError.
SafetensorsHeader verify_safetensors(const std::string& path);

/// read_model_safetensors_header with every file's data checked as verify_safetensors does.
std::map<std::string, SafetensorsTensorInfo> verify_model_safetensors(const std::string& dir);

}  // namespace accelerant
