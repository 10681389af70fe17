// A model's weights as safetensors files: one file, or shards plus Hugging Face's index.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "accelerant/error.h"
#include "accelerant/safetensors.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_format.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"

namespace accelerant {

using detail::str;

SavedModelFiles save_model_safetensors(const torch::nn::Module& model, const std::string& dir,
                                       int64_t max_shard_bytes) {
  const auto state = detail::model_tensors_in_file_order(model);
  std::vector<detail::TensorLayout> layouts;
  for (const auto& [name, tensor] : state) layouts.push_back(detail::layout_of(name, tensor));
  detail::ModelSafetensorsWriter writer(dir, std::move(layouts), max_shard_bytes);
  for (const auto& [name, tensor] : state) writer.write(tensor);
  return writer.finish();
}

std::map<std::string, torch::Tensor> read_model_safetensors(const std::string& dir) {
  std::map<std::string, torch::Tensor> tensors;
  detail::for_each_model_safetensors_file(dir, [&tensors](const std::string& path) {
    std::vector<std::string> names;
    for (auto& [name, tensor] : read_safetensors(path).tensors) {
      names.push_back(name);
      tensors[name] = tensor;
    }
    return names;
  });
  return tensors;
}

void load_model_safetensors(torch::nn::Module& model, const std::string& dir) {
  const detail::MappedModelWeights saved(dir);
  auto model_state = detail::named_state(model);
  const auto problems = detail::state_mismatches(model_state, saved.shapes());
  if (!problems.empty()) {
    throw CheckpointError(
        str("the weights in ", dir,
            " do not fit the model; nothing was loaded: ", detail::join(problems, "; "),
            ". Fix: build the model with the same layers and sizes ", "as the one saved."),
        dir);
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : model_state) tensor.copy_(saved.tensor(name));
}

}  // namespace accelerant
