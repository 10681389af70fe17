// save_training_state: the saving half of the protocol (training_checkpoint.h), one step per
// function: name the target, prepare the temporary directory, write this process's part, agree
// on what every process wrote, seal (manifest, rename), prune old automatic checkpoints.
#include <stdio.h>

#include <ctime>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>

#include "accelerant/error.h"
#include "accelerant/version.h"
#include "base/text.h"
#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/model_by_blocks.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"
#include "checkpoint/stream_positions.h"
#include "checkpoint/training_checkpoint.h"

namespace accelerant::detail {
namespace {

using nlohmann::json;

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string strip_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string partial_dir_for(const std::string& dir) {
  return parent_of(dir) + "/." + base_name(dir) + ".partial";
}

bool ends_with(const std::string& name, const std::string& tail) {
  return name.size() > tail.size() &&
         name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// The requested directory, or the next automatic checkpoint_<n> as the main process numbers it.
std::string target_dir(const CheckpointRanks& ranks, const SaveRequest& request) {
  std::string dir = strip_trailing_slashes(request.dir);
  if (!dir.empty()) return dir;
  if (request.checkpoints_dir.empty()) {
    throw CheckpointError(
        str(ranks.rank_prefix, "save_state() without a directory needs a project ",
            "directory. Fix: pass one, save_state(\"ckpt/step_100\"), or set ",
            "AcceleratorOptions().project_dir(\"runs/exp1\") for automatic names."));
  }
  int64_t next = 0;
  if (ranks.is_main()) {
    if (auto latest = latest_checkpoint(request.checkpoints_dir))
      next = checkpoint_iteration(*latest) + 1;
  }
  next = ranks.communicator->broadcast_value(next);
  return str(request.checkpoints_dir, "/checkpoint_", next);
}

// The weights of the models with sharded blocks (ZeRO stage 3), each streamed by the main process
// into model_weights_file(i) while every process gathers its blocks in turn. A collective, so
// every process walks every such model even after the main process's writing failed; the failure
// is kept, to be reported with the main process's part.
struct StreamedModels {
  std::vector<CheckpointFileEntry> files;  // on the main process
  std::exception_ptr failure;
};

StreamedModels stream_sharded_models(const CheckpointedState& s, const CheckpointRanks& ranks,
                                     const std::string& partial) {
  StreamedModels streamed;
  for (size_t i = 0; i < s.models.size(); ++i) {
    const torch::nn::Module& model = *s.models[i];
    if (!has_sharded_blocks(model)) continue;
    const std::string name = layout::model_weights_file(i);
    std::unique_ptr<SafetensorsFileWriter> writer;
    try {
      if (ranks.is_main() && !streamed.failure) {
        std::vector<TensorLayout> layouts;
        for (const auto& [tensor_name, tensor] : model_tensors_in_file_order(model))
          layouts.push_back(layout_of(tensor_name, tensor));
        writer = std::make_unique<SafetensorsFileWriter>(partial + "/" + name, std::move(layouts),
                                                         str("model ", i, "'s weights"));
      }
    } catch (...) {
      streamed.failure = std::current_exception();
    }
    try {
      visit_model_by_blocks(model, /*keep=*/false, [&](const std::string&, torch::Tensor& tensor) {
        if (writer) writer->write(tensor);
      });
      if (writer) {
        writer->commit();
        streamed.files.push_back({name, writer->size(), writer->crc32()});
      }
    } catch (...) {
      if (!streamed.failure) streamed.failure = std::current_exception();
    }
  }
  return streamed;
}

// This process's files in `partial`: its random generators, and on the main process everything
// else (with the models `streamed` wrote already). Returns what it wrote, as the manifest lists it.
std::vector<CheckpointFileEntry> write_own_part(const CheckpointedState& s,
                                                const CheckpointRanks& ranks,
                                                const std::string& partial,
                                                const StreamedModels& streamed) {
  if (streamed.failure) std::rethrow_exception(streamed.failure);
  std::vector<CheckpointFileEntry> written = streamed.files;
  auto write = [&](const std::string& name, const std::string& bytes,
                   const std::string& description) {
    const uint32_t crc = write_file_durably(partial + "/" + name, bytes, description);
    written.push_back({name, bytes.size(), crc});
  };
  const std::string rank_dir = str(partial, "/rank_", ranks.rank);
  make_directories(rank_dir);
  write(layout::rng_file(ranks.rank), rng_state_bytes(), "the random generator state");
  // Saved in the middle of gradient accumulation, the gradients hold micro-steps that the next
  // optimizer step still needs; without them a resumed run would end with other weights.
  const std::string gradients = pending_gradient_bytes(s.models);
  if (!gradients.empty()) {
    write(layout::gradients_file(ranks.rank), gradients, "the accumulated gradients");
  }
  for (size_t i = 0; i < s.streams.size(); ++i) {
    const StreamLoader& stream = s.streams[i];
    write(layout::stream_file(ranks.rank, i),
          format_stream_position(
              {stream.position(), ranks.rank, ranks.world_size, stream.shards().size()}),
          str("stream loader ", i, "'s position"));
  }
  // Under ZeRO each rank holds a shard of the optimizer state (stage 3: the state of its
  // shares): each writes its own.
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    const CheckpointedOptimizer& o = s.optimizers[i];
    if (o.updates_shares) {
      write(
          layout::optimizer_shard_file(ranks.rank, i),
          share_optimizer_state_bytes(*o.optimizer, o.fused.get(), ranks.world_size, o.share_slots),
          str("optimizer ", i, "'s state of this process's shares"));
    } else if (optimizer_sharded(*o.optimizer, o.fused.get())) {
      write(layout::optimizer_shard_file(ranks.rank, i),
            optimizer_state_bytes(*o.optimizer, o.fused.get()), str("optimizer ", i, "'s shard"));
    }
  }
  sync_directory(rank_dir);
  if (!ranks.is_main()) return written;
  for (size_t i = 0; i < s.models.size(); ++i) {
    if (has_sharded_blocks(*s.models[i])) continue;  // streamed
    write(layout::model_file(i), module_state_bytes(*s.models[i]), str("model ", i));
  }
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    const CheckpointedOptimizer& o = s.optimizers[i];
    if (o.updates_shares || optimizer_sharded(*o.optimizer, o.fused.get())) continue;
    write(layout::optimizer_file(i), optimizer_state_bytes(*o.optimizer, o.fused.get()),
          str("optimizer ", i));
  }
  if (s.state->scaler) {
    write(layout::kScalerFile,
          archive_to_bytes([&](torch::serialize::OutputArchive& a) { s.state->scaler->save(a); }),
          "the fp16 loss scaler");
  }
  for (size_t i = 0; i < s.objects.size(); ++i) {
    write(layout::custom_file(i), archive_to_bytes(s.objects[i].save),
          str("registered object ", i));
  }
  write(layout::kStateFile, format_checkpoint_state(training_state_now(s)), "the training state");
  return written;
}

// Every process writes its part; every process learns every file written, or the failures.
std::vector<CheckpointFileEntry> write_every_part(const CheckpointedState& s,
                                                  const CheckpointRanks& ranks,
                                                  const std::string& dir,
                                                  const std::string& partial) {
  const StreamedModels streamed = stream_sharded_models(s, ranks, partial);
  const auto reports = outcomes_everywhere(ranks, [&] {
    json list = json::array();
    for (const auto& e : write_own_part(s, ranks, partial, streamed)) {
      list.push_back({{"path", e.path}, {"size", e.size}, {"crc32", e.crc32}});
    }
    return list.dump();
  });
  if (!reports.failures.empty()) {
    if (ranks.is_main()) remove_tree_quietly(partial);
    throw CheckpointError(
        str(ranks.rank_prefix, "save_state(", dir, ") failed on ", reports.failures.size(), " of ",
            ranks.world_size, " process(es); ",
            path_exists(dir) ? "the checkpoint there " : "the earlier checkpoints ",
            "were not touched:\n  ", join(reports.failures, "\n  ")),
        dir);
  }
  std::vector<CheckpointFileEntry> all_files;
  for (const auto& report : reports.results) {
    for (const auto& e : json::parse(report)) {
      all_files.push_back({e.at("path").get<std::string>(), e.at("size").get<uint64_t>(),
                           e.at("crc32").get<uint32_t>()});
    }
  }
  return all_files;
}

CheckpointManifest manifest_now(const CheckpointedState& s, const CheckpointRanks& ranks,
                                std::vector<CheckpointFileEntry> files) {
  CheckpointManifest m;
  m.accelerant_version = kVersion;
  m.libtorch_version = torch_version();
  m.created = now_utc();
  m.world_size = ranks.world_size;
  m.step = s.state->optimizer_steps;
  m.epoch = !s.loaders.empty()   ? s.loaders.front().position().epoch
            : !s.streams.empty() ? s.streams.front().position().epoch
                                 : 0;
  m.models = static_cast<int>(s.models.size());
  m.optimizers = static_cast<int>(s.optimizers.size());
  m.schedulers = static_cast<int>(s.schedulers.size());
  m.data_loaders = static_cast<int>(s.loaders.size());
  m.custom_objects = static_cast<int>(s.objects.size());
  m.scaler = s.state->scaler != nullptr;
  m.files = std::move(files);
  return m;
}

// On the main process: checks that every rank's files are there, writes the manifest last and
// renames the directory into place, which makes the checkpoint visible, complete.
void seal(const CheckpointManifest& manifest, const std::string& partial, const std::string& dir) {
  for (int rank = 0; rank < manifest.world_size; ++rank) {
    if (!path_exists(partial + "/" + layout::rng_file(rank))) {
      throw CheckpointError(
          str("rank ", rank, "'s files are not in ", partial,
              " as the main process sees it. Likely cause: the ",
              "directory is not on a file system every process shares (each machine wrote its own ",
              "copy). Fix: save to a shared file system (NFS, Lustre, ...)."));
    }
  }
  write_file_durably(partial + "/" + layout::kManifestFile, format_checkpoint_manifest(manifest),
                     "the manifest");
  sync_directory(partial);
  publish_directory(partial, dir);
}

// After an automatic save: what killed saves and removals left, and checkpoints beyond the limit.
void prune_automatic_checkpoints(const std::string& root, int total_limit) {
  for (const auto& name : list_directory(root)) {
    if (name[0] == '.' && (ends_with(name, ".partial") || ends_with(name, ".removing"))) {
      remove_tree_quietly(root + "/" + name);
    }
  }
  if (total_limit <= 0) return;
  auto all = list_checkpoints(root);
  const size_t keep = static_cast<size_t>(total_limit);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    // Hidden first, in one rename, so that a removal cut short never leaves a checkpoint_<n>
    // that looks complete but is not.
    const std::string hidden = root + "/." + base_name(all[i]) + ".removing";
    if (::rename(all[i].c_str(), hidden.c_str()) == 0) remove_tree_quietly(hidden);
  }
}

}  // namespace

std::string checkpoints_dir_of(const std::string& project_dir) {
  return project_dir.empty() ? "" : strip_trailing_slashes(project_dir) + "/checkpoints";
}

std::string save_training_state(const CheckpointedState& state, const CheckpointRanks& ranks,
                                const SaveRequest& request) {
  const std::string dir = target_dir(ranks, request);
  const std::string partial = partial_dir_for(dir);
  const std::string what = "save_state(" + dir + ")";
  auto on_every_process_or_clean_up = [&](const std::string& step_name,
                                          const std::function<void()>& step) {
    try {
      on_every_process(ranks, what + step_name, [&] {
        if (ranks.is_main()) step();
      });
    } catch (const CheckpointError&) {
      if (ranks.is_main()) remove_tree_quietly(partial);
      throw;
    }
  };
  on_every_process_or_clean_up(": preparing " + partial, [&] {
    make_directories(parent_of(dir));
    remove_tree_quietly(partial);  // left by a save that crashed
    make_directories(partial);
  });
  auto files = write_every_part(state, ranks, dir, partial);
  on_every_process_or_clean_up(
      ": finishing", [&] { seal(manifest_now(state, ranks, std::move(files)), partial, dir); });
  // Only now that the new checkpoint is complete may old ones go.
  if (request.dir.empty() && ranks.is_main())
    prune_automatic_checkpoints(request.checkpoints_dir, request.total_limit);
  return dir;
}

}  // namespace accelerant::detail
