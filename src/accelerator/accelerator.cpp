#include "accelerant/accelerator.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_set>

#include "accelerant/error.h"
#include "accelerant/metrics.h"
#include "accelerant/process_state.h"
#include "accelerator/accelerator_impl.h"
#include "accelerator/batch_to_device.h"
#include "accelerator/step_breakdown.h"
#include "base/cpu_settings.h"
#include "base/file_io.h"
#include "base/step_recording.h"
#include "base/text.h"
#include "base/torch_compat.h"
#include "checkpoint/durable_files.h"
#include "checkpoint/training_checkpoint.h"
#include "comm/collective_label.h"
#include "comm/communicator_impl.h"
#include "graph/metrics_recording.h"
#include "train/data_loader_internal.h"
#include "train/resume_hook.h"

namespace accelerant {
namespace {

// Why ZeRO stage `stage` cannot recover in place: what a survivor would have to hand over.
std::string in_place_refusal_under_zero(int stage) {
  return detail::str("under ZeRO stage ", stage,
                     " each process holds its own shard of the optimizer state",
                     stage == 2 ? " and of the gradients" : "",
                     stage >= 3 ? ", of the gradients and of the parameters" : "",
                     ", which no other process has, so no survivor can hand a replacement the "
                     "failed worker's.");
}

// An optimizer's parameters, group by group: the order FusedUpdater and its shard pieces count in.
std::vector<torch::Tensor> optimizer_parameters(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

// Serialises with `write` into memory, then writes the file crash-safely
// (detail::write_file_atomically).
template <class Write>
void save_atomically(const std::string& path, Write&& write) {
  std::ostringstream bytes;
  write(bytes);
  if (!detail::write_file_atomically(path, bytes.str())) {
    throw Error(detail::str("save: could not write ", path, " (through ", path,
                            ".tmp). Fix: check that the ",
                            "directory exists and is writable and that the disk is not full."));
  }
}

// Module::save's layout (parameters, buffers, then one nested archive per child), with every
// tensor copied to the CPU, so that torch::load(module, path) reads it on any device.
void write_module_on_cpu(const torch::nn::Module& module,
                         torch::serialize::OutputArchive& archive) {
  for (const auto& p : module.named_parameters(/*recurse=*/false))
    archive.write(p.key(), p.value().cpu());
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    archive.write(b.key(), b.value().cpu(), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::OutputArchive child_archive;
    write_module_on_cpu(*child.value(), child_archive);
    archive.write(child.key(), child_archive);
  }
}

// Metrics are gathered and reduced in fp32 even when computed in bf16 (downcast_bf16).
torch::Tensor fp32_if_bf16(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.to(torch::kFloat) : t;
}

// Rank 0's parameters and buffers on every rank: one broadcast per dtype of a flat copy.
// ZeRO stage 3 points an optimizer at the shares when the optimizer is prepared after its model;
// one prepared before would keep updating the blocks' parameters, which sharding frees.
void refuse_optimizers_of_blocks(const std::vector<detail::CheckpointedOptimizer>& optimizers,
                                 const torch::nn::Module& model, const std::string& rank_prefix) {
  std::unordered_set<const c10::TensorImpl*> block_parameters;
  for (const auto& block : sharded_blocks(model)) {
    for (const auto& p : block->block()->parameters())
      block_parameters.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& o : optimizers) {
    for (const auto& group : o.optimizer->param_groups()) {
      for (const auto& p : group.params()) {
        if (!block_parameters.count(p.unsafeGetTensorImpl())) continue;
        throw Error(rank_prefix +
                    "ZeRO stage 3: an optimizer over this model's Sharded blocks was prepared "
                    "before the model, so it would keep updating the parameters that sharding "
                    "frees instead of their shares. Fix: prepare the model first, e.g. "
                    "acc.prepare(model, optimizer).");
      }
    }
  }
}

// Rank 0's parameters and buffers to every process, but for `skip` (a sharded start's blocks:
// each process holds only its own piece of those, built alike and checked then).
void broadcast_from_main(Communicator& communicator, torch::nn::Module& module,
                         const std::unordered_set<const c10::TensorImpl*>& skip) {
  torch::NoGradGuard no_grad;
  std::map<std::pair<torch::ScalarType, std::string>, std::vector<torch::Tensor>> groups;
  auto add = [&](const torch::Tensor& t) {
    if (skip.count(t.unsafeGetTensorImpl())) return;
    groups[{t.scalar_type(), t.device().str()}].push_back(t);
  };
  for (const auto& p : module.parameters()) add(p);
  for (const auto& b : module.buffers()) add(b);
  // Small tensors travel together, in flat buckets of up to 64 MiB; a larger contiguous one in
  // place. One flat copy of the whole model would double its memory while the model is still
  // whole on every process (a model too large for that is what ZeRO stage 3 is for).
  constexpr int64_t kBucketBytes = int64_t{64} << 20;
  auto send = [&](std::vector<torch::Tensor>& bucket) {
    if (bucket.empty()) return;
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : bucket) flat_parts.push_back(t.reshape({-1}));
    torch::Tensor flat = torch::cat(flat_parts);
    communicator.broadcast_(flat, 0);
    int64_t offset = 0;
    for (auto& t : bucket) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
    bucket.clear();
  };
  for (auto& [key, tensors] : groups) {
    std::vector<torch::Tensor> bucket;
    int64_t bucket_bytes = 0;
    for (auto& t : tensors) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      if (bytes >= kBucketBytes && t.is_contiguous()) {
        torch::Tensor flat = t.view({-1});
        communicator.broadcast_(flat, 0);
        continue;
      }
      if (bucket_bytes + bytes > kBucketBytes) send(bucket), bucket_bytes = 0;
      bucket.push_back(t);
      bucket_bytes += bytes;
    }
    send(bucket);
  }
}

// One entry per parameter and buffer in registration order: what must be the same on every rank
// for rank 0's weights to be broadcast and the gradient buckets to line up.
struct ModelEntry {
  std::string name;  // "parameter fc1.weight"
  std::string form;  // "[32, 16] Float"
};

std::vector<ModelEntry> model_entries(const torch::nn::Module& module) {
  std::vector<ModelEntry> entries;
  for (const auto& p : module.named_parameters()) {
    entries.push_back(
        {"parameter " + p.key(), detail::str(p.value().sizes(), " ", p.value().scalar_type())});
  }
  for (const auto& b : module.named_buffers()) {
    entries.push_back(
        {"buffer " + b.key(), detail::str(b.value().sizes(), " ", b.value().scalar_type())});
  }
  return entries;
}

std::string to_text(const std::vector<ModelEntry>& entries) {
  std::string text;
  for (const auto& e : entries) text += e.name + '\t' + e.form + '\n';
  return text;
}

std::vector<ModelEntry> from_text(const std::string& text) {
  std::vector<ModelEntry> entries;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto tab = line.find('\t');
    entries.push_back({line.substr(0, tab), line.substr(tab + 1)});
  }
  return entries;
}

// The first difference between rank 0's model and rank `other`'s, in words.
std::string first_difference(const std::vector<ModelEntry>& main,
                             const std::vector<ModelEntry>& theirs, int other) {
  for (size_t i = 0; i < std::max(main.size(), theirs.size()); ++i) {
    if (i >= main.size()) {
      return detail::str(theirs[i].name, " (", theirs[i].form, ") exists on rank ", other,
                         " but not on rank 0");
    }
    if (i >= theirs.size()) {
      return detail::str(main[i].name, " (", main[i].form, ") exists on rank 0 but not on rank ",
                         other);
    }
    if (main[i].name != theirs[i].name) {
      return detail::str("entry ", i, " is ", main[i].name, " (", main[i].form, ") on rank 0 but ",
                         theirs[i].name, " (", theirs[i].form, ") on rank ", other);
    }
    if (main[i].form != theirs[i].form) {
      return detail::str(main[i].name, " is ", main[i].form, " on rank 0 but ", theirs[i].form,
                         " on rank ", other);
    }
  }
  return "none found";
}

// Throws Error on every rank when the ranks' models differ in a parameter or buffer name, shape
// or dtype; otherwise the broadcast of rank 0's weights would fail deep in the transport (Gloo
// aborts the process on mismatched sizes). One small collective when they agree.
void check_same_model_everywhere(Communicator& communicator, const torch::nn::Module& module,
                                 const std::string& rank_prefix) {
  const auto entries = model_entries(module);
  const std::string text = to_text(entries);
  const uint32_t hash = detail::crc32_of(text);  // the checkpoint files' checksum
  const auto hashes =
      communicator.gather_bytes(std::string(reinterpret_cast<const char*>(&hash), sizeof hash));
  std::vector<int> differing;
  for (size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0]) differing.push_back(static_cast<int>(r));
  }
  if (differing.empty()) return;
  const auto texts = communicator.gather_bytes(text);  // every rank takes this branch
  const int other = differing.front();
  const auto main = from_text(texts[0]), theirs = from_text(texts[other]);
  throw Error(detail::str(
      rank_prefix, "prepare(model): the ranks built different models (",
      differing.size() == 1 ? "rank " : "ranks ", detail::join(differing, ", "),
      differing.size() == 1 ? " differs" : " differ",
      " from rank 0), so rank 0's weights cannot be broadcast to them. First difference: ",
      first_difference(main, theirs, other), " (rank 0 has ", main.size(),
      " parameters and buffers, rank ", other, " has ", theirs.size(),
      "). Likely cause: the model's layers depend on something that differs between ranks (the "
      "rank, a command-line argument, a file or setting read on each rank). Fix: build the same "
      "model on every rank, and let only the data differ between ranks."));
}

}  // namespace

Accelerator::Accelerator(AcceleratorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  const EnvLookup lookup = process_environment();
  const std::string config_path =
      impl_->options_.config_file().value_or(default_config_path(lookup));
  impl_->settings_ = resolve_accelerator_settings(impl_->options_, lookup,
                                                  read_config_values(config_path), config_path);
  if (impl_->settings_.downcast_bf16 && impl_->settings_.mixed_precision != MixedPrecision::kBf16) {
    throw Error(detail::str(
        "downcast_bf16 is set but mixed_precision is ", to_string(impl_->settings_.mixed_precision),
        ". downcast_bf16 stores the weights in bf16 and belongs to bf16 training. ",
        "Fix: set mixed_precision to bf16 as well, or drop downcast_bf16."));
  }
  // The process state's settings, resolved once above (option, then the launcher's variable,
  // then the config file), reach it: with cpu it makes no CUDA context and no NCCL group; the
  // timeout and debug mode govern its rendezvous and every collective.
  const AcceleratorSettings& s = impl_->settings_;
  ProcessState& process =
      ProcessState::initialized()
          ? ProcessState::get()
          : ProcessState::initialize(ProcessStateOptions()
                                         .cpu(s.cpu)
                                         .collective_timeout(s.collective_timeout)
                                         .debug(s.debug));
  const auto source = [&](const char* key) {
    return s.sources.count(key) ? s.sources.at(key) : std::string("the default");
  };
  if (s.cpu && !process.device().is_cpu()) {
    throw Error(detail::str(
        process.rank_prefix(), "the Accelerator is set to stay on the CPU (", source("cpu"),
        "), but this process's ProcessState was initialized before it for ", process.device(),
        ", whose collectives would not take CPU tensors. Fix: initialize it with "
        "ProcessStateOptions().cpu(true), or let the Accelerator initialize it."));
  }
  if (process.collective_timeout() != s.collective_timeout || process.debug() != s.debug) {
    throw Error(detail::str(
        process.rank_prefix(), "the Accelerator's collective_timeout is ",
        s.collective_timeout.count(), " ms (from ", source("collective_timeout"),
        ") and its debug ", s.debug ? "on" : "off", " (from ", source("debug"),
        "), but this process's ProcessState was initialized before it with ",
        process.collective_timeout().count(), " ms and debug ", process.debug() ? "on" : "off",
        ", and they cannot change once the processes have met. Fix: initialize it with the same "
        "ProcessStateOptions().collective_timeout(...).debug(...), or let the Accelerator "
        "initialize "
        "it."));
  }
  impl_->rank_ = process.rank();
  impl_->world_size_ = process.world_size();
  impl_->local_rank_ = process.local_rank();
  impl_->rank_prefix_ = process.rank_prefix();
  impl_->recovers_in_place_ = process.env().recovers_in_place && process.distributed();
  impl_->joins_running_group_ = impl_->recovers_in_place_ && process.env().joins_running_group;
  impl_->device_ = impl_->settings_.cpu ? torch::Device(torch::kCPU) : process.device();
  if (impl_->recovers_in_place_ && impl_->options_.zero_stage() > 0) {
    // The launcher reads the refusal before it would replace a failed worker of this generation,
    // and restarts the whole group instead, saying why.
    const std::string why = in_place_refusal_under_zero(impl_->options_.zero_stage());
    detail::CommunicatorAccess::publish(process.communicator(), "in_place_refused", why);
    print("In-place recovery (Recovery::kReplaceFailedWorker) falls back to the last checkpoint: ",
          why,
          " A failed worker restarts the whole group, which resumes from the newest checkpoint "
          "(AcceleratorOptions::auto_resume).");
    impl_->recovers_in_place_ = false;
    impl_->joins_running_group_ = false;
  }
  if (impl_->recovers_in_place_ &&
      (impl_->settings_.gradient_accumulation_steps > 1 || !impl_->device_.is_cpu())) {
    throw Error(detail::str(
        process.rank_prefix(),
        "the launcher replaces a failed worker in place (Recovery::kReplaceFailedWorker), which "
        "the Accelerator supports only when a step is one batch and training runs on the CPU "
        "(NCCL does not fail a collective whose peer died: it would wait); this run has "
        "gradient_accumulation_steps ",
        impl_->settings_.gradient_accumulation_steps, " and device ", impl_->device_,
        ". Fix: launch with Recovery::kRestartGroup (the group restarts from the last "
        "checkpoint), or train with no accumulation on the CPU."));
  }
  if (process.env().machines_may_join && process.distributed()) {
    if (impl_->options_.auto_resume()) {
      impl_->membership_watch_ = std::make_shared<detail::MembershipWatch>(*this);
    } else {
      print(
          "Elastic membership: a machine that arrives joins this job at its next restart, not at "
          "a step boundary, as AcceleratorOptions::auto_resume is off (the group restarts from a "
          "checkpoint it saves there).");
    }
  }
  if (impl_->joins_running_group_) {
    // A replacement meets the survivors at its first batch, once its objects are prepared
    // (auto_resume is not armed then: the state comes from them).
    impl_->resume_armed_ = true;
    impl_->resume_hook_->arm([this] { join_running_group(/*joining=*/true); });
  }
  if (impl_->settings_.mixed_precision == MixedPrecision::kFp16 && !impl_->device_.is_cuda()) {
    throw Error(detail::str(process.rank_prefix(),
                            "mixed_precision fp16 needs a CUDA device, but this ",
                            "process trains on the CPU (LibTorch's CPU autocast has no fp16). ",
                            "Fix: use mixed_precision bf16 on the CPU, or run on a GPU."));
  }
  impl_->threads_ = torch::get_num_threads();
  if (impl_->settings_.cpu_defaults && impl_->device_.is_cpu()) {
    detail::CpuDefaultsInput cpu;
    cpu.local_processes = process.env().local_world_size;
    cpu.launcher_threads = process.env().threads_per_process;
    cpu.cpus_per_process = process.env().cpus_per_process;
    cpu.omp_num_threads_set = lookup("OMP_NUM_THREADS").value_or("") != "";
    impl_->threads_ = detail::apply_cpu_defaults(cpu);
  }
  if (impl_->settings_.seed) set_seed(*impl_->settings_.seed);
  if (impl_->settings_.mixed_precision == MixedPrecision::kFp16) {
    impl_->state_->scaler = std::make_shared<GradScaler>(GradScalerOptions(), impl_->device_);
  }
  check_zero_stage();
  impl_->checkpointed_->state = impl_->state_;
  impl_->checkpointed_->device = impl_->device_;
  impl_->checkpointed_->mixed_precision = impl_->settings_.mixed_precision;
  start_step_breakdown();
}

void Accelerator::check_zero_stage() const {
  const int stage = impl_->options_.zero_stage();
  if (stage < 0 || stage > 3) {
    throw Error(detail::str(impl_->rank_prefix_, "AcceleratorOptions::zero_stage is ", stage,
                            "; ZeRO has stages 0 (off), 1 (optimizer state sharded), 2 (also ",
                            "gradients reduce-scattered) and 3 (also the parameters of the ",
                            "model's Sharded blocks). Fix: zero_stage(0), (1), (2) or (3)."));
  }
}

void Accelerator::start_step_breakdown() {
  const int64_t every = impl_->options_.step_breakdown_every();
  if (every < 0) {
    throw Error(detail::str("step_breakdown_every is ", every,
                            "; it must be a number of optimizer steps, or 0 to turn the "
                            "step-time breakdown off. Fix: e.g. step_breakdown_every(100)."));
  }
  detail::set_step_timing(every > 0);
  detail::start_timed_training();
  if (every == 0) return;
  detail::arm_metrics_report();
  detail::StepBreakdown::Hooks hooks;
  hooks.communicator = [this]() -> Communicator& { return communicator(); };
  hooks.log = [this](const TrackerScalars& values, int64_t step) {
    if (!impl_->tracker_dir_.empty()) log(values, step);
  };
  hooks.optimizer_step = [state = impl_->state_] { return state->optimizer_steps; };
  hooks.recovers_in_place = [this] { return recoverable_in_place(); };
  hooks.rank = impl_->rank_;
  hooks.world = impl_->world_size_;
  hooks.rank_prefix = impl_->rank_prefix_;
  impl_->step_breakdown_ = std::make_unique<detail::StepBreakdown>(every, std::move(hooks));
}

Accelerator::~Accelerator() {
  impl_->resume_hook_->disarm();  // it points at this Accelerator; loaders may outlive it
  if (impl_->membership_watch_) impl_->membership_watch_->detach();  // so does the watch
  impl_->step_breakdown_.reset();  // so do the optimizers that end the steps it listens to
  try {
    close_trackers();
  } catch (const std::exception& e) {  // a destructor cannot throw; say what was lost
    std::cerr << impl_->rank_prefix_ << "accelerant: closing the trackers failed: " << e.what()
              << "\n";
  }
}

bool Accelerator::sync_gradients() const { return impl_->state_->sync_gradients; }
const AcceleratorSettings& Accelerator::settings() const { return impl_->settings_; }
MixedPrecision Accelerator::mixed_precision() const { return impl_->settings_.mixed_precision; }
int64_t Accelerator::gradient_accumulation_steps() const {
  return impl_->settings_.gradient_accumulation_steps;
}
torch::Device Accelerator::device() const { return impl_->device_; }
int Accelerator::rank() const { return impl_->rank_; }
int Accelerator::world_size() const { return impl_->world_size_; }
int Accelerator::local_rank() const { return impl_->local_rank_; }
bool Accelerator::is_main_process() const { return impl_->rank_ == 0; }
bool Accelerator::is_local_main_process() const { return impl_->local_rank_ == 0; }
int Accelerator::threads() const { return impl_->threads_; }
const std::shared_ptr<TrainingState>& Accelerator::state() const { return impl_->state_; }

void Accelerator::print_line(const std::string& line) const { std::cout << line << std::endl; }

Communicator& Accelerator::communicator() const {
  if (impl_->ended_) {
    throw Error(
        "This Accelerator's training has ended (end_training() was called), so it can no longer "
        "communicate. Fix: call end_training() last, after every gather, reduce and step.");
  }
  return ProcessState::get().communicator();
}

void Accelerator::prepare_model(const std::shared_ptr<torch::nn::Module>& model) {
  if (!model) {
    throw Error(
        "prepare() got an empty model pointer. Fix: construct the model first, e.g. "
        "std::make_shared<Net>(), and pass that.");
  }
  for (const auto& prepared : impl_->models_) {
    if (prepared.module == model) return;  // preparing twice changes nothing
  }
  // A sharded start's blocks hold only their shares: they are not moved, cast or broadcast.
  std::unordered_set<const c10::TensorImpl*> sharded_already;
  for (const auto& block : sharded_blocks(*model)) {
    if (!block->sharded()) continue;
    for (const auto& p : block->block()->parameters())
      sharded_already.insert(p.unsafeGetTensorImpl());
  }
  if (!sharded_already.empty() && !impl_->sharding_parameters()) {
    throw Error(detail::str(
        impl_->rank_prefix_, "prepare(model): ", sharded_already.size(),
        " parameters of the model's Sharded blocks were sharded as they were built (a sharded "
        "start), but this Accelerator does not shard parameters (zero_stage ",
        impl_->options_.zero_stage(), " on ", impl_->world_size_,
        " process(es)). Fix: zero_stage(3) on several processes, or build the model outside "
        "the sharded start (Accelerator::sharded_start gives none below stage 3)."));
  }
  if (!sharded_already.empty() &&
      (impl_->device_.type() != torch::kCPU || impl_->settings_.downcast_bf16)) {
    throw Error(detail::str(
        impl_->rank_prefix_,
        "prepare(model): the model's Sharded blocks were sharded as they "
        "were built (a sharded start), which keeps their shares on the CPU in fp32; this run ",
        "trains on ", impl_->device_, impl_->settings_.downcast_bf16 ? " with downcast_bf16" : "",
        ", and moving or casting shares is not written yet. Fix: build the model whole (outside "
        "sharded_start()) and let prepare shard it, or train on the CPU."));
  }
  if (sharded_already.empty()) {
    model->to(impl_->device_);
    if (impl_->settings_.downcast_bf16) model->to(torch::kBFloat16);
  }
  Communicator& comm = communicator();
  detail::ScopedCollectiveLabel label("prepare");
  // A replacement joining a running group takes every value from a survivor at its first batch
  // (join_running_group), where the survivors meet it: no collective here.
  if (comm.world_size() > 1 && !impl_->joins_running_group_) {
    check_same_model_everywhere(comm, *model, impl_->rank_prefix_);
    broadcast_from_main(comm, *model, sharded_already);
  }
  // Stage 3 shards the parameters of the model's Sharded blocks (each process now has the same
  // values, from rank 0); the reducer averages the rest whole, as stage 0 does.
  const bool stage3 = impl_->sharding_parameters();
  if (stage3)
    refuse_optimizers_of_blocks(impl_->checkpointed_->optimizers, *model, impl_->rank_prefix_);
  std::vector<std::shared_ptr<ShardedImpl>> sharded;
  if (stage3) sharded = shard_model(*model, comm);
  if (stage3 && sharded.empty()) {
    print_line(detail::str(
        impl_->rank_prefix_,
        "warning: zero_stage 3, but the model has no Sharded blocks, so every "
        "parameter stays whole on every process (stage 0). Fix: wrap its blocks, e.g. "
        "blocks->push_back(accelerant::Sharded(Block(...))) (docs/zero.md, \"Stage 3\")."));
  }
  const int64_t cap = impl_->options_.bucket_cap_mb() * 1024 * 1024;
  auto reducer = std::make_unique<GradientReducer>(
      stage3 ? replicated_parameters(*model) : model->named_parameters(), comm,
      GradientReducerOptions()
          .bucket_cap_bytes(cap)
          .first_bucket_cap_bytes(std::min<int64_t>(cap, 1024 * 1024))
          .allow_unused_parameters(impl_->options_.allow_unused_parameters())
          // Stage 3 leaves the parameters outside the blocks whole (stage 0's reduction), also
          // on one process, where nothing is sharded.
          .zero_stage(impl_->options_.zero_stage() == 3 ? 0 : impl_->options_.zero_stage()));
  for (const auto& block : sharded) {
    block->set_allow_unused_parameters(impl_->options_.allow_unused_parameters());
    std::weak_ptr<ShardedImpl> weak = block;
    reducer->add_sync_follower([weak](bool on) {
      if (auto b = weak.lock()) b->set_sync(on);
    });
  }
  impl_->models_.push_back({model, std::move(reducer), std::move(sharded)});
  impl_->checkpointed_->models.push_back(model);
}

ShardedStart Accelerator::sharded_start() {
  // Shares are cut on the CPU in fp32; on a device, or with downcast_bf16, the model is built
  // whole and prepare shards it after moving it (see prepare_model).
  if (!impl_->sharding_parameters() || impl_->device_.type() != torch::kCPU ||
      impl_->settings_.downcast_bf16) {
    return ShardedStart();
  }
  return ShardedStart(communicator());
}

PreparedOptimizer Accelerator::prepare_optimizer(torch::optim::Optimizer& optimizer) {
  auto& optimizers = impl_->checkpointed_->optimizers;
  auto prepared = std::find_if(optimizers.begin(), optimizers.end(),
                               [&](const auto& o) { return o.optimizer == &optimizer; });
  if (prepared == optimizers.end()) {
    // Stage 3: the optimizer updates the shares of the sharded blocks' parameters instead.
    if (impl_->sharding_parameters()) {
      for (const auto& prepared_model : impl_->models_)
        optimize_shares(optimizer, *prepared_model.module);
    }
    // A fused type already steps fused; a torch::optim one gets an updater bound to it. ZeRO
    // stages 1 and 2 shard the fused update, so they bind one whatever fused_optimizers says;
    // stage 3 binds one so that its checkpoints hold the fused form, which another number of
    // processes or stage re-cuts (train/share_state.h).
    const bool zero = (impl_->options_.zero_stage() == 1 || impl_->options_.zero_stage() == 2) &&
                      communicator().world_size() > 1;
    const bool wrap =
        (impl_->options_.fused_optimizers() || zero || impl_->sharding_parameters()) &&
        fused_updater_of(optimizer) == nullptr;
    optimizers.push_back({&optimizer, wrap ? std::make_shared<FusedUpdater>(optimizer) : nullptr});
    prepared = std::prev(optimizers.end());
    prepared->updates_shares = impl_->sharding_parameters();
    if (prepared->updates_shares) {
      prepared->share_slots = detail::share_slots(optimizer, impl_->checkpointed_->models);
    }
    if (zero) {
      FusedUpdater& updater = wrap ? *prepared->fused : *fused_updater_of(optimizer);
      prepared->zero_reducer = &zero_reducer_for(optimizer);
      updater.shard(prepared->zero_reducer->shard_pieces(optimizer_parameters(optimizer)));
    }
  }
  GradientReducer* reducer = prepared->zero_reducer;
  if (impl_->sharding_parameters()) {
    // fp16's loss scaler: each process holds the gradients of its own shares, so an overflow
    // in one process's share must skip the step everywhere: unscale_shares_ makes found_inf the
    // maximum over the processes (as stage 2 does), unless clipping unscaled already.
    PreparedOptimizer::Hooks hooks;
    hooks.before_update = [state = impl_->state_, comm = &communicator(), &optimizer] {
      // A gather started ahead (say by an evaluation that ran only the first blocks since the
      // backward) holds the shares' values from before this step: none may outlive it.
      drop_prefetched_gathers();
      const auto& scaler = state->scaler;
      if (!scaler || !scaler->enabled() || scaler->unscaled()) return;
      std::vector<torch::Tensor> grads;
      for (const auto& p : optimizer_parameters(optimizer)) {
        if (p.grad().defined()) grads.push_back(p.grad());
      }
      scaler->unscale_shares_(grads, *comm);
    };
    return PreparedOptimizer(optimizer, impl_->state_, prepared->fused, std::move(hooks));
  }
  if (!reducer) return PreparedOptimizer(optimizer, impl_->state_, prepared->fused);
  // Preparing it again (another handle) keeps the same all-gather and gradient release.
  PreparedOptimizer::Hooks hooks;
  hooks.after_update = [reducer] { reducer->gather_parameters(); };
  if (impl_->options_.zero_stage() == 2) {
    hooks.zero_gradients = [reducer] { reducer->zero_gradients(); };
    // The scaler is read at each step: TrainingState::scaler may be set after prepare.
    hooks.before_update = [state = impl_->state_, reducer, comm = &communicator()] {
      const auto& scaler = state->scaler;
      if (scaler && scaler->enabled() && !scaler->unscaled())
        scaler->unscale_shares_(reducer->gradient_shares(), *comm);
    };
  }
  return PreparedOptimizer(optimizer, impl_->state_, prepared->fused, std::move(hooks));
}

// The reducer of the prepared model that owns the optimizer's parameters; shard_pieces then
// checks that they are exactly its trainable ones, naming any that is not.
GradientReducer& Accelerator::zero_reducer_for(torch::optim::Optimizer& optimizer) {
  if (impl_->models_.empty()) {
    throw Error(detail::str(
        impl_->rank_prefix_, "ZeRO (zero_stage ", impl_->options_.zero_stage(),
        ") shards an optimizer over ",
        "its model's gradient buckets, and no model is prepared yet. Fix: prepare the model ",
        "first, or together: accelerator.prepare(model, optimizer, ...)."));
  }
  const std::vector<torch::Tensor> params = optimizer_parameters(optimizer);
  std::unordered_set<const c10::TensorImpl*> updated;
  for (const auto& p : params) updated.insert(p.unsafeGetTensorImpl());
  for (auto& prepared : impl_->models_) {
    for (const auto& p : prepared.module->parameters()) {
      if (p.requires_grad() && updated.count(p.unsafeGetTensorImpl())) return *prepared.reducer;
    }
  }
  throw Error(detail::str(
      impl_->rank_prefix_, "ZeRO (zero_stage ", impl_->options_.zero_stage(),
      "): none of the optimizer's ", params.size(),
      " parameters is a trainable parameter of a prepared model, so no gradient ",
      "buckets can shard its update. Fix: build the optimizer over model->parameters() of a "
      "model passed to prepare, before preparing the optimizer."));
}

PreparedScheduler Accelerator::prepare_scheduler(torch::optim::LRScheduler& scheduler) {
  auto& schedulers = impl_->checkpointed_->schedulers;
  for (const auto& prepared : schedulers) {
    if (&prepared.scheduler() == &scheduler) return prepared;
  }
  schedulers.emplace_back(scheduler, impl_->state_);
  return schedulers.back();
}

DataLoader Accelerator::prepare_data_loader(const DataLoader& loader) {
  const DataLoaderOptions& o = loader.options();
  ShardingOptions sharding = ShardingOptions()
                                 .batch_size(o.batch_size())
                                 .shuffle(o.shuffle())
                                 .seed(o.seed().value_or(impl_->settings_.seed.value_or(0)))
                                 .drop_last(o.drop_last())
                                 .even_batches(impl_->settings_.even_batches)
                                 .split_batches(impl_->settings_.split_batches);
  const torch::Device device = impl_->device_;
  const bool downcast = impl_->settings_.downcast_bf16;
  // To a GPU: page-locked staging and a side-stream copy in the loader's worker thread
  // (detail::to_device_from_worker), overlapping the step that runs meanwhile.
  const bool pin = device.is_cuda() && o.pin_memory().value_or(true);
  std::function<Batch(Batch)> transform = detail::batch_to_device(device, downcast, pin);
  // The device prefetch loader of graph mode: batches bound for a GPU are built and copied by a
  // worker thread while the current step runs, even when the loader asked for none.
  const DataLoader& source =
      !device.is_cpu() && o.num_workers() == 0 ? loader.with_workers(1) : loader;
  DataLoader prepared = [&] {
    try {
      std::function<void()> on_batch = reseed_at_each_batch();
      if (impl_->membership_watch_) {
        on_batch = [reseed = std::move(on_batch), watch = impl_->membership_watch_] {
          if (reseed) reseed();
          watch->at_batch();
        };
      }
      return detail::DataLoaderAccess::sharded(
          source, {rank(), world_size(), sharding, impl_->state_, std::move(transform),
                   impl_->resume_hook_, std::move(on_batch)});
    } catch (const Error& e) {
      throw Error(detail::str(impl_->rank_prefix_, "prepare(data loader): ", e.what()));
    }
  }();
  const size_t index = impl_->checkpointed_->loaders.size();
  impl_->checkpointed_->loaders.push_back(prepared);
  // A checkpoint loaded before this loader existed (auto_resume) still knows where it was.
  if (index < impl_->checkpointed_->loaded_loaders.size()) {
    const CheckpointLoaderState& saved = impl_->checkpointed_->loaded_loaders[index];
    if (saved.dataset_size != prepared.dataset_size()) {
      throw CheckpointError(detail::str(
          impl_->rank_prefix_, "prepare(data loader ", index,
          "): the checkpoint loaded by auto_resume saved this loader ", "over ", saved.dataset_size,
          " samples, but it has ", prepared.dataset_size(),
          ". Fix: prepare the same datasets, in the same order, as the run that saved it."));
    }
    prepared.set_seed(saved.seed);
    prepared.set_position({saved.epoch, saved.samples_done});
  }
  if (impl_->options_.auto_resume() && !impl_->resume_armed_) {  // armed once, by the first loader
    impl_->resume_armed_ = true;
    impl_->resume_hook_->arm([this] { resume_from_latest(); });
  }
  return prepared;
}

void Accelerator::backward(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1) {
    throw Error(detail::str(
        "backward() needs a scalar loss; got ",
        loss.defined() ? c10::str("a tensor of shape ", loss.sizes()) : "an undefined tensor",
        ". Fix: reduce it first, e.g. loss.mean()."));
  }
  warn_if_data_unsharded();
  if (impl_->recovers_in_place_ && impl_->checkpointed_->loaders.empty()) {
    throw Error(detail::str(
        impl_->rank_prefix_,
        "backward() under in-place recovery (Recovery::kReplaceFailedWorker) without a prepared "
        "data loader: the recovery rewinds the loader to the failed step's batch, hands its "
        "position to the replacement and reseeds the generators at each of its batches. Fix: "
        "prepare the loader, acc.prepare(model, opt, make_data_loader(...)), or launch with "
        "Recovery::kRestartGroup."));
  }
  // The rest of an abandoned iteration (a second backward) meets no one: the replacement's first
  // collective is the redone step's.
  if (impl_->state_->step_abandoned) return;
  torch::Tensor scaled = loss;
  if (impl_->settings_.gradient_accumulation_steps > 1)
    scaled = scaled / impl_->settings_.gradient_accumulation_steps;
  if (impl_->state_->scaler) scaled = impl_->state_->scaler->scale(scaled);
  try {
    scaled.backward();
  } catch (const std::exception& e) {
    if (!recover_step_in_place(e)) throw;
  }
}

std::function<void()> Accelerator::reseed_at_each_batch() const {
  if (!impl_->recovers_in_place_) return nullptr;
  // A replacement cannot have the random generators of the process it replaces, nor a survivor
  // those of the step it abandoned: under in-place recovery every batch's draws (dropout) come
  // from a seed of the run's seed, the rank and the step instead, the same for whoever computes
  // that step.
  return [state = impl_->state_, seed = impl_->settings_.seed.value_or(0), rank = impl_->rank_] {
    state->step_abandoned = false;  // the batch handed out now starts a step afresh
    uint64_t mixed = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank);
    mixed = mixed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(state->optimizer_steps);
    torch::manual_seed(mixed ^ (mixed >> 31));
  };
}

void Accelerator::refuse_under_in_place_recovery(const char* what) const {
  if (!impl_->recovers_in_place_) return;
  throw Error(detail::str(
      impl_->rank_prefix_, "prepare(", what,
      "): in-place recovery (Recovery::kReplaceFailedWorker) rewinds and hands over the "
      "positions of data loaders only (this one keeps a position per process, which a "
      "replacement cannot take from a survivor). Fix: launch with Recovery::kRestartGroup, "
      "or read the data through make_data_loader."));
}

bool Accelerator::recoverable_in_place() const {
  return impl_->recovers_in_place_ && !communicator().broken_reason().empty();
}

bool Accelerator::recover_step_in_place(const std::exception& failure) {
  if (!recoverable_in_place()) return false;
  const int64_t step = impl_->state_->optimizer_steps + 1;
  // Nothing of the step is kept: its gradients go, its batch comes again, its update is skipped.
  for (auto& prepared : impl_->models_) prepared.reducer->abandon_pass();
  for (auto& loader : impl_->checkpointed_->loaders)
    detail::DataLoaderAccess::rewind_current_batch(loader);
  impl_->state_->step_abandoned = true;
  regroup_in_place(detail::str("step ", step), failure,
                   detail::str("step ", step, " is done again; no step before it is lost"));
  return true;
}

void Accelerator::regroup_in_place(const std::string& what_failed, const std::exception& failure,
                                   const std::string& outcome) {
  const auto start = std::chrono::steady_clock::now();
  std::string first_line = failure.what();
  first_line = first_line.substr(0, first_line.find('\n'));
  std::cerr << detail::str(impl_->rank_prefix_, what_failed, " failed: ", first_line,
                           "\nRecovering in place: the group forms again with the process that "
                           "replaces the failed one.")
            << std::endl;
  ProcessState::get().regroup();
  // What the source hands over replaces this process's gradients too (none are pending with one
  // batch per step; a save's are those of the step it followed).
  for (auto& prepared : impl_->models_) prepared.reducer->zero_gradients();
  join_running_group(/*joining=*/false);
  // Whether the next batch is this one again follows the source: a process that left the failed
  // step at another point than the source did goes where the source goes.
  for (auto& loader : impl_->checkpointed_->loaders) detail::DataLoaderAccess::follow_sync(loader);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  print("Recovered in place in ", seconds, " s (generation ", ProcessState::get().restart_count(),
        "): ", outcome, ".");
  // The membership change in the trackers, at the step the run goes on from.
  if (!impl_->tracker_dir_.empty()) {
    log({{"recovery/generation", ProcessState::get().restart_count()},
         {"recovery/seconds_to_resume", seconds},
         {"recovery/steps_done_again", impl_->state_->step_abandoned ? 1.0 : 0.0}},
        impl_->state_->optimizer_steps);
  }
}

void Accelerator::join_running_group(bool joining) {
  Communicator& comm = communicator();
  torch::Tensor joined = torch::zeros({comm.world_size()}, torch::kFloat);
  joined[comm.rank()] = joining ? 1.0f : 0.0f;
  joined = comm.all_reduce(joined);
  int source = -1;
  for (int r = 0; r < comm.world_size() && source < 0; ++r) {
    if (joined[r].item<float>() == 0.0f) source = r;
  }
  if (source < 0) {
    throw Error(detail::str(impl_->rank_prefix_,
                            "every process of the group joins it afresh, so none holds the "
                            "training state to hand over. Fix: restart the job (from the last "
                            "checkpoint)."));
  }
  sync_state_from(source);
  impl_->joins_running_group_ = false;  // joined: from now on a process like the others
  // A replacement that is the main process now logs its arrival (the survivors' main, when there
  // is one, logs the rest in regroup_in_place).
  if (joining && is_main_process() && !impl_->tracker_dir_.empty()) {
    log({{"recovery/generation", ProcessState::get().restart_count()}},
        impl_->state_->optimizer_steps);
  }
}

void Accelerator::warn_if_data_unsharded() {
  // Training of a prepared model on several processes without a prepared loader: the data most
  // likely comes from a loader every rank iterates whole, which is not an error anyone would see.
  if (impl_->warned_unsharded_data_ || impl_->world_size_ == 1 || impl_->models_.empty() ||
      !impl_->checkpointed_->loaders.empty() || !impl_->checkpointed_->streams.empty() ||
      impl_->prepared_token_windows_) {
    return;
  }
  impl_->warned_unsharded_data_ = true;
  if (!is_main_process()) return;  // the same on every rank: said once
  std::cerr << detail::str(
                   impl_->rank_prefix_, "warning: backward() on ", impl_->world_size_,
                   " processes, but this Accelerator prepared no data loader. Unless each rank "
                   "reads its own part of the data, every rank sees the whole data set: each "
                   "optimizer step averages ",
                   impl_->world_size_, " copies of the same batches and an epoch takes ",
                   impl_->world_size_,
                   " times the work it should. Fix: pass the loader to prepare, e.g. auto [model, "
                   "opt, loader] = acc.prepare(model, opt, make_data_loader(...)) (wrap a "
                   "torch::data dataset with make_data_loader); it gives each rank its share. "
                   "Said once.")
            << std::endl;
}

Accelerator::AccumulationGuard Accelerator::accumulate_modules(
    std::vector<std::shared_ptr<torch::nn::Module>> modules) {
  if (detail::recording_step()) {
    throw Error(
        "accumulate() inside a graph step: which micro-steps synchronise is decided on the host, "
        "and a replay would repeat the captured decision. Fix: build the step with "
        "accelerator.compile(fn), which decides it before each step (and keeps one graph per kind "
        "of micro-step), and remove accumulate() from the step function.");
  }
  TrainingState& s = *impl_->state_;
  ++s.micro_steps;
  s.sync_gradients =
      s.micro_steps % impl_->settings_.gradient_accumulation_steps == 0 || s.end_of_dataloader;
  std::vector<GradientReducer*> reducers;
  if (modules.empty()) {
    for (auto& prepared : impl_->models_) reducers.push_back(prepared.reducer.get());
  } else {
    for (auto& module : modules) reducers.push_back(&reducer_for(*module));
  }
  for (auto* reducer : reducers) reducer->set_sync(s.sync_gradients);
  return AccumulationGuard(std::move(reducers));
}

GradientReducer& Accelerator::reducer_for(const torch::nn::Module& module) const {
  for (const auto& prepared : impl_->models_) {
    if (prepared.module.get() == &module) return *prepared.reducer;
  }
  throw Error(detail::str(
      "The model '", module.name(), "' was not prepared by this Accelerator. ",
      "Fix: pass it through accelerator.prepare(model) first and use what it returns."));
}

double Accelerator::clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm,
                                    double norm_type) {
  if (detail::recording_step()) {
    throw Error(
        "clip_grad_norm_() inside a graph step: it returns the norm as a double, read on the host, "
        "which a captured step cannot do. Fix: use accelerator.clip_grad_norm_tensor(...), which "
        "clips on the device and returns the norm as a tensor (read it in a step closure).");
  }
  // The sharded norm is a collective: clip_grad_norm_tensor has it (and unscales itself).
  if (gradients_sharded() || impl_->sharding_parameters())
    return clip_grad_norm_tensor(parameters, max_norm, norm_type).item<double>();
  if (impl_->state_->scaler && impl_->state_->sync_gradients)
    impl_->state_->scaler->unscale_(parameters);
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

// Under ZeRO stage 2 the gradients are the reducers' shares (the parameters' .grad are unset).
bool Accelerator::gradients_sharded() const {
  return impl_->options_.zero_stage() == 2 && impl_->state_->sync_gradients &&
         communicator().world_size() > 1;
}

torch::Tensor Accelerator::clip_grad_norm_tensor(const std::vector<torch::Tensor>& parameters,
                                                 double max_norm, double norm_type) {
  const bool unscale = impl_->state_->scaler && impl_->state_->sync_gradients;
  if (unscale && !gradients_sharded() && !impl_->sharding_parameters())
    impl_->state_->scaler->unscale_(parameters);
  torch::NoGradGuard no_grad;
  // What clipping scales, and what counts in this process's part of the norm.
  std::vector<torch::Tensor> grads, counted;
  const bool across_processes = gradients_sharded() || impl_->sharding_parameters();
  if (gradients_sharded()) {
    grads = impl_->stage2_gradient_shares(parameters);
    if (unscale) impl_->state_->scaler->unscale_shares_(grads, communicator());
    counted = grads;
  } else if (impl_->sharding_parameters()) {
    impl_->stage3_gradients(parameters, grads, counted);
    // Each process's shares: an overflow in any of them counts on every process.
    if (unscale) impl_->state_->scaler->unscale_shares_(grads, communicator());
  } else {
    for (const auto& p : parameters) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    counted = grads;
  }
  std::vector<torch::Tensor> norms;
  for (const auto& g : counted) {
    norms.push_back(std::isinf(norm_type) ? g.abs().max().to(torch::kFloat)
                                          : g.norm(norm_type).to(torch::kFloat));
  }
  const torch::Tensor none =
      torch::zeros({}, torch::TensorOptions(torch::kFloat).device(impl_->device_));
  if (grads.empty() && !across_processes) return none;
  torch::Tensor total = none;
  if (!norms.empty()) {
    const torch::Tensor all = torch::stack(norms);
    total = std::isinf(norm_type) ? all.max() : all.norm(norm_type);
  }
  if (across_processes) {
    // Each process holds part of the gradients: max of maxima, or (sum of |g|^p)^(1/p).
    if (std::isinf(norm_type)) {
      total = communicator().all_reduce(total, ReduceOp::kMax);
    } else {
      total = communicator().all_reduce(total.pow(norm_type), ReduceOp::kSum).pow(1.0 / norm_type);
    }
  }
  // min(1, ...) instead of torch's host-side "if coef < 1": multiplying by 1 changes nothing.
  const torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  return total;
}

GraphStep Accelerator::compile(GraphStep::Function step, GraphStepOptions options) {
  if (impl_->recovers_in_place_) {
    throw Error(impl_->rank_prefix_ +
                "Accelerator::compile under in-place recovery (Recovery::kReplaceFailedWorker): "
                "a compiled step's collectives run outside backward, where a failed one cannot "
                "be abandoned and redone. Fix: train with eager steps, or launch with "
                "Recovery::kRestartGroup.");
  }
  if (impl_->sharding_parameters()) {
    throw Error(impl_->rank_prefix_ +
                "Accelerator::compile under ZeRO stage 3: each sharded block all-gathers its "
                "parameters on the host in forward and backward, which a captured step cannot "
                "hold. Fix: train stage 3 with eager steps, or compile with zero_stage(2).");
  }
  if (options.phase()) {
    throw Error(
        "Accelerator::compile sets GraphStepOptions::phase itself (the accumulation phase). Fix: "
        "leave it "
        "unset, or build a GraphStep directly if you need your own.");
  }
  if (impl_->settings_.gradient_accumulation_steps > 1) {
    options.phase([this] {
      auto scope = std::make_shared<AccumulationGuard>(accumulate_modules({}));
      return GraphStepOptions::Phase{impl_->state_->sync_gradients ? "sync" : "accumulate",
                                     std::move(scope)};
    });
  }
  return GraphStep(std::move(step), std::move(options));
}

AutocastGuard Accelerator::autocast() const {
  const bool enabled = impl_->settings_.mixed_precision != MixedPrecision::kNo;
  const auto dtype =
      impl_->settings_.mixed_precision == MixedPrecision::kFp16 ? torch::kHalf : torch::kBFloat16;
  return AutocastGuard(impl_->device_, dtype, enabled);
}

torch::Tensor Accelerator::gather(const torch::Tensor& tensor) {
  detail::ScopedCollectiveLabel label("gather");
  return communicator().gather(fp32_if_bf16(tensor));
}

torch::Tensor Accelerator::gather_for_metrics(const torch::Tensor& tensor) {
  detail::ScopedCollectiveLabel label("gather_for_metrics");
  torch::Tensor all = gather(tensor);
  const int64_t padding =
      impl_->state_->end_of_dataloader ? impl_->state_->padding_in_last_step : 0;
  if (padding > 0 && all.dim() > 0 && all.size(0) >= padding)
    all = all.narrow(0, 0, all.size(0) - padding);
  return all;
}

Batch Accelerator::gather_for_metrics(const Batch& batch) {
  Batch out;
  for (const auto& [name, tensor] : batch.items()) {
    torch::Tensor padded = tensor;
    for (int64_t d = 1; d < tensor.dim(); ++d) padded = pad_across_processes(padded, d, 0);
    out.set(name, gather_for_metrics(padded));
  }
  return out;
}

torch::Tensor Accelerator::reduce(const torch::Tensor& tensor, ReduceOp op) {
  detail::ScopedCollectiveLabel label("reduce");
  return communicator().all_reduce(fp32_if_bf16(tensor), op);
}

torch::Tensor Accelerator::pad_across_processes(const torch::Tensor& tensor, int64_t dim,
                                                double pad_value) {
  detail::ScopedCollectiveLabel label("pad_across_processes");
  return communicator().pad_across_processes(tensor, dim, pad_value);
}

Batch Accelerator::pad_across_processes(const Batch& batch, int64_t dim, double pad_value) {
  Batch out;
  for (const auto& [name, tensor] : batch.items()) {
    const bool has_dim = dim < tensor.dim() && dim >= -tensor.dim();
    out.set(name, has_dim ? pad_across_processes(tensor, dim, pad_value) : tensor);
  }
  return out;
}

void Accelerator::wait_for_everyone() {
  detail::ScopedCollectiveLabel label("wait_for_everyone");
  communicator().barrier();
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  const uint64_t value = seed + (device_specific ? static_cast<uint64_t>(rank()) : 0);
  torch::manual_seed(value);  // also seeds every CUDA device's generator when CUDA is present
  std::srand(static_cast<unsigned>(value));
}

void Accelerator::save(const torch::Tensor& tensor, const std::string& path) const {
  if (!is_main_process()) return;
  save_atomically(path, [&](std::ostream& out) { torch::save(tensor.cpu(), out); });
}

void Accelerator::save(const std::vector<torch::Tensor>& tensors, const std::string& path) const {
  if (!is_main_process()) return;
  std::vector<torch::Tensor> on_cpu;
  for (const auto& t : tensors) on_cpu.push_back(t.cpu());
  save_atomically(path, [&](std::ostream& out) { torch::save(on_cpu, out); });
}

void Accelerator::save_module(const torch::nn::Module& module, const std::string& path) const {
  for (const auto& block : sharded_blocks(module)) {
    if (!block->sharded()) continue;
    throw Error(impl_->rank_prefix_ +
                "save_module of a model with sharded blocks (ZeRO stage 3): only rank 0 writes "
                "here, and the blocks' parameters are whole only inside a collective. Fix: "
                "save_model(model, dir), which every process calls and which gathers them.");
  }
  if (!is_main_process()) return;
  torch::serialize::OutputArchive archive;
  write_module_on_cpu(module, archive);
  save_atomically(path, [&](std::ostream& out) { archive.save_to(out); });
}

void Accelerator::end_training() {
  if (impl_->ended_) return;
  impl_->step_breakdown_.reset();  // its exchange is a collective: none after this point
  close_trackers();  // local files only: before the barrier, so a hang there loses no scalars
  detail::ScopedCollectiveLabel label("end_training");
  // The blocks would gather through the communicator that shutdown() destroys.
  for (const auto& prepared : impl_->models_) {
    for (const auto& block : prepared.sharded) block->unshard();
  }
  wait_for_everyone();
  std::fflush(stdout);
  impl_->ended_ = true;
  impl_->models_.clear();  // the reducers refer to the communicator that shutdown() destroys
  ProcessState::shutdown();
}

}  // namespace accelerant

namespace accelerant::detail {

std::function<Batch(Batch)> batch_to_device(torch::Device device, bool downcast, bool pin) {
  if (device.is_cpu() && !downcast) return {};
  // Every tensor of the batch, named ones included (tensor_tree.h).
  return [device, downcast, pin](Batch batch) {
    return apply_to_tensors(batch, [&](const torch::Tensor& t) {
      const bool cast = downcast && t.is_floating_point();
      if (!device.is_cpu() && t.is_cpu()) record_transfer(/*to_device=*/true, t.nbytes());
      return to_device_from_worker(t, device, cast ? torch::kBFloat16 : t.scalar_type(), pin);
    });
  };
}

}  // namespace accelerant::detail
