// The pieces of training state a checkpoint holds, each to and from bytes. Kept apart from the
// Accelerator's save/load protocol so that each format is small and testable.
#pragma once
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accelerant/fused_optimizer.h"
#include "train/share_state.h"

namespace accelerant::detail {

/// Keys of what optimizer_state_bytes writes beside the optimizer's own save(): the parameter
/// groups' options (one sub-archive per group, "0", "1", ...), and a prepare-bound fused update's
/// state (a fused type, FusedAdamW..., saves that state at the top level instead).
extern const char* kGroupOptions;
extern const char* kFusedUpdater;
/// Key of the number of processes written beside the optimizer's state under ZeRO stage 3, where
/// each process's optimizer updates its own shares of the sharded blocks: that state is the
/// process's, not a piece of a whole one (share_optimizer_state_bytes).
extern const char* kSharesOfProcesses;

/// An archive built by `fill`, as bytes.
std::string archive_to_bytes(const std::function<void(torch::serialize::OutputArchive&)>& fill);
/// An archive over `bytes`, its tensors on `device`. `what` names it in errors.
torch::serialize::InputArchive archive_from_bytes(const std::string& bytes, const std::string& what,
                                                  torch::Device device = torch::kCPU);

/// A model's parameters and buffers by their dotted names ("conv1.weight").
std::map<std::string, torch::Tensor> named_state(const torch::nn::Module& module);
/// Why tensors of the `saved` names and shapes do not fit `model`: names missing and unexpected,
/// shapes that differ, each list sorted. Empty when they fit.
std::vector<std::string> state_mismatches(const std::map<std::string, torch::Tensor>& model,
                                          const std::map<std::string, std::vector<int64_t>>& saved);

/// named_state as an archive, on the CPU.
std::string module_state_bytes(const torch::nn::Module& module);
/// Why the saved state does not fit `module`: missing and unexpected names, and shapes that
/// differ, each listed. Empty when it fits.
std::vector<std::string> module_state_mismatches(const torch::nn::Module& module,
                                                 const std::string& bytes, const std::string& what);
/// Copies the saved state into `module` (device and dtype of the module kept). Call after
/// module_state_mismatches found none.
void load_module_state(torch::nn::Module& module, const std::string& bytes,
                       const std::string& what);

/// The gradients of `models`' parameters that hold some (accumulated but not yet applied: a save
/// in the middle of gradient accumulation), one nested archive per model by index, on the CPU;
/// "" when every gradient is undefined or zero (nothing to resume).
std::string pending_gradient_bytes(const std::vector<std::shared_ptr<torch::nn::Module>>& models);
/// Every defined gradient of `models`, zero or not, as pending_gradient_bytes lays them out: what
/// a failed load puts back.
std::string gradient_bytes(const std::vector<std::shared_ptr<torch::nn::Module>>& models);
/// Why saved gradients do not fit `models`: a model or parameter they do not have, a shape that
/// differs. Empty when they fit.
std::vector<std::string> gradient_mismatches(
    const std::vector<std::shared_ptr<torch::nn::Module>>& models, const std::string& bytes,
    const std::string& what);
/// Makes each parameter's gradient the saved one (device and dtype of the parameter), and
/// undefined where none was saved, exactly as it was at the save. Call after gradient_mismatches
/// found none.
void load_gradients(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                    const std::string& bytes, const std::string& what);

/// `fused`: the FusedUpdater prepare bound to `optimizer` (its state travels in the same file).
std::string optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                                  const FusedUpdater* fused = nullptr);
void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::string& bytes,
                          const std::string& what, FusedUpdater* fused = nullptr);
/// ZeRO stage 3: optimizer_state_bytes of an optimizer over this process's shares (of a run of
/// `processes`), marked as such (kSharesOfProcesses) and with its slots (kShareSlotsKey).
std::string share_optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                                        const FusedUpdater* fused, int processes,
                                        const std::vector<ShareSlot>& slots);
/// How a stage-3 optimizer state was saved: by how many processes (0: not under stage 3) and
/// over which slots.
struct SavedShares {
  int processes = 0;
  std::vector<ShareSlot> slots;
};
SavedShares saved_shares(torch::serialize::InputArchive& archive, const std::string& what);
/// The fused state inside an optimizer archive: under kFusedUpdater when a prepare-bound update
/// saved it, else at the top (a fused type's); null when there is none (an optimizer that
/// stepped by itself). `nested` receives the first.
torch::serialize::InputArchive* fused_state_in(torch::serialize::InputArchive& archive,
                                               torch::serialize::InputArchive& nested);
/// An archive's entries but `except`, nested archives included, copied as they are: an
/// optimizer's own save() and its groups' options carried without knowing their layout.
void copy_archive(torch::serialize::InputArchive& from, torch::serialize::OutputArchive& to,
                  const std::vector<std::string>& except = {});
/// Copies the parameter groups' options (kGroupOptions) of one optimizer archive into another.
void copy_group_options(torch::serialize::InputArchive& from, torch::serialize::OutputArchive& to);
/// Loads a whole fused state (or one process's state of its stage-3 shares), with the groups'
/// options beside it, into `optimizer`: into its fused update (`fused`, or its own when it is a
/// fused type; a sharded one takes its pieces), else as its per-parameter state.
void load_fused_form(torch::optim::Optimizer& optimizer, const std::string& bytes,
                     const std::string& what, FusedUpdater* fused);
/// Whether `optimizer`'s fused update (`fused`, or the optimizer's own) is sharded (ZeRO): each
/// rank then saves its own optimizer_state_bytes, a shard.
bool optimizer_sharded(torch::optim::Optimizer& optimizer, const FusedUpdater* fused);
/// Loads the state that every rank of a ZeRO run saved (`shards`, in rank order, each what
/// optimizer_state_bytes wrote there) into `optimizer`, sharded or not, on any number of
/// processes: the shards are merged, and a sharded update takes its pieces.
void load_sharded_optimizer_state(torch::optim::Optimizer& optimizer,
                                  const std::vector<std::string>& shards, const std::string& what,
                                  FusedUpdater* fused = nullptr);

/// The number of steps a scheduler took (LRScheduler keeps it protected and has no state_dict).
unsigned scheduler_step_count(const torch::optim::LRScheduler& scheduler);
void set_scheduler_step_count(torch::optim::LRScheduler& scheduler, unsigned steps);

/// This process's random generators: the CPU one, and each CUDA device's where CUDA is present.
std::string rng_state_bytes();
void load_rng_state(const std::string& bytes, const std::string& what);

}  // namespace accelerant::detail
