// load_training_state: the loading half of the protocol (training_checkpoint.h), one step per
// function: find the checkpoint, check that it fits, read every piece, then apply everywhere or
// nowhere (a snapshot taken first is what a failed apply rolls back to).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "accelerant/error.h"
#include "base/file_io.h"
#include "base/text.h"
#include "checkpoint/checkpoint_layout.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/model_by_blocks.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"
#include "checkpoint/stream_positions.h"
#include "checkpoint/training_checkpoint.h"
#include "train/fused_state_format.h"

namespace accelerant::detail {
namespace {

// Everything one process read from a checkpoint, checked, ready to apply.
struct LoadedCheckpoint {
  std::string dir;
  CheckpointManifest manifest;
  CheckpointTrainingState state;
  std::vector<std::string> models, optimizers, custom_objects;  // archives, as bytes
  // Per model, where the checkpoint holds its weights as safetensors (saved sharded, ZeRO stage
  // 3): the file, mapped; models[i] is then empty.
  std::vector<std::shared_ptr<MappedModelWeights>> mapped_models;
  // Per model, in a rollback snapshot of a sharded model: its values as this process holds them
  // (its shares); models[i] is then empty.
  std::vector<std::shared_ptr<HeldModelValues>> held_models;
  // Per optimizer: every rank's shard, when a ZeRO run saved it (then optimizers[i] is empty).
  std::vector<std::vector<std::string>> optimizer_shards;
  // Per optimizer: the fused state this process's optimizer takes instead (load_fused_form), where
  // ZeRO stage 3 is on one side only or its layouts differ (re-cut: train/share_state.h);
  // empty where the saved state loads as it is.
  std::vector<std::string> converted;
  std::string scaler;
  std::string rng;  // empty: this rank did not exist when it was saved
  // This rank's gradients; empty: none pending at the save (they are left as they are).
  std::string gradients;
  // This rank's position in each stream loader the checkpoint holds.
  std::vector<StreamPosition> streams;
};

bool lists_file(const CheckpointManifest& m, const std::string& path) {
  for (const auto& f : m.files) {
    if (f.path == path) return true;
  }
  return false;
}

// Accumulated gradients belong to the rank that computed them over its own share of the data;
// on another number of processes neither the shares nor the average over ranks carry over.
void check_gradients_fit_world(const CheckpointManifest& m, const CheckpointRanks& ranks,
                               const std::string& dir) {
  if (m.world_size == ranks.world_size) return;
  for (int r = 0; r < m.world_size; ++r) {
    if (!lists_file(m, layout::gradients_file(r))) continue;
    throw CheckpointError(
        str(dir,
            " was saved with gradients not yet applied (in the middle of gradient "
            "accumulation) by ",
            m.world_size, " process(es) (", layout::gradients_file(r),
            " holds that rank's accumulated gradients), and this run has ", ranks.world_size,
            ". Partial gradients cannot be re-sharded over another number of processes. Fix: "
            "load it on ",
            m.world_size,
            " process(es), or resume from a checkpoint saved at an accumulation boundary (save "
            "only when accelerator.sync_gradients() is true, after the optimizer step)."),
        dir);
  }
}

std::string source_dir(const std::string& requested_dir, const std::string& checkpoints_dir,
                       const CheckpointRanks& ranks) {
  std::string dir = requested_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!dir.empty()) return dir;
  if (checkpoints_dir.empty()) {
    throw CheckpointError(
        str(ranks.rank_prefix, "load_state() without a directory needs a project ",
            "directory to find the newest checkpoint in. Fix: pass the checkpoint's ",
            "directory, or set AcceleratorOptions().project_dir(...)."));
  }
  auto latest = latest_checkpoint(checkpoints_dir);
  if (!latest) {
    throw CheckpointError(
        str(ranks.rank_prefix, "load_state(): no complete checkpoint in ", checkpoints_dir,
            ". Fix: save one first (save_state()), or check project_dir."),
        checkpoints_dir);
  }
  return *latest;
}

// Whether the manifest's counts fit what this run prepared.
void check_counts(const CheckpointManifest& m, const CheckpointedState& s, const std::string& dir) {
  std::vector<std::string> problems;
  auto count = [&](const char* noun, int saved, size_t here) {
    if (static_cast<size_t>(saved) != here) {
      problems.push_back(str("it has ", saved, " ", noun, ", this run prepared ", here));
    }
  };
  count("model(s)", m.models, s.models.size());
  count("optimizer(s)", m.optimizers, s.optimizers.size());
  count("scheduler(s)", m.schedulers, s.schedulers.size());
  count("registered object(s)", m.custom_objects, s.objects.size());
  if (static_cast<size_t>(m.data_loaders) < s.loaders.size()) {
    problems.push_back(
        str("it has ", m.data_loaders, " data loader(s), this run prepared ", s.loaders.size()));
  }
  if (m.scaler != (s.state->scaler != nullptr)) {
    problems.push_back(str("it was saved ", m.scaler ? "with" : "without",
                           " the fp16 loss scaler, this run has ", "mixed_precision ",
                           to_string(s.mixed_precision)));
  }
  if (!problems.empty()) {
    throw CheckpointError(str(dir, " does not fit this run: ", join(problems, "; "),
                              ". Fix: prepare the same objects, in the same order, with the same ",
                              "mixed precision as the run that saved it."),
                          dir);
  }
}

// Whether state.json fits the manifest and this run's datasets.
void check_positions(const LoadedCheckpoint& loaded, const CheckpointedState& s) {
  const std::string& dir = loaded.dir;
  if (loaded.state.scheduler_steps.size() != s.schedulers.size() ||
      loaded.state.data_loaders.size() != static_cast<size_t>(loaded.manifest.data_loaders)) {
    throw CheckpointError(
        str(dir, "/", layout::kStateFile, " disagrees with the manifest about the schedulers ",
            "or data loaders. Fix: use another checkpoint."),
        dir + "/" + layout::kStateFile);
  }
  for (size_t i = 0; i < s.loaders.size(); ++i) {
    if (loaded.state.data_loaders[i].dataset_size != s.loaders[i].dataset_size()) {
      throw CheckpointError(
          str("data loader ", i, " was saved over ", loaded.state.data_loaders[i].dataset_size,
              " samples, this run's has ", s.loaders[i].dataset_size(),
              ". Fix: prepare the same datasets, in the same order, as the run that ", "saved it."),
          dir + "/" + layout::kStateFile);
    }
  }
}

// This rank's stream positions (checkpoint/stream_positions.h), checked against this run.
std::vector<StreamPosition> read_stream_positions(const LoadedCheckpoint& loaded,
                                                  const CheckpointedState& s,
                                                  const CheckpointRanks& ranks) {
  const CheckpointManifest& m = loaded.manifest;
  const std::string& dir = loaded.dir;
  size_t saved = 0;
  while (lists_file(m, layout::stream_file(0, saved))) ++saved;
  if (saved < s.streams.size()) {
    throw CheckpointError(
        str(dir, " holds the positions of ", saved, " stream loader(s), this run prepared ",
            s.streams.size(), ". Fix: prepare the same loaders, in the same order, as the run ",
            "that saved it."),
        dir);
  }
  if (saved == 0) return {};
  if (m.world_size != ranks.world_size) {
    throw CheckpointError(
        str(dir, " was saved by ", m.world_size, " process(es) with stream loaders, and this run ",
            "has ", ranks.world_size, ". A stream's position is each rank's place in its own ",
            "share of the shards, which another number of processes divides differently. Fix: ",
            "resume on ", m.world_size, " process(es)."),
        dir);
  }
  std::vector<StreamPosition> positions;
  for (size_t i = 0; i < saved; ++i) {
    const std::string where = dir + "/" + layout::stream_file(ranks.rank, i);
    const SavedStreamPosition p =
        parse_stream_position(read_checked_file(dir, m, layout::stream_file(ranks.rank, i)), where);
    if (p.rank != ranks.rank || p.world_size != ranks.world_size) {
      throw CheckpointError(
          str(where, " says it belongs to rank ", p.rank, " of ", p.world_size,
              ", but this is rank ", ranks.rank, " of ", ranks.world_size,
              ". Likely cause: the file was moved or edited. Fix: use ", "another checkpoint."),
          where);
    }
    if (i < s.streams.size() && p.shards != s.streams[i].shards().size()) {
      throw CheckpointError(str(where, ": stream loader ", i, " was saved over ", p.shards,
                                " shard(s), this run's has ", s.streams[i].shards().size(),
                                ". Fix: resume with the same shards, in the same order."),
                            where);
    }
    positions.push_back(p.position);
  }
  return positions;
}

// How optimizer file `bytes` was saved (stage 3's processes and slots, or none).
SavedShares saved_shares_of(const std::string& bytes, const std::string& what) {
  auto archive = archive_from_bytes(bytes, what);
  return saved_shares(archive, what);
}

// Whether each process loads its own file as it is: a stage-3 state saved on as many processes,
// with the slots of this run's optimizer.
bool own_shares_load_as_they_are(const SavedShares& saved, const CheckpointedOptimizer& o,
                                 const CheckpointRanks& ranks) {
  return o.updates_shares && saved.processes == ranks.world_size && saved.slots == o.share_slots;
}

// Optimizer `i`'s saved state as the whole fused form, with rank 0's group options: merged from
// a stage-3 run's processes or a stage 1-2 run's shards, or a whole state as it is (its fused
// form, or its per-parameter state converted).
std::string whole_fused_state(const LoadedCheckpoint& loaded, size_t i,
                              const CheckpointedOptimizer& o, const SavedShares& saved,
                              const std::string& what) {
  const auto& shards = loaded.optimizer_shards[i];
  const std::vector<std::string> files =
      shards.empty() ? std::vector<std::string>{loaded.optimizers[i]} : shards;
  std::vector<torch::serialize::InputArchive> archives(files.size()), nested(files.size());
  std::vector<torch::serialize::InputArchive*> states;
  for (size_t r = 0; r < files.size(); ++r) {
    archives[r] = archive_from_bytes(files[r], what);
    states.push_back(fused_state_in(archives[r], nested[r]));
    if (states.back() == nullptr && !shards.empty()) {
      throw Error(str("rank ", r, "'s file holds no fused optimizer state"));
    }
  }
  std::vector<int64_t> numels;  // of this run's optimizer's parameters, whole
  if (o.updates_shares) {
    for (const auto& slot : o.share_slots) numels.push_back(slot.numel);
  } else {
    for (const auto& group : o.optimizer->param_groups()) {
      for (const auto& p : group.params()) numels.push_back(p.numel());
    }
  }
  return archive_to_bytes([&](torch::serialize::OutputArchive& out) {
    if (saved.processes > 0) {
      merge_share_states(states, saved.slots, out);
    } else if (!shards.empty()) {
      merge_optimizer_shards(states, out);
    } else if (states[0] != nullptr) {
      for (const char* key :
           {kFusedKindKey, kFusedNumelsKey, kFusedStepsKey, kFusedState1Key, kFusedState2Key}) {
        torch::Tensor t;
        if (states[0]->try_read(key, t)) out.write(key, t);
      }
    } else {
      write_saved_state_as_fused(*o.optimizer, numels, archives[0], out);
    }
    copy_group_options(archives[0], out);
  });
}

// Under ZeRO stage 3 each process's optimizer state is that of its own shares: it loads as it is
// where every process has the shares it had (a stage-3 run on as many processes, the same
// slots). Anywhere else the state is made whole and, for a stage-3 run, cut again into this
// process's shares (loaded.converted), before anything changes.
void plan_optimizer_load(LoadedCheckpoint& loaded, size_t i, const CheckpointedOptimizer& o,
                         const CheckpointRanks& ranks, const SavedShares& saved) {
  const auto& shards = loaded.optimizer_shards[i];
  const std::string file =
      shards.empty() ? layout::optimizer_file(i) : layout::optimizer_shard_file(0, i);
  const std::string what = loaded.dir + "/" + file;
  if (saved.processes == 0 && !o.updates_shares) return;     // stages 0-2 on both sides
  if (own_shares_load_as_they_are(saved, o, ranks)) return;  // this process's own shares' state
  try {
    const std::string whole = whole_fused_state(loaded, i, o, saved, what);
    if (!o.updates_shares) {
      loaded.converted[i] = whole;
      return;
    }
    auto archive = archive_from_bytes(whole, what);
    loaded.converted[i] = archive_to_bytes([&](torch::serialize::OutputArchive& out) {
      cut_share_state(archive, o.share_slots, ranks.rank, out);
      copy_group_options(archive, out);
    });
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception&) {
    const std::string saved_as =
        saved.processes > 0 ? str("under ZeRO stage 3 by ", saved.processes, " process(es)")
                            : "without ZeRO stage 3";
    const std::string this_run =
        o.updates_shares ? str("updates stage-3 shares on ", ranks.world_size, " process(es)")
                         : "is not under ZeRO stage 3";
    throw CheckpointError(
        str(what, ": optimizer ", i, " was saved ", saved_as, ", and this run's optimizer ",
            this_run, "; re-cutting its state failed: ", exception_text(std::current_exception()),
            ". Likely cause: another model or other parameter groups than the saved run's. Fix: "
            "build the model and the optimizer as the run that saved it did."),
        what);
  }
}

// Reads and checks everything this process will apply; nothing changes yet.
LoadedCheckpoint read_and_check(const std::string& dir, const CheckpointedState& s,
                                const CheckpointRanks& ranks) {
  LoadedCheckpoint loaded;
  loaded.dir = dir;
  loaded.manifest = verify_checkpoint_layout(dir);
  check_counts(loaded.manifest, s, dir);
  // Each file is read once, its CRC-32 checked then: nothing is applied before all are read.
  auto read = [&](const std::string& name) {
    return read_checked_file(dir, loaded.manifest, name);
  };
  loaded.mapped_models.resize(s.models.size());
  for (size_t i = 0; i < s.models.size(); ++i) {
    std::string file = layout::model_weights_file(i);
    std::vector<std::string> mismatches;
    if (lists_file(loaded.manifest, file)) {
      // Mapped, not read: applied one gathered block at a time (apply_model).
      check_listed_file(dir, loaded.manifest, file);
      loaded.mapped_models[i] =
          std::make_shared<MappedModelWeights>(dir + "/" + file, MappedModelWeights::At::kFile);
      loaded.models.emplace_back();
      mismatches = state_mismatches(named_state(*s.models[i]), loaded.mapped_models[i]->shapes());
    } else {
      file = layout::model_file(i);
      loaded.models.push_back(read(file));
      mismatches = module_state_mismatches(*s.models[i], loaded.models.back(), dir + "/" + file);
    }
    if (!mismatches.empty()) {
      throw CheckpointError(
          str("model ", i, " does not match ", dir, "/", file, ": ", join(mismatches, "; "),
              ". Fix: build the model as the run that saved it did (same layers and sizes)."),
          dir + "/" + file);
    }
  }
  loaded.optimizer_shards.resize(s.optimizers.size());
  loaded.converted.resize(s.optimizers.size());
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    SavedShares saved;
    if (lists_file(loaded.manifest, layout::optimizer_shard_file(0, i))) {
      // This process's file first: under stage 3 on the same layout it is the only one needed
      // (each process reads its own), elsewhere every rank's is.
      auto& shards = loaded.optimizer_shards[i];
      shards.assign(static_cast<size_t>(loaded.manifest.world_size), "");
      const int own = ranks.rank < loaded.manifest.world_size ? ranks.rank : 0;
      const std::string own_file = layout::optimizer_shard_file(own, i);
      shards[own] = read(own_file);
      saved = saved_shares_of(shards[own], dir + "/" + own_file);
      if (!own_shares_load_as_they_are(saved, s.optimizers[i], ranks)) {
        for (int r = 0; r < loaded.manifest.world_size; ++r) {
          if (shards[r].empty()) shards[r] = read(layout::optimizer_shard_file(r, i));
        }
      }
      loaded.optimizers.emplace_back();
    } else {
      loaded.optimizers.push_back(read(layout::optimizer_file(i)));
      saved = saved_shares_of(loaded.optimizers.back(), dir + "/" + layout::optimizer_file(i));
    }
    plan_optimizer_load(loaded, i, s.optimizers[i], ranks, saved);
  }
  for (size_t i = 0; i < s.objects.size(); ++i)
    loaded.custom_objects.push_back(read(layout::custom_file(i)));
  if (loaded.manifest.scaler) loaded.scaler = read(layout::kScalerFile);
  if (ranks.rank < loaded.manifest.world_size) loaded.rng = read(layout::rng_file(ranks.rank));
  check_gradients_fit_world(loaded.manifest, ranks, dir);
  if (lists_file(loaded.manifest, layout::gradients_file(ranks.rank))) {
    const std::string file = layout::gradients_file(ranks.rank);
    loaded.gradients = read(file);
    auto mismatches = gradient_mismatches(s.models, loaded.gradients, dir + "/" + file);
    if (!mismatches.empty()) {
      throw CheckpointError(
          str(dir, "/", file, " does not fit this run's models: ", join(mismatches, "; "),
              ". Fix: build the models as the run that saved it did (same layers and sizes)."),
          dir + "/" + file);
    }
  }
  loaded.state = parse_checkpoint_state(read(layout::kStateFile), dir + "/" + layout::kStateFile);
  check_positions(loaded, s);
  loaded.streams = read_stream_positions(loaded, s, ranks);
  return loaded;
}

// This process's state now, as a load would apply it: what a failed load rolls back to.
LoadedCheckpoint snapshot_for_rollback(const CheckpointedState& s) {
  LoadedCheckpoint now;
  now.dir = "(the state before load_state)";
  now.state = training_state_now(s);
  for (const auto& m : s.models) {
    // A sharded model's parameters are not whole here: its shares are what this process holds.
    const bool sharded = has_sharded_blocks(*m);
    now.models.push_back(sharded ? "" : module_state_bytes(*m));
    now.held_models.push_back(sharded ? std::make_shared<HeldModelValues>(*m) : nullptr);
  }
  for (const auto& o : s.optimizers)
    now.optimizers.push_back(optimizer_state_bytes(*o.optimizer, o.fused.get()));
  for (const auto& o : s.objects) now.custom_objects.push_back(archive_to_bytes(o.save));
  if (s.state->scaler) {
    now.scaler =
        archive_to_bytes([&](torch::serialize::OutputArchive& a) { s.state->scaler->save(a); });
  }
  now.rng = rng_state_bytes();
  now.gradients = gradient_bytes(s.models);
  for (const auto& stream : s.streams) now.streams.push_back(stream.position());
  return now;
}

// Model `i`'s saved values into `model`: with sharded blocks one gathered block at a time (a
// collective), kept into the shares; a rollback snapshot's held values put back as they were.
void apply_model(const LoadedCheckpoint& loaded, size_t i, torch::nn::Module& model) {
  if (i < loaded.held_models.size() && loaded.held_models[i]) {
    loaded.held_models[i]->restore(model);
    return;
  }
  const auto& mapped = i < loaded.mapped_models.size() ? loaded.mapped_models[i] : nullptr;
  const std::string what =
      loaded.dir + "/" + (mapped ? layout::model_weights_file(i) : layout::model_file(i));
  if (!mapped && !has_sharded_blocks(model)) {
    load_module_state(model, loaded.models[i], what);
    return;
  }
  torch::serialize::InputArchive archive;
  if (!mapped) archive = archive_from_bytes(loaded.models[i], what);
  torch::NoGradGuard no_grad;
  visit_model_by_blocks(model, /*keep=*/true, [&](const std::string& name, torch::Tensor& tensor) {
    torch::Tensor saved;
    if (mapped) {
      saved = mapped->tensor(name);
    } else {
      archive.read(name, saved);
    }
    tensor.copy_(saved);
    if (mapped) mapped->forget(name);
  });
}

void apply(const LoadedCheckpoint& loaded, CheckpointedState& s, int rank) {
  for (size_t i = 0; i < s.models.size(); ++i) apply_model(loaded, i, *s.models[i]);
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    // A rollback snapshot holds this rank's own shard, which its sharded update takes back.
    const bool shards = i < loaded.optimizer_shards.size() && !loaded.optimizer_shards[i].empty();
    if (i < loaded.converted.size() && !loaded.converted[i].empty()) {
      load_fused_form(*s.optimizers[i].optimizer, loaded.converted[i],
                      loaded.dir + "/" +
                          (shards ? layout::optimizer_shard_file(0, i) : layout::optimizer_file(i)),
                      s.optimizers[i].fused.get());
    } else if (shards && s.optimizers[i].updates_shares) {
      load_optimizer_state(*s.optimizers[i].optimizer, loaded.optimizer_shards[i][rank],
                           loaded.dir + "/" + layout::optimizer_shard_file(rank, i),
                           s.optimizers[i].fused.get());
    } else if (shards) {
      load_sharded_optimizer_state(*s.optimizers[i].optimizer, loaded.optimizer_shards[i],
                                   loaded.dir + "/" + layout::optimizer_shard_file(0, i),
                                   s.optimizers[i].fused.get());
    } else {
      load_optimizer_state(*s.optimizers[i].optimizer, loaded.optimizers[i],
                           loaded.dir + "/" + layout::optimizer_file(i),
                           s.optimizers[i].fused.get());
    }
  }
  for (size_t i = 0; i < s.objects.size(); ++i) {
    auto archive =
        archive_from_bytes(loaded.custom_objects[i], loaded.dir + "/" + layout::custom_file(i));
    s.objects[i].load(archive);
  }
  if (!loaded.gradients.empty()) {
    load_gradients(s.models, loaded.gradients, loaded.dir + "/" + layout::gradients_file(rank));
  }
  if (s.state->scaler && !loaded.scaler.empty()) {
    auto archive =
        archive_from_bytes(loaded.scaler, loaded.dir + "/" + layout::kScalerFile, s.device);
    s.state->scaler->load(archive);
  }
  const CheckpointTrainingState& state = loaded.state;
  for (size_t i = 0; i < s.schedulers.size(); ++i) {
    set_scheduler_step_count(s.schedulers[i].scheduler(), state.scheduler_steps[i]);
  }
  s.state->optimizer_steps = state.optimizer_steps;
  s.state->micro_steps = state.micro_steps;
  for (auto& scheduler : s.schedulers) scheduler.resync();
  for (size_t i = 0; i < s.loaders.size(); ++i) {
    s.loaders[i].set_seed(state.data_loaders[i].seed);
    s.loaders[i].set_position({state.data_loaders[i].epoch, state.data_loaders[i].samples_done});
  }
  s.loaded_loaders = state.data_loaders;
  for (size_t i = 0; i < s.streams.size(); ++i) s.streams[i].set_position(loaded.streams[i]);
  s.loaded_streams = loaded.streams;
  if (!loaded.rng.empty()) load_rng_state(loaded.rng, loaded.dir + "/" + layout::rng_file(rank));
}

// Applies `loaded` on every process, or, when that failed anywhere, puts every object back.
// `what` names the operation in the error ("load_state(dir)"); `here` false: this process takes
// part in the agreement but has nothing to apply (the source of a broadcast).
void apply_everywhere_or_nowhere(const LoadedCheckpoint& loaded, CheckpointedState& s,
                                 const CheckpointRanks& ranks, const std::string& what,
                                 bool here = true) {
  const LoadedCheckpoint before = here ? snapshot_for_rollback(s) : LoadedCheckpoint();
  const auto failures = outcomes_everywhere(ranks, [&] {
                          if (here) apply(loaded, s, ranks.rank);
                          return std::string();
                        }).failures;
  if (failures.empty()) return;
  if (here) apply(before, s, ranks.rank);
  throw CheckpointError(
      str(ranks.rank_prefix, what, " failed while applying it on ", failures.size(), " of ",
          ranks.world_size, " process(es); every object was put back as it was:\n  ",
          join(failures, "\n  ")),
      loaded.dir);
}

// Strings in one buffer, each after its length (8 bytes), and back: the pieces of a training
// state that a broadcast carries.
std::string pack_pieces(const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& piece : pieces) {
    const uint64_t n = piece.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += piece;
  }
  return out;
}

std::vector<std::string> unpack_pieces(const std::string& bytes, const std::string& what) {
  std::vector<std::string> pieces;
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t n = 0;
    const auto cut_short = [&](const std::string& detail) {
      return CheckpointError(str(what, ": the state received is cut short (", detail,
                                 "). Likely cause: the processes run different builds of the "
                                 "program or of Accelerant. Fix: run the same build on every "
                                 "process."));
    };
    if (bytes.size() - at < sizeof n)
      throw cut_short(str(bytes.size() - at, " byte(s) where a piece's length was due"));
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (n > bytes.size() - at)
      throw cut_short(str("a piece of ", n, " bytes with ", bytes.size() - at, " left"));
    pieces.push_back(bytes.substr(at, n));
    at += n;
  }
  return pieces;
}

// What of `s` is not the same on every process, so that no process can hand it to another;
// "" when every piece is replicated.
std::string not_replicated(const CheckpointedState& s) {
  for (size_t i = 0; i < s.models.size(); ++i) {
    if (has_sharded_blocks(*s.models[i])) {
      return str("model ", i,
                 "'s parameters are sharded (ZeRO stage 3): each process holds only "
                 "its shares");
    }
  }
  for (size_t i = 0; i < s.optimizers.size(); ++i) {
    const CheckpointedOptimizer& o = s.optimizers[i];
    if (o.updates_shares || optimizer_sharded(*o.optimizer, o.fused.get())) {
      return str("optimizer ", i, "'s state is sharded (ZeRO): each process holds only its shard");
    }
  }
  if (!s.streams.empty()) return "each process keeps its own position in a stream loader";
  if (!pending_gradient_bytes(s.models).empty()) {
    return "the gradients of a step in progress (gradient accumulation) differ between processes";
  }
  return "";
}

}  // namespace

CheckpointTrainingState training_state_now(const CheckpointedState& s) {
  CheckpointTrainingState state;
  state.optimizer_steps = s.state->optimizer_steps;
  state.micro_steps = s.state->micro_steps;
  for (const auto& scheduler : s.schedulers) {
    state.scheduler_steps.push_back(scheduler_step_count(scheduler.scheduler()));
  }
  for (const auto& l : s.loaders) {
    const DataPosition p = l.position();
    state.data_loaders.push_back(
        {p.epoch, p.samples_done, l.dataset_size(), l.sharding().seed(), l.sharding().shuffle()});
  }
  return state;
}

LoadedFrom load_training_state(CheckpointedState& state, const CheckpointRanks& ranks,
                               const std::string& dir, const std::string& checkpoints_dir) {
  const std::string source = source_dir(dir, checkpoints_dir, ranks);
  LoadedCheckpoint loaded;
  on_every_process(ranks, "load_state(" + source + "): checking the checkpoint",
                   [&] { loaded = read_and_check(source, state, ranks); });
  apply_everywhere_or_nowhere(loaded, state, ranks, "load_state(" + source + ")");
  if (ranks.is_main() && loaded.manifest.world_size != ranks.world_size) {
    std::printf(
        "load_state: %s was saved by %d process(es), this run has %d: the data positions continue "
        "at the "
        "same sample, re-sharded over %d; ranks without a saved generator keep their own.\n",
        source.c_str(), loaded.manifest.world_size, ranks.world_size, ranks.world_size);
    std::fflush(stdout);
  }
  return {source, loaded.manifest.world_size};
}

void broadcast_training_state(CheckpointedState& s, const CheckpointRanks& ranks, int source) {
  const std::string what = str("sync_state_from(", source, ")");
  if (source < 0 || source >= ranks.world_size) {
    throw Error(str(ranks.rank_prefix, what, ": there is no process ", source, " among ",
                    ranks.world_size, ". Fix: pass a rank from 0 to ", ranks.world_size - 1, "."));
  }
  on_every_process(ranks, what, [&] {
    const std::string why = not_replicated(s);
    if (!why.empty()) {
      throw CheckpointError(
          str("cannot copy the training state from one process to the others: ", why,
              ". Fix: load_state from a checkpoint instead, which holds every process's part."));
    }
  });
  // The source's state as a load would apply it; its random generators stay each process's own.
  std::string bytes;
  if (ranks.rank == source) {
    const LoadedCheckpoint now = snapshot_for_rollback(s);
    std::vector<std::string> pieces = {format_checkpoint_state(now.state), now.scaler};
    for (const auto* list : {&now.models, &now.optimizers, &now.custom_objects})
      pieces.insert(pieces.end(), list->begin(), list->end());
    bytes = pack_pieces(pieces);
  }
  bytes = ranks.communicator->broadcast_bytes(bytes, source);
  LoadedCheckpoint loaded;
  loaded.dir = str("process ", source, "'s training state");
  on_every_process(ranks, what + ": checking what it sent", [&] {
    if (ranks.rank == source) return;
    const auto pieces = unpack_pieces(bytes, what);
    const size_t expected = 2 + s.models.size() + s.optimizers.size() + s.objects.size();
    if (pieces.size() != expected) {
      throw CheckpointError(str(what, ": process ", source, " sent ", pieces.size(),
                                " pieces of state and this process has ", expected,
                                ". Fix: prepare the same objects on every process."));
    }
    loaded.state = parse_checkpoint_state(pieces[0], loaded.dir);
    loaded.scaler = pieces[1];
    size_t next = 2;
    for (size_t i = 0; i < s.models.size(); ++i) {
      loaded.models.push_back(pieces[next++]);
      const auto mismatches = module_state_mismatches(*s.models[i], loaded.models.back(), what);
      if (!mismatches.empty()) {
        throw CheckpointError(str("model ", i, " differs from process ", source,
                                  "'s: ", join(mismatches, "; "),
                                  ". Fix: build the model alike on every process."));
      }
    }
    for (size_t i = 0; i < s.optimizers.size(); ++i) loaded.optimizers.push_back(pieces[next++]);
    for (size_t i = 0; i < s.objects.size(); ++i) loaded.custom_objects.push_back(pieces[next++]);
    loaded.manifest.data_loaders = static_cast<int>(s.loaders.size());
    check_positions(loaded, s);
  });
  apply_everywhere_or_nowhere(loaded, s, ranks, what, /*here=*/ranks.rank != source);
}

std::string agreed_latest_checkpoint(
    const CheckpointRanks& ranks, const std::string& checkpoints_dir,
    const std::vector<std::pair<std::string, std::string>>& failed) {
  if (checkpoints_dir.empty()) {
    throw CheckpointError(str(ranks.rank_prefix,
                              "auto_resume needs a project directory to find checkpoints in. ",
                              "Fix: set AcceleratorOptions().project_dir(...)."));
  }
  // Every process must take the same decision: the main process looks, the others follow.
  std::string chosen;
  if (ranks.is_main()) {
    std::vector<std::string> skipped;
    chosen = newest_verified_checkpoint(checkpoints_dir, &skipped, failed);
    if (!skipped.empty()) {
      std::fprintf(stderr,
                   "%sWARNING: auto_resume skipped %zu checkpoint(s) in %s that cannot be "
                   "loaded:\n  %s\n%s\n",
                   ranks.rank_prefix.c_str(), skipped.size(), checkpoints_dir.c_str(),
                   join(skipped, "\n  ").c_str(),
                   chosen.empty()
                       ? "No checkpoint there verifies: training starts from step 0. Fix: restore "
                         "a good checkpoint there, or remove the damaged ones."
                       : str("Resuming from ", chosen,
                             ", the newest that verifies. Fix: remove or restore the skipped ones.")
                             .c_str());
      std::fflush(stderr);
    }
  }
  return ranks.communicator->broadcast_bytes(chosen, 0);
}

std::string newest_verified_checkpoint(
    const std::string& checkpoints_dir, std::vector<std::string>* skipped,
    const std::vector<std::pair<std::string, std::string>>& failed) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& name : list_directory(checkpoints_dir)) {
    const int64_t n = checkpoint_iteration(name);
    if (n >= 0 && is_directory(checkpoints_dir + "/" + name))
      found.emplace_back(n, checkpoints_dir + "/" + name);
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [n, dir] : found) {
    const auto load_failed =
        std::find_if(failed.begin(), failed.end(), [&](const auto& f) { return f.first == dir; });
    if (load_failed != failed.end()) {
      skipped->push_back(str(dir, " verified, but loading it failed: ", load_failed->second));
      continue;
    }
    if (!path_exists(dir + "/" + layout::kManifestFile)) {
      skipped->push_back(str(dir, " has no ", layout::kManifestFile,
                             " (not a complete checkpoint: deleted or never finished)"));
      continue;
    }
    try {
      verify_checkpoint(dir);
      return dir;
    } catch (const CheckpointError& e) {
      skipped->push_back(e.what());
    }
  }
  return "";
}

}  // namespace accelerant::detail
