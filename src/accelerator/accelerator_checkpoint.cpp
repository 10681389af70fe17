// The Accelerator's checkpoint methods: each hands what it prepared (detail::CheckpointedState)
// and its processes to the protocol in checkpoint/training_checkpoint.h.
#include "accelerant/accelerator.h"
#include "accelerant/error.h"
#include "accelerant/safetensors.h"
#include "accelerator/accelerator_impl.h"
#include "accelerator/sharded_model_files.h"
#include "base/text.h"
#include "base/trace_events.h"
#include "checkpoint/training_checkpoint.h"
#include "comm/collective_label.h"
#include "train/resume_hook.h"

namespace accelerant {

detail::CheckpointRanks Accelerator::checkpoint_ranks() const {
  return {&communicator(), impl_->rank_, impl_->world_size_, impl_->rank_prefix_};
}

std::string Accelerator::checkpoints_dir() const {
  return detail::checkpoints_dir_of(impl_->options_.project_dir());
}

void Accelerator::register_checkpoint_object(
    std::function<void(torch::serialize::OutputArchive&)> save,
    std::function<void(torch::serialize::InputArchive&)> load) {
  impl_->checkpointed_->objects.push_back({std::move(save), std::move(load)});
}

std::string Accelerator::save_state(const std::string& dir) {
  detail::ScopedCollectiveLabel label("save_state");
  detail::TraceSpan span("save_state", "checkpoint");
  // ZeRO stage 3: the main process streams the weights one gathered block at a time; each
  // process writes its optimizer's state of its shares.
  // A save before the first batch under auto_resume saves the resumed state, not the fresh one.
  impl_->resume_hook_->fire();
  try {
    return detail::save_training_state(
        *impl_->checkpointed_, checkpoint_ranks(),
        {dir, checkpoints_dir(), impl_->options_.checkpoint_total_limit()});
  } catch (const std::exception& e) {
    // A process died during the save (in-place recovery): the training state is whole on every
    // survivor, so the run goes on without this checkpoint; the next save writes one.
    if (!recoverable_in_place()) throw;
    regroup_in_place("save_state(" + dir + ")", e,
                     "this save was abandoned (no checkpoint written); training goes on");
    return "";
  }
}

std::string Accelerator::load_state(const std::string& dir) {
  detail::ScopedCollectiveLabel label("load_state");
  detail::TraceSpan span("load_state", "checkpoint");
  impl_->resume_hook_->disarm();  // an explicit load replaces auto_resume's
  // ZeRO stage 3: the weights load one gathered block at a time, each process keeping its pieces
  // in its shares.
  const detail::LoadedFrom loaded = detail::load_training_state(
      *impl_->checkpointed_, checkpoint_ranks(), dir, checkpoints_dir());
  const int saved_world = loaded.saved_world_size;
  if (saved_world != impl_->world_size_) {
    // A membership change (an elastic restart on fewer or more machines): the checkpoint's
    // micro-steps may be those of another accumulation (it holds no gradients in progress: those
    // load on the same world only), so the next micro-step starts an optimizer step afresh.
    TrainingState& s = *impl_->state_;
    const int64_t accumulation = impl_->settings_.gradient_accumulation_steps;
    if (s.micro_steps % accumulation != 0)
      s.micro_steps += accumulation - s.micro_steps % accumulation;
    if (!impl_->tracker_dir_.empty()) {
      log({{"membership/world_size", impl_->world_size_},
           {"membership/saved_world_size", saved_world},
           {"membership/gradient_accumulation_steps", static_cast<double>(accumulation)}},
          s.optimizer_steps);
    }
  }
  return loaded.dir;
}

void Accelerator::sync_state_from(int source_rank) {
  detail::ScopedCollectiveLabel label("sync_state_from");
  detail::TraceSpan span("sync_state_from", "checkpoint");
  impl_->resume_hook_->disarm();  // the state comes from a process, not a checkpoint
  detail::broadcast_training_state(*impl_->checkpointed_, checkpoint_ranks(), source_rank);
}

void Accelerator::auto_resume_now() {
  detail::ScopedCollectiveLabel label("auto_resume");
  detail::TraceSpan span("auto_resume", "checkpoint");
  impl_->resume_hook_->fire();
}

void Accelerator::resume_from_latest() {
  detail::ScopedCollectiveLabel label("auto_resume");
  detail::TraceSpan span("auto_resume", "checkpoint");
  // A checkpoint whose files verify can still fail to load (files swapped or edited and their
  // checksums rewritten; a model built differently): as with one that does not verify, the next
  // older one is tried. A failed load changed nothing (load_state puts every object back), and
  // it failed on every process alike, so all of them go on to the same older checkpoint.
  std::vector<std::pair<std::string, std::string>> failed;
  while (true) {
    const std::string latest =
        detail::agreed_latest_checkpoint(checkpoint_ranks(), checkpoints_dir(), failed);
    if (latest.empty() && !failed.empty()) {
      // Every checkpoint that verifies failed to load: most likely this run differs from the
      // one that saved them (its model or optimizer). Starting from step 0 could let
      // checkpoint_total_limit delete them: refuse instead.
      std::vector<std::string> reasons;
      for (const auto& f : failed) reasons.push_back(f.second);
      throw CheckpointError(detail::str(
          impl_->rank_prefix_, "auto_resume: every checkpoint in ", checkpoints_dir(),
          " that verifies failed to load:\n  ", detail::join(reasons, "\n  "),
          "\nLikely cause: this run builds its model, optimizer or other saved objects "
          "differently from the run that saved them. Fix: build them as that run did, or move "
          "the checkpoints away to start afresh."));
    }
    if (latest.empty()) return;
    try {
      load_state(latest);
    } catch (const CheckpointError& e) {
      failed.emplace_back(latest, e.what());
      continue;
    }
    print("Resumed from ", latest, " (step ", impl_->state_->optimizer_steps, ")");
    return;
  }
}

void Accelerator::save_model_module(const torch::nn::Module& module, const std::string& dir,
                                    const std::string& max_shard_size) {
  detail::ScopedCollectiveLabel label("save_model");
  const int64_t max_bytes =
      parse_byte_size(max_shard_size);  // same text on every rank: throws on all
  // ZeRO stage 3: one sharded block gathered at a time while the main process streams it out.
  detail::save_model_by_blocks(module, dir, max_bytes, checkpoint_ranks());
}

void Accelerator::load_model_module(torch::nn::Module& module, const std::string& dir) {
  detail::ScopedCollectiveLabel label("load_model");
  // ZeRO stage 3: the mapped files copied in one gathered block at a time, kept as its shares.
  detail::load_model_by_blocks(module, dir, checkpoint_ranks());
}

}  // namespace accelerant
