// The save/load protocol of a whole training state between processes, apart from the Accelerator
// (as Accelerate keeps checkpointing.py apart from accelerator.py): the Accelerator fills a
// CheckpointedState with what it prepared and calls these functions; they know nothing of it.
// The directory layout is in accelerant/checkpoint.h, the pieces' formats in state_pieces.h.
//
// Saving: the main process makes a hidden temporary directory beside the target; every process
// writes and fsyncs its files into it and reports their sizes and checksums; the main process
// writes manifest.json last and renames the directory into place. Every step ends with an
// exchange of outcomes (every_process.h), so a failure on any process fails the save on all of
// them, and the target is only ever replaced by a complete checkpoint.
//
// Loading: every process reads and checks everything it will use before changing anything, the
// processes agree that all of them can load, then each applies the state with a snapshot to
// roll back to if applying fails anywhere.
#pragma once
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accelerant/accelerator_options.h"
#include "accelerant/checkpoint.h"
#include "accelerant/data_loader.h"
#include "accelerant/fused_optimizer.h"
#include "accelerant/gradient_reducer.h"
#include "accelerant/prepared_optimizer.h"
#include "accelerant/stream_loader.h"
#include "accelerant/training_state.h"
#include "checkpoint/every_process.h"
#include "train/share_state.h"

namespace accelerant::detail {

/// An object registered with register_for_checkpointing: saved by the main process, loaded on all.
struct RegisteredObject {
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

/// One optimizer and the fused update prepare bound to it (null: it steps by itself).
struct CheckpointedOptimizer {
  torch::optim::Optimizer* optimizer = nullptr;
  std::shared_ptr<FusedUpdater> fused;
  // Under ZeRO: the reducer whose shares the fused update is restricted to (not saved; kept so
  // that preparing the optimizer again gets the same all-gather).
  GradientReducer* zero_reducer = nullptr;
  // ZeRO stage 3: the optimizer updates this process's shares of the sharded blocks (and the
  // replicated parameters), so each process saves its whole state, laid out as `share_slots`
  // say; a load on another layout re-cuts it (train/share_state.h).
  bool updates_shares = false;
  std::vector<ShareSlot> share_slots;
};

/// Everything a checkpoint holds, in prepare order; the objects behind the pointers outlive
/// every call that is given this. The Accelerator keeps one and adds to it as it prepares.
struct CheckpointedState {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<CheckpointedOptimizer> optimizers;
  std::vector<PreparedScheduler> schedulers;  // copies share their counters with the user's
  std::vector<DataLoader> loaders;            // copies share their position with the user's
  std::vector<StreamLoader> streams;          // each rank saves its own stream positions
  std::vector<RegisteredObject> objects;
  /// The step counters and the fp16 scaler (when there is one).
  std::shared_ptr<TrainingState> state;
  /// Where the scaler's tensors live.
  torch::Device device = torch::kCPU;
  /// Named when a checkpoint's scaler does not fit this run.
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  /// The loaders of the checkpoint loaded last: one prepared after the load takes its position
  /// from here (auto_resume loads before every loader is prepared).
  std::vector<CheckpointLoaderState> loaded_loaders;
  /// This rank's stream positions in the checkpoint loaded last, for streams prepared after it.
  std::vector<StreamPosition> loaded_streams;
};

/// The counters and data positions now, as state.json holds them.
CheckpointTrainingState training_state_now(const CheckpointedState& state);

/// Where a save goes.
struct SaveRequest {
  /// The checkpoint directory; empty: checkpoint_<n> under `checkpoints_dir`, n one past the
  /// newest.
  std::string dir;
  /// checkpoints_dir_of(project_dir); empty without a project directory.
  std::string checkpoints_dir;
  /// Automatic checkpoints kept (older ones removed after a save succeeded); 0 keeps all.
  int total_limit = 0;
};

/// <project_dir>/checkpoints, or "" without a project directory.
std::string checkpoints_dir_of(const std::string& project_dir);

/// Saves `state` (a collective: call on every process, between steps). Returns the directory
/// written. Throws CheckpointError on every process when any could not write its part; the
/// previous checkpoint at the target, if any, is then as it was.
std::string save_training_state(const CheckpointedState& state, const CheckpointRanks& ranks,
                                const SaveRequest& request);

/// What load_training_state loaded: from where, and saved by how many processes.
struct LoadedFrom {
  std::string dir;
  int saved_world_size = 1;  ///< another than this run's: the data positions were re-sharded
};

/// Loads the checkpoint in `dir` (empty: the newest complete one in `checkpoints_dir`) into
/// `state` (a collective). Checks everything on every process first; a problem anywhere throws
/// CheckpointError on every process and leaves every object as it was.
LoadedFrom load_training_state(CheckpointedState& state, const CheckpointRanks& ranks,
                               const std::string& dir, const std::string& checkpoints_dir);

/// Makes every process's training state the one process `source` holds (a collective): its
/// models, optimizers, schedulers, scaler, step counters, loader positions and registered objects
/// are broadcast and applied as a load applies a checkpoint's (checked first on every process;
/// a failure anywhere changes nothing anywhere). Each process keeps its own random generators.
/// Throws CheckpointError on every process when the state is not the same kind on every process:
/// ZeRO-sharded optimizers or models, stream loaders, gradients of a step in progress.
void broadcast_training_state(CheckpointedState& state, const CheckpointRanks& ranks, int source);

/// verify_checkpoint without reading the files: the manifest, each file's role, that each exists
/// (not through a link) with the listed size. A load checks the contents as it reads each file,
/// once (read_checked_file), instead of reading every file twice.
CheckpointManifest verify_checkpoint_layout(const std::string& dir);
/// DIR/NAME's bytes, checked against the manifest's size and CRC-32. Throws verify_checkpoint's
/// CheckpointError, naming the file, when they differ or the manifest does not list it.
std::string read_checked_file(const std::string& dir, const CheckpointManifest& manifest,
                              const std::string& name);
/// read_checked_file's checks without keeping the bytes: the file read a few MiB at a time (a
/// model's weights, mapped afterwards).
void check_listed_file(const std::string& dir, const CheckpointManifest& manifest,
                       const std::string& name);

/// The newest checkpoint in `checkpoints_dir` that verifies (newest_verified_checkpoint) as the
/// main process sees it, the same on every process (a collective); "" when there is none. The
/// main process prints a warning to stderr naming every newer checkpoint it skipped and why.
/// `failed`: checkpoints a load already failed on, passed over (with their reasons, for the
/// warning). Throws CheckpointError when `checkpoints_dir` is empty (no project directory).
std::string agreed_latest_checkpoint(
    const CheckpointRanks& ranks, const std::string& checkpoints_dir,
    const std::vector<std::pair<std::string, std::string>>& failed = {});

/// The newest checkpoint_<n> in `checkpoints_dir` with a manifest whose files all verify
/// (verify_checkpoint) and that is not in `failed` (dir, reason); "" when none does. Each newer
/// one passed over is added to `*skipped` with the reason (no manifest.json, verify_checkpoint's
/// message, or the failed load's), newest first.
std::string newest_verified_checkpoint(
    const std::string& checkpoints_dir, std::vector<std::string>* skipped,
    const std::vector<std::pair<std::string, std::string>>& failed = {});

}  // namespace accelerant::detail
