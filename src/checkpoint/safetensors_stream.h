// A model's weights as safetensors, one tensor at a time: a writer that lays out the files from the
// tensors' names, dtypes and shapes before any value exists and then streams each tensor's bytes
// as it comes, and a reader that maps the files and views each tensor where it lies. With them
// ZeRO stage 3 saves and loads a model one gathered block at a time (the model is never whole in
// one process), and every model is saved without a second copy of itself in memory and loaded
// without reading every file first.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accelerant/safetensors.h"

namespace accelerant::detail {

/// The safetensors name of a dtype ("F32"); null for one it cannot hold.
const char* safetensors_dtype_name(torch::ScalarType type);
/// The dtype of a safetensors name; false for a name LibTorch has no dtype for.
bool safetensors_dtype_from_name(const std::string& name, torch::ScalarType* type);

/// A model's parameters, then its buffers, each in registration order, by their dotted names:
/// the tensors save_model_safetensors writes, in the order it writes them.
std::vector<std::pair<std::string, torch::Tensor>> model_tensors_in_file_order(
    const torch::nn::Module& model);

/// What a safetensors header says of one tensor, before its values exist.
struct TensorLayout {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  /// The tensor's bytes in the file.
  uint64_t bytes() const;
};

/// The layout of `tensor` under `name`.
TensorLayout layout_of(const std::string& name, const torch::Tensor& tensor);

/// The start of a safetensors file that holds `tensors` in this order: the header's length and
/// the header, padded so that the data starts 8-byte aligned. Throws Error for an empty,
/// reserved or repeated name, and for a dtype safetensors cannot hold.
std::string safetensors_header_bytes(const std::vector<TensorLayout>& tensors,
                                     const std::map<std::string, std::string>& metadata);

class DurableFileWriter;

/// One safetensors file written tensor by tensor, durably (write_file_durably's file; destroyed
/// before commit(), it leaves a partial file for its owner to remove), its size and CRC-32
/// counted as it goes: a file of ModelSafetensorsWriter, and a ZeRO-3 checkpoint's model file.
class SafetensorsFileWriter {
 public:
  /// Creates `path` and writes the header of `tensors`, in this order, with the metadata
  /// {"format": "pt"} that Hugging Face's loaders check for PyTorch weights. Throws as
  /// safetensors_header_bytes does, and CheckpointError naming `what` when `path` cannot be made.
  SafetensorsFileWriter(const std::string& path, std::vector<TensorLayout> tensors,
                        const std::string& what);
  ~SafetensorsFileWriter();
  SafetensorsFileWriter(const SafetensorsFileWriter&) = delete;
  SafetensorsFileWriter& operator=(const SafetensorsFileWriter&) = delete;

  /// The next tensor's values; its dtype and shape must be the planned ones (Error otherwise).
  void write(const torch::Tensor& tensor);
  /// Whether every planned tensor is written.
  bool complete() const;
  /// After the last write: fsyncs and closes the file. Throws Error when a tensor is missing.
  void commit();
  /// The file's bytes so far, and their CRC-32.
  uint64_t size() const;
  uint32_t crc32() const;

 private:
  std::vector<TensorLayout> tensors_;
  size_t next_ = 0;  // the next tensor to write
  std::unique_ptr<DurableFileWriter> out_;
};

/// Writes a model's weights into `dir` as save_model_safetensors does (its files, index, renames
/// and clean-up), each tensor's values given when its turn comes. Files are written under
/// temporary names; destroyed before finish(), it removes them and leaves `dir` as it was.
class ModelSafetensorsWriter {
 public:
  /// Plans the files for `tensors`, in this order, at most `max_shard_bytes` each (a larger
  /// tensor gets a file of its own). Throws Error for a limit that is not positive, and as
  /// safetensors_header_bytes does.
  ModelSafetensorsWriter(std::string dir, std::vector<TensorLayout> tensors,
                         int64_t max_shard_bytes);
  ~ModelSafetensorsWriter();
  ModelSafetensorsWriter(const ModelSafetensorsWriter&) = delete;
  ModelSafetensorsWriter& operator=(const ModelSafetensorsWriter&) = delete;

  /// The next tensor's values; its dtype and shape must be the planned ones (Error otherwise).
  void write(const torch::Tensor& tensor);
  /// After the last write: the files take their names, the index is written, and weight files
  /// of an earlier save that this one does not use are removed.
  SavedModelFiles finish();

 private:
  struct Plan;  // safetensors_stream.cpp: the files, the one being written, and the next tensor
  std::unique_ptr<Plan> plan_;
};

/// A model's weights saved in a directory (model.safetensors, or the index and its shards) or in
/// one safetensors file, mapped into memory: every header is read and checked, no tensor's values
/// are read until used.
class MappedModelWeights {
 public:
  /// Where the weights are: a directory as save_model writes it, or one safetensors file.
  enum class At { kDirectory, kFile };
  /// Throws CheckpointError when `path` holds no weights or a file is not valid safetensors.
  explicit MappedModelWeights(const std::string& path, At at = At::kDirectory);
  ~MappedModelWeights();
  MappedModelWeights(const MappedModelWeights&) = delete;
  MappedModelWeights& operator=(const MappedModelWeights&) = delete;

  /// Each tensor's shape, by name.
  const std::map<std::string, std::vector<int64_t>>& shapes() const;
  /// Tensor `name` viewing the mapped file (read-only; valid while this lives). Throws
  /// CheckpointError for a name the files do not hold.
  torch::Tensor tensor(const std::string& name) const;
  /// Gives back the pages that tensor `name` occupies in this process once its values were
  /// copied out (read again from the file if used again): a load one block at a time then holds
  /// one block of the file, not every block it went through.
  void forget(const std::string& name) const;

 private:
  struct Files;  // safetensors_stream.cpp: the mappings and where each tensor lies
  std::unique_ptr<Files> files_;
};

}  // namespace accelerant::detail
