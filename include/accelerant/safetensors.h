// Model weights in the safetensors format (https://github.com/huggingface/safetensors), the one
// Python, Rust and JavaScript tools read without running any code from the file:
//
//   8 bytes   N, the header's length (unsigned 64-bit, little-endian)
//   N bytes   a JSON object: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//             ..., "__metadata__": {"key": "value"}}, padded with spaces to a multiple of 8
//   the rest  the tensors' bytes, little-endian, row-major, one after another, no gaps
//
// A model larger than max_shard_size is split into model-00001-of-0000n.safetensors ... plus
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}),
// the layout Hugging Face's loaders read.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace accelerant {

/// A safetensors file's contents. Tensors are listed in file order.
struct SafetensorsContents {
  /// (name, tensor) pairs; names are unique, not empty and not "__metadata__".
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  /// The header's "__metadata__": free-form string pairs (transformers writes {"format": "pt"}).
  std::map<std::string, std::string> metadata;
};

/// The bytes of one safetensors file. Tensors are copied to the CPU, contiguous. Supported
/// dtypes: bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64.
/// Throws Error for an unsupported dtype, an empty or repeated name.
std::string encode_safetensors(const SafetensorsContents& contents);

/// Parses the bytes of a safetensors file, checking everything a hostile file could get wrong:
/// the header length, the JSON, each dtype, shape and data range (inside the data, matching the
/// shape, no overlaps or gaps). `where` names the file in errors. Throws CheckpointError.
SafetensorsContents decode_safetensors(const std::string& bytes, const std::string& where);

/// encode_safetensors into the file `path`, durably (fsynced) and atomically (a temporary file
/// renamed over it: readers see the old file or the new one). Throws Error as encode_safetensors
/// does, and CheckpointError naming `path` when it cannot be written (full disk, no directory).
void write_safetensors(const std::string& path, const SafetensorsContents& contents);
/// decode_safetensors of the file `path`. Throws CheckpointError when there is no file at `path`
/// or it is not a valid safetensors file.
SafetensorsContents read_safetensors(const std::string& path);

/// "10GB", "500MB", "2GiB", "1048576" -> bytes (KB, MB, GB are powers of 1000; KiB, MiB, GiB of
/// 1024, as in Accelerate). Throws Error naming the text and what is accepted.
int64_t parse_byte_size(const std::string& text);

/// What save_model_safetensors wrote.
struct SavedModelFiles {
  std::vector<std::string> weight_files;  ///< file names, in `dir`
  std::string index_file;                 ///< empty when a single file was written
  int64_t total_bytes = 0;                ///< the tensors' bytes
};

/// Writes a model's parameters and buffers (dotted names, as in its named_parameters) into
/// `dir`: model.safetensors when they fit in `max_shard_bytes`, else shards plus the index. A
/// tensor larger than the limit gets a shard of its own. Every file is written to a temporary
/// name, fsynced and renamed; the index last; weight files of an earlier save that the new one
/// does not use are removed after it. Other files in `dir` are left alone.
SavedModelFiles save_model_safetensors(const torch::nn::Module& model, const std::string& dir,
                                       int64_t max_shard_bytes);

/// Every tensor of the model saved in `dir` (model.safetensors, or the index and its shards).
std::map<std::string, torch::Tensor> read_model_safetensors(const std::string& dir);

/// Copies the weights saved in `dir` into `model` (its devices and dtypes kept). Checks first:
/// names missing or unexpected and shapes that differ are listed in one CheckpointError, and the
/// model is left unchanged.
void load_model_safetensors(torch::nn::Module& model, const std::string& dir);

}  // namespace accelerant
