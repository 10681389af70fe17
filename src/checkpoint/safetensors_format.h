// The safetensors format's checks that need no LibTorch, shared by the header reader
// (safetensors_header.cpp, in the library's LibTorch-free core) and the tensor codec
// (safetensors.cpp): one parser of headers, one walk over a model's index and shards.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "accelerant/safetensors_header.h"

namespace accelerant::detail {

/// The single weights file and the index of shards that save_model_safetensors writes.
inline constexpr const char* kSafetensorsSingleFile = "model.safetensors";
inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

/// Parses the header at the start of `bytes` (the whole file, or at least its first 8 + header
/// length bytes) of a file of `file_size` bytes; `where` names it in errors. Throws
/// CheckpointError (also for an unsupported dtype).
SafetensorsHeader parse_safetensors_header(const std::string& bytes, uint64_t file_size,
                                           const std::string& where);

/// Checks what the header cannot: every byte of a BOOL tensor is 0 or 1. `data` is the start of
/// the file's data. Throws CheckpointError naming `where`.
void check_safetensors_data(const SafetensorsHeader& header, const char* data,
                            const std::string& where);

/// Bytes per element of a dtype the header parser accepts.
uint64_t safetensors_element_size(const std::string& dtype);

/// Walks the weights saved in `dir`: with an index, each shard it names (`read(path)` returns
/// the tensor names the file holds) is checked against the index both ways; else the single file.
/// Throws CheckpointError.
void for_each_model_safetensors_file(
    const std::string& dir,
    const std::function<std::vector<std::string>(const std::string&)>& read);

}  // namespace accelerant::detail
