// The checkpoint directory that Accelerator::save_state writes and load_state reads:
//
//   checkpoint_12/
//     manifest.json        format version, versions, world size, step, each file's size and CRC-32
//     state.json           step counters, data positions, scheduler steps (main process)
//     model_0.pt …         weights (main process; tensors on the CPU)
//     model_0.safetensors  instead, under ZeRO stage 3: the weights streamed one block at a time
//     optimizer_0.pt …     optimizer state (main process)
//     scaler.pt            the fp16 loss scaler, when there is one
//     custom_0.pt …        objects registered with register_for_checkpointing (main process)
//     rank_0/rng.pt …      each rank's random generators (written by that rank)
//     rank_0/gradients.pt  a rank's accumulated gradients, only when saved mid-accumulation
//
// A directory with a manifest.json is complete: the manifest is written last, inside a temporary
// directory that is then renamed into place. These functions read and check one without an
// Accelerator (they are what `accelerant checkpoint inspect|verify` runs).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace accelerant {

/// The manifest format this build writes; it reads every version up to this one.
inline constexpr int kCheckpointFormatVersion = 1;

/// One file of a checkpoint as the manifest lists it, with what verify_checkpoint checks.
struct CheckpointFileEntry {
  std::string path;    ///< relative to the checkpoint directory
  uint64_t size = 0;   ///< in bytes
  uint32_t crc32 = 0;  ///< CRC-32 of the contents (8 hex digits in the JSON)
};

/// manifest.json: what a checkpoint holds and who wrote it (written last, by the main process).
struct CheckpointManifest {
  /// The manifest format; this build writes kCheckpointFormatVersion and reads 1 to it.
  int format_version = kCheckpointFormatVersion;
  std::string accelerant_version;  ///< the Accelerant that wrote it, e.g. "0.2.0"
  std::string libtorch_version;    ///< the LibTorch it was built with (TORCH_VERSION)
  std::string created;             ///< UTC, ISO 8601
  /// Processes that saved it (one rank_`<r>` directory each); loading on another number
  /// re-shards the data positions.
  int world_size = 1;
  int64_t step = 0;   ///< optimizer steps taken
  int64_t epoch = 0;  ///< the first prepared loader's (else stream loader's) epoch
  /// Prepared models it holds (model_`<i>`.pt). load_state requires this count, and each of the
  /// four below, to match the run that loads it.
  int models = 0, optimizers = 0, schedulers = 0, data_loaders = 0, custom_objects = 0;
  /// \var optimizers
  /// Prepared optimizers it holds (optimizer_`<i>`.pt).
  /// \var schedulers
  /// Prepared schedulers it holds (their step counts are in state.json).
  /// \var data_loaders
  /// Prepared data loaders it holds (their positions are in state.json).
  /// \var custom_objects
  /// Objects registered with register_for_checkpointing it holds (custom_`<i>`.pt).
  bool scaler = false;  ///< whether scaler.pt (the fp16 loss scaler) is in it
  /// Every file except manifest.json itself, each rank's included.
  std::vector<CheckpointFileEntry> files;
};

/// One prepared data loader in state.json: where it stood, and over what.
struct CheckpointLoaderState {
  int64_t epoch = 0;         ///< the epoch in progress
  int64_t samples_done = 0;  ///< positions of that epoch's order done, across all processes
  int64_t dataset_size = 0;  ///< samples in its dataset: load_state requires the same
  uint64_t seed = 0;         ///< its shuffle seed, restored by load_state
  bool shuffle = false;      ///< whether it shuffled (for inspection; not restored)
};

/// state.json: the counters and data positions (written by the main process).
struct CheckpointTrainingState {
  /// Optimizer steps taken (TrainingState::optimizer_steps).
  int64_t optimizer_steps = 0, micro_steps = 0;
  /// \var micro_steps
  /// Micro-steps counted by Accelerator::accumulate (TrainingState::micro_steps).
  std::vector<unsigned> scheduler_steps;  ///< each prepared scheduler's step count
  /// Each prepared loader, in the order prepare saw them.
  std::vector<CheckpointLoaderState> data_loaders;
};

/// Parses state.json text; `where` names it in errors. Throws CheckpointError naming the field.
CheckpointTrainingState parse_checkpoint_state(const std::string& json_text,
                                               const std::string& where);
/// `state` as the state.json text that parse_checkpoint_state reads (indented JSON).
std::string format_checkpoint_state(const CheckpointTrainingState& state);

/// Parses manifest.json text; `where` names it in errors. Throws CheckpointError for malformed
/// JSON, a missing or mistyped field, or a format version newer than this build reads.
CheckpointManifest parse_checkpoint_manifest(const std::string& json_text,
                                             const std::string& where);
/// `manifest` as the manifest.json text that parse_checkpoint_manifest reads (indented JSON).
std::string format_checkpoint_manifest(const CheckpointManifest& manifest);

/// DIR/manifest.json, parsed. Throws CheckpointError when DIR is not a (complete) checkpoint.
CheckpointManifest read_checkpoint_manifest(const std::string& dir);

/// DIR/state.json, parsed. Throws CheckpointError when it is missing or malformed.
CheckpointTrainingState read_checkpoint_state(const std::string& dir);

/// Reads the manifest and checks every file's size and CRC-32. Throws CheckpointError naming
/// every missing, truncated or corrupted file.
CheckpointManifest verify_checkpoint(const std::string& dir);

/// The complete checkpoints (checkpoint_<n> directories with a manifest) in `checkpoints_dir`,
/// oldest first by n. Interrupted saves (hidden .partial directories) are not listed.
std::vector<std::string> list_checkpoints(const std::string& checkpoints_dir);
/// The newest of them, if any.
std::optional<std::string> latest_checkpoint(const std::string& checkpoints_dir);
/// n of a checkpoint_<n> path, or -1.
int64_t checkpoint_iteration(const std::string& path);

}  // namespace accelerant
