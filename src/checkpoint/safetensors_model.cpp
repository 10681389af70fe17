// A model's weights as safetensors files: one file, or shards plus Hugging Face's index.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "accelerant/error.h"
#include "accelerant/safetensors.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/safetensors_format.h"
#include "checkpoint/state_pieces.h"

namespace accelerant {
namespace {

using detail::str;

const char* const kSingleFile = detail::kSafetensorsSingleFile;
const char* const kIndexFile = detail::kSafetensorsIndexFile;

std::string shard_name(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}

bool is_weight_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, shard);
}

// Parameters first, then buffers, each in the model's registration order: the order readers
// expect to see them in.
std::vector<std::pair<std::string, torch::Tensor>> ordered_state(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : model.named_parameters(/*recurse=*/true))
    state.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true))
    state.emplace_back(b.key(), b.value());
  return state;
}

}  // namespace

SavedModelFiles save_model_safetensors(const torch::nn::Module& model, const std::string& dir,
                                       int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0) {
    throw Error(str("max_shard_size must be positive; got ", max_shard_bytes,
                    " bytes. Fix: pass e.g. \"10GB\"."));
  }
  detail::make_directories(dir);
  // Greedy packing in model order; a tensor over the limit gets a shard of its own.
  std::vector<SafetensorsContents> shards(1);
  int64_t shard_bytes = 0;
  SavedModelFiles saved;
  for (auto& [name, tensor] : ordered_state(model)) {
    const int64_t bytes = tensor.numel() * tensor.element_size();
    if (!shards.back().tensors.empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().tensors.emplace_back(name, tensor);
    shard_bytes += bytes;
    saved.total_bytes += bytes;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shards.size() == 1 ? kSingleFile : shard_name(k + 1, shards.size());
    shards[k].metadata["format"] = "pt";  // what Hugging Face's loaders check for PyTorch weights
    detail::replace_file_durably(dir + "/" + file, encode_safetensors(shards[k]),
                                 "the model weights");
    saved.weight_files.push_back(file);
    for (const auto& [name, tensor] : shards[k].tensors) weight_map[name] = file;
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", saved.total_bytes}}},
                                    {"weight_map", weight_map}};
    detail::replace_file_durably(dir + "/" + kIndexFile, index.dump(2) + "\n",
                                 "the safetensors index");
    saved.index_file = kIndexFile;
  }
  // Only now that the new set is complete: remove weight files of an earlier save it replaced.
  std::set<std::string> keep(saved.weight_files.begin(), saved.weight_files.end());
  if (!saved.index_file.empty()) keep.insert(saved.index_file);
  for (const auto& name : detail::list_directory(dir)) {
    if (is_weight_file(name) && !keep.count(name)) std::remove((dir + "/" + name).c_str());
  }
  detail::sync_directory(dir);
  return saved;
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
  const auto saved = read_model_safetensors(dir);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : saved) shapes[name] = tensor.sizes().vec();
  auto model_state = detail::named_state(model);
  const auto problems = detail::state_mismatches(model_state, shapes);
  if (!problems.empty()) {
    throw CheckpointError(
        str("the weights in ", dir,
            " do not fit the model; nothing was loaded: ", detail::join(problems, "; "),
            ". Fix: build the model with the same layers and sizes ", "as the one saved."),
        dir);
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : model_state) tensor.copy_(saved.at(name));
}

}  // namespace accelerant
