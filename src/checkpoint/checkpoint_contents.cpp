#include "accelerant/checkpoint_contents.h"

#include <torch/serialize.h>

#include <algorithm>
#include <map>
#include <regex>

#include "accelerant/error.h"
#include "accelerant/fused_optimizer.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"
#include "train/fused_state_format.h"

namespace accelerant {
namespace {

using detail::str;

[[noreturn]] void refuse(const std::string& dir, const std::string& file, const std::string& what) {
  throw CheckpointError(
      str("checkpoint ", dir, ": ", file, " ", what,
          ". Likely cause: files were swapped between checkpoints or edited, and the manifest's "
          "checksums rewritten to match. Fix: use another checkpoint (auto_resume takes the "
          "newest one that loads)."),
      dir + "/" + file);
}

bool has_archive(torch::serialize::InputArchive& archive, const char* key) {
  torch::serialize::InputArchive sub;
  return archive.try_read(key, sub);
}

bool has_tensor(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor t;
  return archive.try_read(key, t);
}

bool has_value(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value;
  return archive.try_read(key, value);
}

// The most updates any parameter has had in this optimizer file, as far as it says.
int64_t most_updates(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive beside;
  torch::serialize::InputArchive* fused = detail::fused_state_in(archive, beside);
  torch::Tensor steps;
  if (fused && fused->try_read(detail::kFusedStepsKey, steps) && steps.numel() > 0) {
    return static_cast<int64_t>(steps.max().item<double>());
  }
  return 0;  // torch::optim's own state: its step counts are not read here
}

}  // namespace

CheckpointManifest verify_checkpoint_contents(const std::string& dir) {
  const CheckpointManifest manifest = verify_checkpoint(dir);
  const CheckpointTrainingState state = read_checkpoint_state(dir);
  if (state.optimizer_steps != manifest.step) {
    refuse(dir, "state.json",
           str("says ", state.optimizer_steps, " optimizer steps, but the manifest says step ",
               manifest.step));
  }
  static const std::regex model_file("model_[0-9]+\\.pt");
  static const std::regex weights_file("model_[0-9]+\\.safetensors");
  static const std::regex optimizer_file("optimizer_([0-9]+)\\.pt");
  static const std::regex shard_file("rank_([0-9]+)/optimizer_([0-9]+)\\.pt");
  static const std::regex rng_file("rank_[0-9]+/rng\\.pt");
  // Per optimizer, its shards by rank (kept as bytes: an archive is read from them twice).
  std::map<int, std::map<int, std::string>> shards;
  for (const auto& f : manifest.files) {
    std::smatch m;
    const bool is_model = std::regex_match(f.path, model_file);
    const bool is_optimizer = std::regex_match(f.path, m, optimizer_file);
    const bool is_shard = !is_optimizer && std::regex_match(f.path, m, shard_file);
    const bool is_rng = std::regex_match(f.path, rng_file);
    if (std::regex_match(f.path, weights_file)) {
      // A sharded model's weights (ZeRO stage 3): valid safetensors, mapped, not read whole.
      size_t tensors = 0;
      try {
        tensors =
            detail::MappedModelWeights(dir + "/" + f.path, detail::MappedModelWeights::At::kFile)
                .shapes()
                .size();
      } catch (const CheckpointError& e) {
        refuse(dir, f.path, str("is not valid safetensors: ", e.what()));
      }
      if (tensors == 0) refuse(dir, f.path, "holds no tensors, not a model's weights");
      continue;
    }
    if (!is_model && !is_optimizer && !is_shard && !is_rng) continue;
    const std::string bytes = detail::read_file(dir + "/" + f.path);
    // Not an archive at all: archive_from_bytes says so, naming the file.
    torch::serialize::InputArchive archive = detail::archive_from_bytes(bytes, dir + "/" + f.path);
    const bool optimizer_like =
        has_archive(archive, detail::kGroupOptions) || has_value(archive, "pytorch_version");
    if (is_model) {
      if (optimizer_like) refuse(dir, f.path, "holds an optimizer's state, not a model's");
      if (archive.keys().empty()) refuse(dir, f.path, "holds no tensors, not a model's state");
    } else if (is_rng) {
      if (!has_tensor(archive, "cpu")) {
        refuse(dir, f.path,
               optimizer_like ? "holds an optimizer's state, not a random generator's"
                              : "holds no CPU generator state, not a random generator's");
      }
    } else {
      if (!optimizer_like) refuse(dir, f.path, "does not hold an optimizer's state");
      const int64_t updates = most_updates(archive);
      if (updates > manifest.step) {
        refuse(dir, f.path,
               str("holds an optimizer state of a later step (a parameter with ", updates,
                   " updates) than this checkpoint's step ", manifest.step));
      }
      if (is_shard) shards[std::stoi(m[2].str())][std::stoi(m[1].str())] = bytes;
    }
  }
  for (auto& [index, by_rank] : shards) {
    std::vector<torch::serialize::InputArchive> archives(by_rank.size()), beside(by_rank.size());
    std::vector<torch::serialize::InputArchive*> pointers;
    size_t k = 0;
    for (auto& [rank, bytes] : by_rank) {
      archives[k] = detail::archive_from_bytes(bytes, dir);
      torch::serialize::InputArchive* fused = detail::fused_state_in(archives[k], beside[k]);
      if (!fused) {
        refuse(dir, str("rank_", rank, "/optimizer_", index, ".pt"),
               "holds no fused optimizer state, which every ZeRO shard has");
      }
      pointers.push_back(fused);
      ++k;
    }
    try {
      // Stage 3's files are each process's state of its shares; stages 1-2's are shards.
      const detail::SavedShares saved = detail::saved_shares(archives[0], dir);
      torch::serialize::OutputArchive merged;
      if (saved.processes > 0) {
        detail::merge_share_states(pointers, saved.slots, merged);
      } else {
        merge_optimizer_shards(pointers, merged);
      }
    } catch (const Error& e) {
      refuse(dir, str("rank_<r>/optimizer_", index, ".pt"),
             str("(the shards of optimizer ", index, ") do not belong together: ", e.what()));
    }
  }
  return manifest;
}

}  // namespace accelerant
