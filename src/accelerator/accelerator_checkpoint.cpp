// Accelerator::save_state / load_state: the protocol between the processes. The file formats are
// in checkpoint/state_pieces.cpp and checkpoint/manifest.cpp, the file-system steps in
// checkpoint/durable_files.cpp.
//
// Saving: the main process makes a hidden temporary directory beside the target; every process
// writes and fsyncs its files into it and reports their sizes and checksums; the main process
// writes manifest.json last and renames the directory into place. Every step ends with an
// exchange of outcomes, so a failure on any process fails save_state on all of them, and the
// target is only ever replaced by a complete checkpoint.
//
// Loading: every process reads and checks everything it will use before changing anything, the
// processes agree that all of them can load, then each applies the state with a snapshot to
// roll back to if applying fails anywhere.
#include <nlohmann/json.hpp>

#include <stdio.h>

#include <cstring>
#include <ctime>

#include "accelerant/accelerator.h"
#include "accelerant/checkpoint.h"
#include "accelerant/safetensors.h"
#include "accelerant/error.h"
#include "accelerant/version.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/state_pieces.h"
#include "base/file_io.h"
#include "base/text.h"

namespace accelerant {
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
  return detail::parent_of(dir) + "/." + detail::base_name(dir) + ".partial";
}

std::string model_file(size_t i) { return detail::str("model_", i, ".pt"); }
std::string optimizer_file(size_t i) { return detail::str("optimizer_", i, ".pt"); }
std::string custom_file(size_t i) { return detail::str("custom_", i, ".pt"); }
std::string rng_file(int rank) { return detail::str("rank_", rank, "/rng.pt"); }
const char* kStateFile = "state.json";
const char* kScalerFile = "scaler.pt";

json entries_json(const std::vector<CheckpointFileEntry>& entries) {
  json list = json::array();
  for (const auto& e : entries) list.push_back({{"path", e.path}, {"size", e.size}, {"crc32", e.crc32}});
  return list;
}

}  // namespace

// Everything one process read from a checkpoint, checked, ready to apply.
struct Accelerator::LoadedCheckpoint {
  std::string dir;
  CheckpointManifest manifest;
  CheckpointTrainingState state;
  std::vector<std::string> models, optimizers, custom_objects;  // archives, as bytes
  std::string scaler;
  std::string rng;  // empty: this rank did not exist when it was saved
};

Accelerator::ProcessOutcomes Accelerator::outcomes_everywhere(const std::function<std::string()>& step) {
  std::string outcome;
  try {
    outcome = "ok:" + step();
  } catch (const std::exception& e) {
    outcome = std::string("error:") + e.what();
  }
  ProcessOutcomes all;
  const auto reports = communicator().gather_bytes(outcome);
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    const bool ok = reports[rank].rfind("ok:", 0) == 0;
    all.results.push_back(ok ? reports[rank].substr(3) : "");
    if (!ok) {
      const std::string prefix = rank_prefix(static_cast<int>(rank), static_cast<int>(reports.size()));
      all.failures.push_back(prefix + reports[rank].substr(6));
    }
  }
  return all;
}

void Accelerator::on_every_process(const std::string& what, const std::function<void()>& step) {
  const auto failures = outcomes_everywhere([&] {
                          step();
                          return std::string();
                        }).failures;
  if (!failures.empty()) {
    throw CheckpointError(detail::str(rank_prefix_, what, " failed on ", failures.size(), " of ", num_processes_,
                                      " process(es):\n  ", detail::join(failures, "\n  ")));
  }
}

std::string Accelerator::checkpoints_dir() const {
  return options_.project_dir().empty() ? "" : strip_trailing_slashes(options_.project_dir()) + "/checkpoints";
}

void Accelerator::register_checkpoint_object(std::function<void(torch::serialize::OutputArchive&)> save,
                                             std::function<void(torch::serialize::InputArchive&)> load) {
  checkpoint_objects_.push_back({std::move(save), std::move(load)});
}

// ---- model weights as safetensors --------------------------------------------------------------

void Accelerator::save_model_module(const torch::nn::Module& module, const std::string& dir,
                                    const std::string& max_shard_size) {
  const int64_t max_bytes = parse_byte_size(max_shard_size);  // same text on every rank: throws on all
  on_every_process("save_model into " + dir, [&] {
    if (is_main_process()) save_model_safetensors(module, dir, max_bytes);
  });
}

void Accelerator::load_model_module(torch::nn::Module& module, const std::string& dir) {
  on_every_process("load_model from " + dir, [&] { load_model_safetensors(module, dir); });
}

// ---- save ------------------------------------------------------------------------------------

std::string Accelerator::save_state(const std::string& requested_dir) {
  // A save before the first batch under auto_resume saves the resumed state, not the fresh one.
  state_->run_pending_resume();
  std::string dir = strip_trailing_slashes(requested_dir);
  const bool automatic = dir.empty();
  if (automatic) {
    if (options_.project_dir().empty()) {
      throw CheckpointError(detail::str(rank_prefix_, "save_state() without a directory needs a project ",
                                        "directory. Fix: pass one, save_state(\"ckpt/step_100\"), or set ",
                                        "AcceleratorOptions().project_dir(\"runs/exp1\") for automatic names."));
    }
    int64_t next = 0;
    if (is_main_process()) {
      if (auto latest = latest_checkpoint(checkpoints_dir())) next = checkpoint_iteration(*latest) + 1;
    }
    next = communicator().broadcast_value(next);
    dir = detail::str(checkpoints_dir(), "/checkpoint_", next);
  }
  const std::string partial = partial_dir_for(dir);
  const std::string what = "save_state(" + dir + ")";
  auto remove_partial = [&] {
    if (is_main_process()) detail::remove_tree_quietly(partial);
  };

  try {
    on_every_process(what + ": preparing " + partial, [&] {
      if (!is_main_process()) return;
      detail::make_directories(detail::parent_of(dir));
      detail::remove_tree_quietly(partial);  // left by a save that crashed
      detail::make_directories(partial);
    });
  } catch (const CheckpointError&) {
    remove_partial();
    throw;
  }

  // Every process writes its own part and reports what it wrote.
  std::vector<CheckpointFileEntry> written;
  auto write = [&](const std::string& name, const std::string& bytes, const std::string& description) {
    detail::write_file_durably(partial + "/" + name, bytes, description);
    written.push_back({name, bytes.size(), detail::crc32_of(bytes)});
  };
  const auto reports = outcomes_everywhere([&] {
    const std::string rank_dir = detail::str(partial, "/rank_", process_index_);
    detail::make_directories(rank_dir);
    write(rng_file(process_index_), detail::rng_state_bytes(), "the random generator state");
    detail::sync_directory(rank_dir);
    if (is_main_process()) {
      for (size_t i = 0; i < models_.size(); ++i) {
        write(model_file(i), detail::module_state_bytes(*models_[i].module), detail::str("model ", i));
      }
      for (size_t i = 0; i < optimizers_.size(); ++i) {
        write(optimizer_file(i), detail::optimizer_state_bytes(*optimizers_[i], fused_updaters_[i].get()),
              detail::str("optimizer ", i));
      }
      if (state_->scaler) {
        write(kScalerFile,
              detail::archive_to_bytes([&](torch::serialize::OutputArchive& a) { state_->scaler->save(a); }),
              "the fp16 loss scaler");
      }
      for (size_t i = 0; i < checkpoint_objects_.size(); ++i) {
        write(custom_file(i), detail::archive_to_bytes(checkpoint_objects_[i].save),
              detail::str("registered object ", i));
      }
      write(kStateFile, format_checkpoint_state(training_state_now()), "the training state");
    }
    return entries_json(written).dump();
  });
  const auto& failures = reports.failures;
  std::vector<CheckpointFileEntry> all_files;
  for (const auto& report : reports.results) {
    if (report.empty()) continue;  // that rank failed
    for (const auto& e : json::parse(report)) {
      all_files.push_back({e.at("path").get<std::string>(), e.at("size").get<uint64_t>(),
                           e.at("crc32").get<uint32_t>()});
    }
  }
  if (!failures.empty()) {
    remove_partial();
    throw CheckpointError(detail::str(rank_prefix_, what, " failed on ", failures.size(), " of ", num_processes_,
                                      " process(es); ", detail::path_exists(dir) ? "the checkpoint there " : "the earlier checkpoints ",
                                      "were not touched:\n  ", detail::join(failures, "\n  ")),
                          dir);
  }

  // The main process seals it: the manifest last, then the rename that makes it visible.
  try {
    on_every_process(what + ": finishing", [&] {
      if (!is_main_process()) return;
      for (int rank = 0; rank < num_processes_; ++rank) {
        if (!detail::path_exists(partial + "/" + rng_file(rank))) {
          throw CheckpointError(detail::str(
              "rank ", rank, "'s files are not in ", partial, " as the main process sees it. Likely cause: the ",
              "directory is not on a file system every process shares (each machine wrote its own copy). Fix: ",
              "save to a shared file system (NFS, Lustre, ...)."));
        }
      }
      CheckpointManifest m;
      m.accelerant_version = kVersion;
      m.libtorch_version = torch_version();
      m.created = now_utc();
      m.world_size = num_processes_;
      m.step = state_->optimizer_steps;
      m.epoch = loaders_.empty() ? 0 : loaders_.front().position().epoch;
      m.models = static_cast<int>(models_.size());
      m.optimizers = static_cast<int>(optimizers_.size());
      m.schedulers = static_cast<int>(schedulers_.size());
      m.data_loaders = static_cast<int>(loaders_.size());
      m.custom_objects = static_cast<int>(checkpoint_objects_.size());
      m.scaler = state_->scaler != nullptr;
      m.files = all_files;
      detail::write_file_durably(partial + "/manifest.json", format_checkpoint_manifest(m), "the manifest");
      detail::sync_directory(partial);
      detail::publish_directory(partial, dir);
    });
  } catch (const CheckpointError&) {
    remove_partial();
    throw;
  }

  // Only now that the new checkpoint is complete may old ones go.
  if (automatic && is_main_process()) {
    const std::string root = checkpoints_dir();
    auto ends_with = [](const std::string& name, const std::string& tail) {
      return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (const auto& name : detail::list_directory(root)) {
      // Left by saves or removals that were killed half-way.
      if (name[0] == '.' && (ends_with(name, ".partial") || ends_with(name, ".removing"))) {
        detail::remove_tree_quietly(root + "/" + name);
      }
    }
    if (options_.checkpoint_total_limit() > 0) {
      auto all = list_checkpoints(root);
      const size_t keep = static_cast<size_t>(options_.checkpoint_total_limit());
      for (size_t i = 0; i + keep < all.size(); ++i) {
        // Hidden first, in one rename, so that a removal cut short never leaves a checkpoint_<n>
        // that looks complete but is not.
        const std::string hidden = root + "/." + detail::base_name(all[i]) + ".removing";
        if (::rename(all[i].c_str(), hidden.c_str()) == 0) detail::remove_tree_quietly(hidden);
      }
    }
  }
  return dir;
}

// ---- load ------------------------------------------------------------------------------------

std::string Accelerator::load_state(const std::string& requested_dir) {
  state_->pending_resume = nullptr;  // an explicit load replaces auto_resume's
  std::string dir = strip_trailing_slashes(requested_dir);
  if (dir.empty()) {
    if (options_.project_dir().empty()) {
      throw CheckpointError(detail::str(rank_prefix_, "load_state() without a directory needs a project ",
                                        "directory to find the newest checkpoint in. Fix: pass the checkpoint's ",
                                        "directory, or set AcceleratorOptions().project_dir(...)."));
    }
    auto latest = latest_checkpoint(checkpoints_dir());
    if (!latest) {
      throw CheckpointError(detail::str(rank_prefix_, "load_state(): no complete checkpoint in ", checkpoints_dir(),
                                        ". Fix: save one first (save_state()), or check project_dir."),
                            checkpoints_dir());
    }
    dir = *latest;
  }
  const std::string what = "load_state(" + dir + ")";

  // 1. Read and check everything; nothing changes yet.
  LoadedCheckpoint loaded;
  loaded.dir = dir;
  on_every_process(what + ": checking the checkpoint", [&] {
    loaded.manifest = verify_checkpoint(dir);
    const CheckpointManifest& m = loaded.manifest;
    std::vector<std::string> problems;
    auto count = [&](const char* noun, int saved, size_t here) {
      if (static_cast<size_t>(saved) != here) {
        problems.push_back(detail::str("it has ", saved, " ", noun, ", this run prepared ", here));
      }
    };
    count("model(s)", m.models, models_.size());
    count("optimizer(s)", m.optimizers, optimizers_.size());
    count("scheduler(s)", m.schedulers, schedulers_.size());
    count("registered object(s)", m.custom_objects, checkpoint_objects_.size());
    if (static_cast<size_t>(m.data_loaders) < loaders_.size()) {
      problems.push_back(detail::str("it has ", m.data_loaders, " data loader(s), this run prepared ", loaders_.size()));
    }
    if (m.scaler != (state_->scaler != nullptr)) {
      problems.push_back(detail::str("it was saved ", m.scaler ? "with" : "without", " the fp16 loss scaler, this run has ",
                                     "mixed_precision ", to_string(settings_.mixed_precision)));
    }
    if (!problems.empty()) {
      throw CheckpointError(detail::str(dir, " does not fit this run: ", detail::join(problems, "; "),
                                        ". Fix: prepare the same objects, in the same order, with the same ",
                                        "mixed precision as the run that saved it."),
                            dir);
    }
    auto read = [&](const std::string& name) { return detail::read_file(dir + "/" + name); };
    for (size_t i = 0; i < models_.size(); ++i) {
      loaded.models.push_back(read(model_file(i)));
      auto mismatches = detail::module_state_mismatches(*models_[i].module, loaded.models.back(),
                                                        dir + "/" + model_file(i));
      if (!mismatches.empty()) {
        throw CheckpointError(detail::str("model ", i, " does not match ", dir, "/", model_file(i), ": ",
                                          detail::join(mismatches, "; "), ". Fix: build the model as the run ",
                                          "that saved it did (same layers and sizes)."),
                              dir + "/" + model_file(i));
      }
    }
    for (size_t i = 0; i < optimizers_.size(); ++i) loaded.optimizers.push_back(read(optimizer_file(i)));
    for (size_t i = 0; i < checkpoint_objects_.size(); ++i) loaded.custom_objects.push_back(read(custom_file(i)));
    if (m.scaler) loaded.scaler = read(kScalerFile);
    if (process_index_ < m.world_size) loaded.rng = read(rng_file(process_index_));
    loaded.state = read_checkpoint_state(dir);
    if (loaded.state.scheduler_steps.size() != schedulers_.size() ||
        loaded.state.data_loaders.size() != static_cast<size_t>(m.data_loaders)) {
      throw CheckpointError(detail::str(dir, "/", kStateFile, " disagrees with the manifest about the schedulers ",
                                        "or data loaders. Fix: use another checkpoint."),
                            dir + "/" + kStateFile);
    }
    for (size_t i = 0; i < loaders_.size(); ++i) {
      if (loaded.state.data_loaders[i].dataset_size != loaders_[i].dataset_size()) {
        throw CheckpointError(detail::str("data loader ", i, " was saved over ", loaded.state.data_loaders[i].dataset_size,
                                          " samples, this run's has ", loaders_[i].dataset_size(),
                                          ". Fix: prepare the same datasets, in the same order, as the run that ",
                                          "saved it."),
                              dir + "/" + kStateFile);
      }
    }
  });

  // 2. Apply, everywhere or nowhere.
  const LoadedCheckpoint before = snapshot_for_rollback();
  const auto failures = outcomes_everywhere([&] {
                          apply_checkpoint(loaded);
                          return std::string();
                        }).failures;
  if (!failures.empty()) {
    apply_checkpoint(before);
    throw CheckpointError(detail::str(rank_prefix_, what, " failed while applying it on ", failures.size(), " of ",
                                      num_processes_, " process(es); every object was put back as it was:\n  ",
                                      detail::join(failures, "\n  ")),
                          dir);
  }
  if (is_main_process() && loaded.manifest.world_size != num_processes_) {
    std::printf("load_state: %s was saved by %d process(es), this run has %d: the data positions continue at the "
                "same sample, re-sharded over %d; ranks without a saved generator keep their own.\n",
                dir.c_str(), loaded.manifest.world_size, num_processes_, num_processes_);
    std::fflush(stdout);
  }
  return dir;
}

CheckpointTrainingState Accelerator::training_state_now() const {
  CheckpointTrainingState state;
  state.optimizer_steps = state_->optimizer_steps;
  state.micro_steps = state_->micro_steps;
  for (const auto& s : schedulers_) state.scheduler_steps.push_back(detail::scheduler_step_count(s.scheduler()));
  for (const auto& l : loaders_) {
    const DataPosition p = l.position();
    state.data_loaders.push_back({p.epoch, p.samples_done, l.dataset_size(), l.sharding().seed(), l.sharding().shuffle()});
  }
  return state;
}

Accelerator::LoadedCheckpoint Accelerator::snapshot_for_rollback() const {
  LoadedCheckpoint now;
  now.dir = "(the state before load_state)";
  now.state = training_state_now();
  for (const auto& m : models_) now.models.push_back(detail::module_state_bytes(*m.module));
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    now.optimizers.push_back(detail::optimizer_state_bytes(*optimizers_[i], fused_updaters_[i].get()));
  }
  for (const auto& o : checkpoint_objects_) now.custom_objects.push_back(detail::archive_to_bytes(o.save));
  if (state_->scaler) {
    now.scaler = detail::archive_to_bytes([&](torch::serialize::OutputArchive& a) { state_->scaler->save(a); });
  }
  now.rng = detail::rng_state_bytes();
  return now;
}

void Accelerator::apply_checkpoint(const LoadedCheckpoint& loaded) {
  for (size_t i = 0; i < models_.size(); ++i) {
    detail::load_module_state(*models_[i].module, loaded.models[i], loaded.dir + "/" + model_file(i));
  }
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    detail::load_optimizer_state(*optimizers_[i], loaded.optimizers[i], loaded.dir + "/" + optimizer_file(i),
                                 fused_updaters_[i].get());
  }
  for (size_t i = 0; i < checkpoint_objects_.size(); ++i) {
    auto archive = detail::archive_from_bytes(loaded.custom_objects[i], loaded.dir + "/" + custom_file(i));
    checkpoint_objects_[i].load(archive);
  }
  if (state_->scaler && !loaded.scaler.empty()) {
    auto archive = detail::archive_from_bytes(loaded.scaler, loaded.dir + "/" + kScalerFile, device_);
    state_->scaler->load(archive);
  }
  const CheckpointTrainingState& state = loaded.state;
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    detail::set_scheduler_step_count(schedulers_[i].scheduler(), state.scheduler_steps[i]);
  }
  state_->optimizer_steps = state.optimizer_steps;
  state_->micro_steps = state.micro_steps;
  for (auto& s : schedulers_) s.resync();
  for (size_t i = 0; i < loaders_.size(); ++i) {
    loaders_[i].set_seed(state.data_loaders[i].seed);
    loaders_[i].set_position({state.data_loaders[i].epoch, state.data_loaders[i].samples_done});
  }
  pending_loaders_ = state.data_loaders;
  if (!loaded.rng.empty()) detail::load_rng_state(loaded.rng, loaded.dir + "/" + rng_file(process_index_));
}

void Accelerator::resume_from_latest() {
  const std::string root = checkpoints_dir();
  if (root.empty()) {
    throw CheckpointError(detail::str(rank_prefix_, "auto_resume needs a project directory to find checkpoints in. ",
                                      "Fix: set AcceleratorOptions().project_dir(...)."));
  }
  // Every process must take the same decision: the main process looks, the others follow.
  std::string latest = is_main_process() ? latest_checkpoint(root).value_or("") : "";
  latest = communicator().broadcast_bytes(latest, 0);
  if (latest.empty()) return;
  load_state(latest);
  print("Resumed from ", latest, " (step ", state_->optimizer_steps, ")");
}

}  // namespace accelerant
