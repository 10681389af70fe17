// The Accelerator: a plain LibTorch training loop becomes data-parallel and mixed-precision with
// a handful of calls, and runs unchanged on one process or many.
//
//   accelerant::Accelerator
//   acc(accelerant::AcceleratorOptions().mixed_precision(accelerant::MixedPrecision::kBf16)); auto
//   [model, opt, loader] = acc.prepare(net, sgd, train_loader);   // any order, same back for
//   (auto& batch : loader) {
//     auto guard = acc.accumulate(model);            // only with gradient accumulation
//     torch::Tensor loss;
//     { auto autocast = acc.autocast(); loss = criterion(model->forward(batch.data), batch.target);
//     } acc.backward(loss);                             // gradients averaged across processes
//     opt.step(); opt.zero_grad();
//   }
//
// prepare() keeps the user's own objects: a model comes back as the same shared_ptr (moved to the
// device, weights broadcast from rank 0, a GradientReducer hooked into its parameters); an
// optimizer or scheduler comes back as a PreparedOptimizer / PreparedScheduler handle over it; a
// DataLoader comes back sharded across processes. See docs/accelerator.md.
#pragma once
#include <torch/data/dataloader.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "accelerant/accelerator_options.h"
#include "accelerant/autocast.h"
#include "accelerant/checkpoint.h"
#include "accelerant/communicator.h"
#include "accelerant/data_loader.h"
#include "accelerant/evaluation.h"
#include "accelerant/gradient_reducer.h"
#include "accelerant/graph_step.h"
#include "accelerant/prepared_optimizer.h"
#include "accelerant/profile_options.h"
#include "accelerant/profile_scope.h"
#include "accelerant/sharded.h"
#include "accelerant/stream_loader.h"
#include "accelerant/tensor_tree.h"
#include "accelerant/token_windows.h"
#include "accelerant/tracker.h"
#include "accelerant/training_state.h"

namespace accelerant {

namespace detail {
struct CheckpointRanks;

template <class T>
struct is_shared_module : std::false_type {};
template <class M>
struct is_shared_module<std::shared_ptr<M>> : std::is_base_of<torch::nn::Module, M> {};
template <class T>
constexpr bool is_module_holder_v = std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>;
template <class T>
constexpr bool always_false_v = false;

// What prepare() refuses with a fix of its own: torch::data's loaders (as torch::data::
// make_data_loader returns them) and bare datasets (anything with get(index) and size()).
template <class T>
struct is_torch_data_loader : std::false_type {};
template <class D, class S>
struct is_torch_data_loader<torch::data::StatelessDataLoader<D, S>> : std::true_type {};
template <class D>
struct is_torch_data_loader<torch::data::StatefulDataLoader<D>> : std::true_type {};
template <class T>
struct is_torch_data_loader<std::unique_ptr<T>> : is_torch_data_loader<T> {};
template <class T, class = void>
struct is_dataset : std::false_type {};
template <class T>
struct is_dataset<T, std::void_t<decltype(std::declval<T&>().get(size_t{0})),
                                 decltype(std::declval<T&>().size())>> : std::true_type {};

/// The nn::Module behind a shared_ptr<Module subclass> or a TORCH_MODULE holder.
template <class M>
std::shared_ptr<torch::nn::Module> module_ptr(const M& model) {
  if constexpr (is_shared_module<M>::value) {
    return model;
  } else {
    static_assert(is_module_holder_v<M>,
                  "expected a std::shared_ptr<Module> or a TORCH_MODULE holder");
    return model.ptr();
  }
}
}  // namespace detail

/// The entry point of a training script (see the file comment): prepares the user's models,
/// optimizers, schedulers and loaders for data-parallel, mixed-precision training, and offers the
/// step helpers (backward, accumulate, clip_grad_norm_), the collectives for metrics and the
/// checkpoints. One per process, made the same way on every process; not copyable. Calls that
/// communicate are collectives: every process makes them, in the same order.
class Accelerator {
 public:
  /// Resolves the options (option > environment > config file > default), joins the process
  /// group when launched (ProcessState::initialize), applies the CPU defaults and the seed.
  explicit Accelerator(AcceleratorOptions options = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- prepare -------------------------------------------------------------------------------
  /// Prepares models, optimizers (lvalues), schedulers (lvalues) and DataLoaders, in any number
  /// and order; one object comes back as itself, several as a std::tuple in the same order.
  /// Call it in the same order on every process (models are broadcast from rank 0).
  template <class... Ts>
  auto prepare(Ts&&... objects) {
    static_assert(sizeof...(Ts) > 0, "prepare() needs at least one object");
    if constexpr (sizeof...(Ts) == 1) {
      return prepare_one(std::forward<Ts>(objects)...);
    } else {
      // Braced initialisation runs the prepares left to right, the same order on every rank.
      return std::tuple<decltype(prepare_one(std::forward<Ts>(objects)))...>{
          prepare_one(std::forward<Ts>(objects))...};
    }
  }
  /// The model-specific part of prepare (device, downcast, broadcast, gradient reducer).
  void prepare_model(const std::shared_ptr<torch::nn::Module>& model);
  /// The optimizer part of prepare: a PreparedOptimizer over `optimizer`, which must outlive it
  /// and is saved by save_state. Under AcceleratorOptions::fused_optimizers a FusedUpdater is
  /// bound to it (not to an optimizer that is fused already). Preparing the same optimizer again
  /// returns another handle over the same optimizer and fused update.
  PreparedOptimizer prepare_optimizer(torch::optim::Optimizer& optimizer);
  /// The scheduler part of prepare: a PreparedScheduler over `scheduler`, which must outlive it
  /// and is saved by save_state; it advances only when the optimizer really stepped. Preparing
  /// the same scheduler again returns a copy of the first handle.
  PreparedScheduler prepare_scheduler(torch::optim::LRScheduler& scheduler);
  /// The loader part of prepare: a copy of `loader` (at its position) that yields this process's
  /// share of each epoch (data_sharding.h) with the batches moved to device(), floating-point
  /// ones cast to bf16 under downcast_bf16. Bound for a GPU, a loader without worker threads gets
  /// one, so that batches are copied ahead of the step. The first prepared loader arms
  /// AcceleratorOptions::auto_resume. Throws Error when the sharding cannot work (split_batches
  /// with a batch size the processes do not divide), CheckpointError when a checkpoint that
  /// auto_resume loaded already saved this loader over another number of samples.
  DataLoader prepare_data_loader(const DataLoader& loader);
  /// The stream loader part of prepare: a copy of `loader` (at its position) that yields this
  /// process's share of the stream (StreamLoaderOptions::sharding), agrees with the other
  /// processes at every step so that uneven shares end together (padding batches flagged), and
  /// moves batches to device() as prepare_data_loader does. Saved and loaded with the training
  /// state (its position per rank); the first prepared loader of either kind arms
  /// AcceleratorOptions::auto_resume. Throws Error when the stream cannot be divided (sharding by
  /// shard with fewer shards than processes).
  StreamLoader prepare_stream_loader(const StreamLoader& loader);
  /// The token-window part of prepare: this process's stream over the same tokens
  /// (TokenWindows::for_process with the process index and device()), at position 0, its
  /// position saved and loaded by save_state / load_state (every process draws the same number
  /// of batches, so the main process's position is saved). Resume it with auto_resume_now() or
  /// load_state before the loop: there is no begin() to fire auto_resume.
  TokenWindows prepare_token_windows(const TokenWindows& windows);
  /// ZeRO stage 3's sharded start (accelerant/sharded.h): build the model while the result
  /// lives, and each of its Sharded blocks keeps only this process's share from the moment it is
  /// built, so the model is never whole in one process; prepare then keeps the shares as they
  /// are. Every process must build the same model from the same seed (checked per block). Below
  /// stage 3, on one process, and (not written yet) on a GPU or with downcast_bf16 it changes
  /// nothing: the model is built whole and prepare shards it. So the same code builds for every
  /// stage and device.
  ShardedStart sharded_start();

  // ---- the training step ---------------------------------------------------------------------
  /// loss.backward(), divided by the accumulation steps and scaled under fp16. Gradients of
  /// prepared models come back averaged across processes (unless accumulating). On more than one
  /// process with no prepared data loader it warns once on stderr (every rank would see the
  /// whole data set).
  void backward(const torch::Tensor& loss);

  /// backward() for a loss normalised by target tokens across the whole optimizer step: pass
  /// the *sum* of this micro-batch's per-token losses (reduction sum) and its number of target
  /// tokens. The gradients the optimizer sees are then those of (the sum over every micro-batch
  /// of the step, on every process) / (their total number of tokens), whereas backward(mean
  /// loss) gives the mean over micro-batches and processes of per-batch means, which weighs a
  /// short batch's tokens more (the gradient-accumulation bug Hugging Face fixed in 2024). What
  /// it adds: on the synchronising micro-step, one one-element all-reduce of the token count
  /// before backward and one pass scaling the gradients after it. Not in a graph step.
  void backward_per_token(const torch::Tensor& loss_sum, int64_t target_tokens);

  /// RAII scope of one micro-step of gradient accumulation: decides whether this micro-step
  /// synchronises (every gradient_accumulation_steps-th, and the last batch of an epoch) and
  /// turns the models' all-reduce off while it only accumulates.
  class AccumulationGuard;
  /// Starts one micro-step for `models` (prepared models or their holders; none = every prepared
  /// model): counts it in state()->micro_steps and sets sync_gradients, true on every
  /// gradient_accumulation_steps-th micro-step and on the last batch of an epoch, and the models'
  /// all-reduce to match. Keep the guard alive over the forward, backward() and the optimizer
  /// step. Throws Error for a model this Accelerator did not prepare, and inside a graph step
  /// (compile() decides there).
  template <class... Models>
  AccumulationGuard accumulate(const Models&... models);
  /// RAII scope in which backward only accumulates locally (no communication) for `model`.
  class NoSyncGuard;
  /// Turns `model`'s all-reduce off until the guard goes: backward() then only accumulates its
  /// gradients locally, and the first backward after it averages everything accumulated. Throws
  /// Error when `model` was not prepared by this Accelerator.
  template <class M>
  NoSyncGuard no_sync(const M& model);
  /// Whether this micro-step synchronises gradients (false while accumulating).
  bool sync_gradients() const;

  /// Clips the gradients' global norm (they are averaged already, so every rank sees the same
  /// norm); unscales fp16 gradients first. Returns the norm before clipping.
  double clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm,
                         double norm_type = 2.0);
  /// clip_grad_norm_ over every parameter of `model` (a std::shared_ptr<Module> or a
  /// TORCH_MODULE holder).
  template <class M>
  double clip_grad_norm_(const M& model, double max_norm, double norm_type = 2.0) {
    return clip_grad_norm_(detail::module_ptr(model)->parameters(), max_norm, norm_type);
  }

  /// clip_grad_norm_ that reads nothing on the host, for graph steps (where clip_grad_norm_
  /// refuses: its double result is a host read): the gradients are scaled on the device by
  /// min(1, max_norm / (norm + 1e-6)), and the norm before clipping comes back as a 0-dim tensor.
  torch::Tensor clip_grad_norm_tensor(const std::vector<torch::Tensor>& parameters, double max_norm,
                                      double norm_type = 2.0);
  /// clip_grad_norm_tensor over every parameter of `model` (a std::shared_ptr<Module> or a
  /// TORCH_MODULE holder).
  template <class M>
  torch::Tensor clip_grad_norm_tensor(const M& model, double max_norm, double norm_type = 2.0) {
    return clip_grad_norm_tensor(detail::module_ptr(model)->parameters(), max_norm, norm_type);
  }

  // ---- graph mode (graph_step.h, docs/graph_mode.md) -----------------------------------------
  /// A GraphStep for a whole training step (forward, backward, the prepared optimizer and
  /// scheduler, the fp16 scaler), captured once per input signature and replayed on a GPU. With
  /// gradient accumulation each call is one micro-step: compile decides, outside the step,
  /// whether it synchronises (so do not call accumulate() inside), and the accumulating and the
  /// synchronising micro-steps are two graphs. The step must not outlive this Accelerator.
  GraphStep compile(GraphStep::Function step, GraphStepOptions options = {});

  /// Mixed-precision autocast for the forward pass (a no-op guard when mixed_precision is no).
  AutocastGuard autocast() const;

  // ---- evaluation (evaluation.h) -------------------------------------------------------------
  /// Runs `body` with `model` (a prepared model or its holder) in eval mode and gradients off,
  /// puts back each module's train/eval mode after (also when `body` throws), then averages the
  /// metrics `body` added across processes by their weights with one all-reduce and returns the
  /// means by name. A collective: every process calls it and adds the same names (checked: a
  /// difference throws Error on every process). A metric of total weight 0 comes back NaN.
  template <class M>
  std::map<std::string, double> evaluate(const M& model,
                                         const std::function<void(MeanMetrics&)>& body) {
    return evaluate_modules({detail::module_ptr(model)}, body);
  }

  // ---- metrics and communication -------------------------------------------------------------
  /// Every rank's tensor concatenated along dim 0 (bf16 comes back as fp32).
  torch::Tensor gather(const torch::Tensor& tensor);
  /// gather(), minus the even_batches padding on the last batch of an epoch: over an epoch the
  /// results are exactly the dataset's samples.
  torch::Tensor gather_for_metrics(const torch::Tensor& tensor);
  /// Every tensor of `batch` gathered as gather_for_metrics gathers one, after padding it across
  /// processes along every dimension but the first (pad_across_processes with 0: a collate's
  /// mask is false and its lengths unchanged there), so that variable-length batches gather.
  /// The names and their order are kept; every process must hold the same names, each with the
  /// same number of dimensions. A collective per tensor and padded dimension.
  Batch gather_for_metrics(const Batch& batch);
  /// all_reduce across ranks (bf16 reduced and returned as fp32).
  torch::Tensor reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// `tensor` padded at the end of `dim` with `pad_value` to the largest size any process has
  /// there, so that predictions of different lengths can be gathered. A collective.
  torch::Tensor pad_across_processes(const torch::Tensor& tensor, int64_t dim = 0,
                                     double pad_value = 0);
  /// pad_across_processes of every tensor of `batch` that has dimension `dim`, in items() order
  /// (the others are kept as they are); every process must hold the same names.
  Batch pad_across_processes(const Batch& batch, int64_t dim = 0, double pad_value = 0);
  /// Returns when every process has reached this call (a barrier). Like every collective here,
  /// throws Error after end_training().
  void wait_for_everyone();

  /// Writes the arguments (streamed, no separators) and a newline on the main process only.
  template <class... Args>
  void print(const Args&... args) const {
    if (!is_main_process()) return;
    std::ostringstream line;  // here, as streaming is defined per type; the writing is not
    (line << ... << args);
    print_line(line.str());
  }

  /// Seeds LibTorch's generators (CPU and CUDA) and std::rand; with device_specific each rank
  /// gets seed + rank, e.g. for dropout masks that should differ between ranks.
  void set_seed(uint64_t seed, bool device_specific = false);

  /// The model itself: prepare() does not wrap models (kept for code written for Accelerate).
  template <class M>
  M unwrap_model(const M& model) const {
    return model;
  }

  /// Saves from the main process only, tensors moved to the CPU first (xm.save's semantics),
  /// atomically (a temporary file renamed into place). Tensors, tensor lists and modules (the
  /// latter readable with torch::load(module, path)).
  void save(const torch::Tensor& tensor, const std::string& path) const;
  /// A list of tensors, saved as one tensor is (readable with torch::load(tensors, path)).
  void save(const std::vector<torch::Tensor>& tensors, const std::string& path) const;
  /// A model's parameters and buffers (a std::shared_ptr<Module> or a TORCH_MODULE holder), as
  /// torch::save(module, path) writes them but on the CPU, whatever device it trains on.
  template <class M, class = std::enable_if_t<detail::is_shared_module<M>::value ||
                                              detail::is_module_holder_v<M>>>
  void save(const M& model, const std::string& path) const {
    save_module(*detail::module_ptr(model), path);
  }

  // ---- checkpoints (docs/checkpoints.md) -----------------------------------------------------
  /// Saves the whole training state into `dir` (a directory; see accelerant/checkpoint.h): every
  /// prepared model, optimizer and scheduler, the fp16 scaler, each loader's data position and
  /// seed, the step counters, each rank's random generators and the objects registered with
  /// register_for_checkpointing. Call it on every process, between steps; in the middle of
  /// gradient accumulation each rank also saves the gradients it accumulated so far, so that the
  /// resumed run is exact (such a checkpoint loads only on as many processes). Crash-safe: written
  /// into a hidden temporary directory beside `dir`, fsynced, then renamed into place, so a crash
  /// or a full disk at any moment leaves the previous checkpoint as it was. `dir` empty = automatic
  /// naming under AcceleratorOptions::project_dir. Returns the directory written. Throws
  /// CheckpointError (on every process) when any process could not write its part. Under in-place
  /// recovery (Recovery::kReplaceFailedWorker), a process that dies during the save abandons it:
  /// the survivors form the group again with its replacement and return "" (nothing written).
  std::string save_state(const std::string& dir = "");
  /// Loads a checkpoint written by save_state; `dir` empty = the newest complete one under
  /// project_dir. Everything is checked first (every file's size and checksum, the format
  /// version, that the models' parameter names and shapes, the optimizers and schedulers, the
  /// scaler and the datasets match) on every process; a problem anywhere throws CheckpointError
  /// on every process and changes nothing. On another number of processes the data position is
  /// re-sharded (no sample skipped or repeated). Returns the directory loaded.
  std::string load_state(const std::string& dir = "");
  /// Makes every process's training state the one process `source_rank` holds, by broadcast
  /// (a collective, no files): every prepared model, optimizer and scheduler, the fp16 scaler,
  /// the step counters, each loader's data position and seed and the registered objects, checked
  /// on every process first and applied everywhere or nowhere, as load_state does. Each process
  /// keeps its own random generators. This is how a process that joins a running job (one that
  /// replaces a failed process) is brought up to date from a survivor. Call it between steps.
  /// Throws CheckpointError on every process, changing nothing, where the processes do not each
  /// hold the whole state: under ZeRO (sharded optimizer state or parameters), with stream
  /// loaders (a position per process), or in the middle of gradient accumulation.
  void sync_state_from(int source_rank = 0);
  /// Also saved and loaded: any object with `save(torch::serialize::OutputArchive&) const` and
  /// `load(torch::serialize::InputArchive&)` (an nn::Module, an optimizer, your own type). It
  /// must outlive the Accelerator's use of it. Saved by the main process; loaded on all.
  template <class T>
  void register_for_checkpointing(T& object) {
    register_checkpoint_object([&object](torch::serialize::OutputArchive& a) { object.save(a); },
                               [&object](torch::serialize::InputArchive& a) { object.load(a); });
  }
  /// Writes a model's weights as safetensors (accelerant/safetensors.h) into `dir`, from the main
  /// process: model.safetensors, or shards of at most `max_shard_size` ("10GB", "500MB", bytes)
  /// plus model.safetensors.index.json. Call it on every process; a failure throws on all.
  template <class M, class = std::enable_if_t<detail::is_shared_module<M>::value ||
                                              detail::is_module_holder_v<M>>>
  void save_model(const M& model, const std::string& dir,
                  const std::string& max_shard_size = "10GB") {
    save_model_module(*detail::module_ptr(model), dir, max_shard_size);
  }
  /// Loads weights written by save_model into `model`; every process reads `dir`. Names and shapes
  /// are checked before anything changes, and a failure on any process throws on all.
  template <class M, class = std::enable_if_t<detail::is_shared_module<M>::value ||
                                              detail::is_module_holder_v<M>>>
  void load_model(M& model, const std::string& dir) {
    load_model_module(*detail::module_ptr(model), dir);
  }
  /// Under AcceleratorOptions::auto_resume: resumes from the newest complete checkpoint now,
  /// instead of at the first begin() of a prepared loader, e.g. to read the resumed epoch before
  /// the loop. Call it on every process (a collective), after prepare. Does nothing when
  /// auto_resume is off, when it ran already or when load_state replaced it.
  void auto_resume_now();
  /// The directory of automatic checkpoints, `<project_dir>/checkpoints` ("" without
  /// project_dir).
  std::string checkpoints_dir() const;

  /// Waits for every process and leaves the process group; the Accelerator is done afterwards.
  /// Flushes and closes the trackers first (as the destructor does when this is not called).
  /// Under ZeRO stage 3 it first makes every sharded block whole again on every process
  /// (ShardedImpl::unshard), so that the model can be used after it, by any one process.
  void end_training();

  // ---- trackers (docs/observability.md) -------------------------------------------------------
  /// Starts the trackers named by AcceleratorOptions::log_with and those added with add_tracker,
  /// in `<project_dir>/<project_name>/` (created), recording `config` (the run's
  /// hyper-parameters). Main process only; elsewhere a no-op. Never talks to other ranks.
  void init_trackers(const std::string& project_name, const TrackerConfig& config = {});
  /// Adds a tracker of the user's. Before init_trackers it is started there; after, at once, with
  /// the same run folder and config.
  void add_tracker(std::shared_ptr<Tracker> tracker);
  /// Records scalars at `step` in every tracker, e.g. `log({{"loss", l}}, step)`. Main process
  /// only (a no-op elsewhere, never a collective); before init_trackers, throws Error.
  void log(const TrackerScalars& values, int64_t step);

  // ---- profiler traces (docs/observability.md) -----------------------------------------------
  /// Records a Chrome trace (chrome://tracing, ui.perfetto.dev) of LibTorch's operators on the
  /// calling thread and of Accelerant's spans (all-reduce buckets, checkpoints, data waits,
  /// optimizer steps) until the returned scope stops, or over the optimizer steps of
  /// ProfileOptions::steps. Then each process writes `<dir>/trace_rank<r>.json` and, after a
  /// barrier, the main process merges them into `<dir>/trace.json`, a lane per rank. Every
  /// process must call profile, and stop its scope, together (both are collectives). One profile
  /// at a time per process; a second throws Error. An unwritable folder throws Error on every
  /// process.
  ProfileScope profile(const ProfileOptions& options = ProfileOptions());

  // ---- state ---------------------------------------------------------------------------------
  // The process getters below were read at construction: still valid after end_training().
  /// The settings in force, resolved at construction (option > environment > config file >
  /// default).
  const AcceleratorSettings& settings() const;
  /// The mixed precision in force: no, fp16 (CUDA only; with a loss scaler) or bf16.
  MixedPrecision mixed_precision() const;
  /// Micro-steps per optimizer step; 1 = no gradient accumulation.
  int64_t gradient_accumulation_steps() const;
  /// Where this process trains and prepare puts models and batches: `cuda:<local rank>` when a
  /// GPU is visible and the cpu setting is off, else cpu.
  torch::Device device() const;
  /// This process's rank among all processes, 0 to world_size() - 1 (0 when not launched).
  int rank() const;
  /// The processes training together (the world size); 1 when not launched.
  int world_size() const;
  /// This process's rank among the processes of its machine.
  int local_rank() const;
  /// Accelerate's name for rank() (docs/names.md), kept so that a port of a Python script
  /// compiles; deprecated: the warning names the one name.
  [[deprecated("Accelerant's name is rank()")]] int process_index() const { return rank(); }
  /// Accelerate's name for world_size(); deprecated.
  [[deprecated("Accelerant's name is world_size()")]] int num_processes() const {
    return world_size();
  }
  /// Accelerate's name for local_rank(); deprecated.
  [[deprecated("Accelerant's name is local_rank()")]] int local_process_index() const {
    return local_rank();
  }
  /// Whether this is rank 0, the process that writes files and prints.
  bool is_main_process() const;
  /// Whether this is the first process (local rank 0) of its machine.
  bool is_local_main_process() const;
  /// Threads per process in force (after the CPU defaults).
  int threads() const;
  /// The TrainingState this Accelerator shares with what it prepared: sync_gradients, the step
  /// counters, the end of the loader's epoch, the fp16 scaler.
  const std::shared_ptr<TrainingState>& state() const;
  /// The gradient reducer's counters for a prepared model.
  template <class M>
  GradientReducerStats reducer_stats(const M& model) const {
    return reducer_for(*detail::module_ptr(model)).stats();
  }

 private:
  template <class T>
  auto prepare_one(T&& object);
  void save_module(const torch::nn::Module& module, const std::string& path) const;
  void save_model_module(const torch::nn::Module& module, const std::string& dir,
                         const std::string& max_shard_size);
  void load_model_module(torch::nn::Module& module, const std::string& dir);
  void register_checkpoint_object(std::function<void(torch::serialize::OutputArchive&)> save,
                                  std::function<void(torch::serialize::InputArchive&)> load);
  /// This process's place among the processes a checkpoint is saved or loaded by.
  detail::CheckpointRanks checkpoint_ranks() const;
  GradientReducer& reducer_for(const torch::nn::Module& module) const;
  GradientReducer& zero_reducer_for(torch::optim::Optimizer& optimizer);
  bool gradients_sharded() const;
  void check_zero_stage() const;
  AccumulationGuard accumulate_modules(std::vector<std::shared_ptr<torch::nn::Module>> modules);
  std::map<std::string, double> evaluate_modules(
      const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
      const std::function<void(MeanMetrics&)>& body);
  /// Multiplies the gradients the optimizers will use (ZeRO stage 2: the shares) by `factor`.
  void scale_gradients(double factor);
  Communicator& communicator() const;
  /// Warns once, on the main process, when a prepared model trains on several processes and no
  /// loader was prepared (every rank then likely iterates the whole data set).
  void warn_if_data_unsharded();

  void resume_from_latest();
  /// In-place recovery (Recovery::kReplaceFailedWorker): after a collective failed because a
  /// process died, abandons the step, forms the group again with the replacement and hands it
  /// the state; false when this is not such a failure (then the caller rethrows).
  bool recover_step_in_place(const std::exception& failure);
  /// Whether a failure now is one in-place recovery handles: the launcher replaces failed
  /// workers, and the group broke (a process died).
  bool recoverable_in_place() const;
  /// Forms the group again with the replacement and hands it the state, saying what failed and
  /// what becomes of it (`outcome`).
  void regroup_in_place(const std::string& what_failed, const std::exception& failure,
                        const std::string& outcome);
  /// Every process says whether it is `joining` (a replacement); all take the state of the lowest
  /// rank that is not (sync_state_from). A collective.
  void join_running_group(bool joining);
  /// Under in-place recovery, what each prepared loader calls as it hands out a batch (the
  /// generators reseeded from the seed, the rank and the step); null otherwise.
  std::function<void()> reseed_at_each_batch() const;
  /// Throws Error, with the fix, when preparing `what` (a kind of loader that keeps a position per
  /// process) under in-place recovery, which hands over data loaders' positions only.
  void refuse_under_in_place_recovery(const char* what) const;
  void start_step_breakdown();
  /// Flushes and closes the trackers (end_training, the destructor); reports no error twice.
  void close_trackers();
  /// print's output: `line` and a newline on standard output, flushed.
  void print_line(const std::string& line) const;

  // Everything the Accelerator holds lives in the library (src/accelerator/accelerator_impl.h):
  // this header states the contract, and the layout can change without rebuilding users.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What Accelerator::accumulate returns: while it lives, the models' all-reduce runs only on a
/// synchronising micro-step; when it goes, their reducers synchronise again. Movable, not
/// copyable.
class Accelerator::AccumulationGuard {
 public:
  /// Takes `reducers`, whose sync accumulate() has set for this micro-step, and turns their sync
  /// back on when it goes.
  explicit AccumulationGuard(std::vector<GradientReducer*> reducers)
      : reducers_(std::move(reducers)) {}
  ~AccumulationGuard() {
    for (auto* reducer : reducers_) reducer->set_sync(true);
  }
  /// Takes over `other`'s reducers; `other` then turns nothing back on.
  AccumulationGuard(AccumulationGuard&& other) noexcept : reducers_(std::move(other.reducers_)) {
    other.reducers_.clear();
  }
  AccumulationGuard(const AccumulationGuard&) = delete;
  AccumulationGuard& operator=(const AccumulationGuard&) = delete;

 private:
  std::vector<GradientReducer*> reducers_;
};

/// What Accelerator::no_sync returns: one model's all-reduce is off while it lives and on again
/// when it goes. Movable, not copyable.
class Accelerator::NoSyncGuard {
 public:
  /// Turns `reducer`'s sync off until the guard goes.
  explicit NoSyncGuard(GradientReducer& reducer) : reducer_(&reducer) { reducer_->set_sync(false); }
  ~NoSyncGuard() {
    if (reducer_) reducer_->set_sync(true);
  }
  /// Takes over `other`'s reducer; `other` then turns nothing back on.
  NoSyncGuard(NoSyncGuard&& other) noexcept : reducer_(other.reducer_) { other.reducer_ = nullptr; }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  GradientReducer* reducer_;
};

template <class... Models>
Accelerator::AccumulationGuard Accelerator::accumulate(const Models&... models) {
  return accumulate_modules({detail::module_ptr(models)...});
}

template <class M>
Accelerator::NoSyncGuard Accelerator::no_sync(const M& model) {
  return NoSyncGuard(reducer_for(*detail::module_ptr(model)));
}

template <class T>
auto Accelerator::prepare_one(T&& object) {
  using D = std::decay_t<T>;
  if constexpr (detail::is_shared_module<D>::value || detail::is_module_holder_v<D>) {
    prepare_model(detail::module_ptr(object));
    return D(object);
  } else if constexpr (std::is_base_of_v<torch::optim::Optimizer, D>) {
    static_assert(std::is_lvalue_reference_v<T>,
                  "prepare(): pass the optimizer as a named object that outlives the loop; the "
                  "returned PreparedOptimizer refers to it");
    return prepare_optimizer(object);
  } else if constexpr (std::is_base_of_v<torch::optim::LRScheduler, D>) {
    static_assert(std::is_lvalue_reference_v<T>,
                  "prepare(): pass the scheduler as a named object that outlives the loop; the "
                  "returned PreparedScheduler refers to it");
    return prepare_scheduler(object);
  } else if constexpr (std::is_same_v<D, DataLoader>) {
    return prepare_data_loader(object);
  } else if constexpr (std::is_same_v<D, StreamLoader>) {
    return prepare_stream_loader(object);
  } else if constexpr (std::is_same_v<D, TokenWindows>) {
    return prepare_token_windows(object);
  } else if constexpr (detail::is_torch_data_loader<D>::value) {
    static_assert(detail::always_false_v<D>,
                  "prepare() cannot shard a torch::data DataLoader: it builds its batches from "
                  "indices of its own, and prepare must choose each process's indices. Fix: pass "
                  "its dataset to accelerant::make_data_loader(dataset, "
                  "accelerant::DataLoaderOptions().batch_size(...)) and prepare that loader.");
  } else if constexpr (detail::is_dataset<D>::value) {
    static_assert(detail::always_false_v<D>,
                  "prepare() takes a loader, not a dataset (the batch size, shuffling and collate "
                  "are the loader's). Fix: prepare(accelerant::make_data_loader(dataset, "
                  "accelerant::DataLoaderOptions().batch_size(...))).");
  } else {
    static_assert(
        detail::always_false_v<D>,
        "prepare() accepts std::shared_ptr<nn::Module subclass>, TORCH_MODULE holders, "
        "torch::optim optimizers and LR schedulers (as lvalues), accelerant::DataLoader "
        "(make_data_loader), accelerant::StreamLoader (make_stream_loader) and "
        "accelerant::TokenWindows. Fix: wrap other "
        "data sources with make_data_loader, or make_stream_loader for data without a size.");
  }
}

}  // namespace accelerant
