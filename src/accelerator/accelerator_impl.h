// What an Accelerator holds (include/accelerant/accelerator.h keeps only a pointer to it): the
// resolved settings, this process's place in the job, the prepared models and what a checkpoint
// saves. Read and written by the Accelerator's member functions (accelerator*.cpp,
// profile_scope.cpp) only.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "accelerant/accelerator.h"
#include "accelerant/sharded.h"
#include "accelerator/membership_watch.h"
#include "accelerator/step_breakdown.h"
#include "checkpoint/training_checkpoint.h"
#include "train/resume_hook.h"

namespace accelerant {

struct Accelerator::Impl {
  explicit Impl(AcceleratorOptions options) : options_(std::move(options)) {}

  struct PreparedModel {
    std::shared_ptr<torch::nn::Module> module;
    // Averages the gradients of the parameters outside every sharded block (all of them below
    // ZeRO stage 3).
    std::unique_ptr<GradientReducer> reducer;
    // ZeRO stage 3: the model's Sharded blocks, sharded by prepare (accelerant/sharded.h).
    std::vector<std::shared_ptr<ShardedImpl>> sharded;
  };

  AcceleratorOptions options_;
  AcceleratorSettings settings_;
  torch::Device device_ = torch::kCPU;
  // Copied from ProcessState at construction: still valid after end_training() shut it down.
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  std::string rank_prefix_;
  int threads_ = 1;
  bool ended_ = false;
  std::shared_ptr<TrainingState> state_ = std::make_shared<TrainingState>();
  std::vector<PreparedModel> models_;

  /// ZeRO stage 3 on several processes: the Sharded blocks of the prepared models are sharded.
  bool sharding_parameters() const { return options_.zero_stage() == 3 && world_size_ > 1; }
  /// Stage 2: the reducer shares that hold the gradients of `parameters` (whole models only).
  std::vector<torch::Tensor> stage2_gradient_shares(
      const std::vector<torch::Tensor>& parameters) const;
  /// Stage 3: the gradients of `parameters` that clipping scales (`grads`: the share's for a
  /// sharded block's parameter or a share itself, the others' own), and those this process counts
  /// in the global norm.
  void stage3_gradients(const std::vector<torch::Tensor>& parameters,
                        std::vector<torch::Tensor>& grads,
                        std::vector<torch::Tensor>& counted) const;
  /// What prepare gave it (optimizers, schedulers, loaders, registered objects): what a
  /// checkpoint holds (checkpoint/training_checkpoint.h).
  std::unique_ptr<detail::CheckpointedState> checkpointed_ =
      std::make_unique<detail::CheckpointedState>();
  /// AcceleratorOptions::auto_resume, armed by the first prepared loader, fired by a loader's
  /// begin() (train/resume_hook.h). Shared with the loaders, which may outlive the Accelerator.
  std::shared_ptr<detail::ResumeHook> resume_hook_ = std::make_shared<detail::ResumeHook>();
  bool resume_armed_ = false;
  /// Recovery::kReplaceFailedWorker (LaunchContract::recovers_in_place, joins_running_group).
  bool recovers_in_place_ = false;
  bool joins_running_group_ = false;
  /// Elastic membership while machines may join (LaunchContract::machines_may_join, with
  /// auto_resume): called at each batch a prepared loader hands out; null otherwise.
  std::shared_ptr<detail::MembershipWatch> membership_watch_;
  bool warned_unsharded_data_ = false;
  /// A TokenWindows stream was prepared: each rank draws its own data.
  bool prepared_token_windows_ = false;
  /// backward_per_token: target tokens of this optimizer step's micro-steps so far, this rank.
  int64_t step_tokens_ = 0;
  /// Exchanges the ranks' step-time breakdown (AcceleratorOptions::step_breakdown_every).
  std::unique_ptr<detail::StepBreakdown> step_breakdown_;
  /// init_trackers's result: `<project_dir>/<project_name>`; empty before it.
  std::string tracker_dir_;
  TrackerConfig tracker_config_;  // init_trackers' config, for a tracker added after it
  std::vector<std::shared_ptr<Tracker>> trackers_;
};

}  // namespace accelerant
