// ZeRO stage 3's unit: a block of a model whose parameters each process keeps only a share of
// (as FSDP's fully_shard and DeepSpeed's stage 3 do), gathered whole only while the block runs.
//
//   // The model wraps each transformer block (the wrapper is a pass-through until sharded),
//   // or wrap_blocks wraps a Sequential's entries by rule:
//   blocks->push_back(accelerant::Sharded(Block(config)));
//   ...
//   auto& comm = accelerant::ProcessState::get().communicator();
//   accelerant::shard_model(*model, comm);            // each block keeps its shares only
//   accelerant::GradientReducer reducer(accelerant::replicated_parameters(*model), comm);
//   torch::optim::AdamW adamw(accelerant::parameters_to_update(*model), options);
//   // the training loop does not change: forward, backward, adamw.step(), zero_grad()
//
// What a sharded block does, each step:
// - Forward: it all-gathers its parameters into their own tensors, runs the block, and frees
//   their memory again (the tensors keep their shapes; their storage is emptied).
// - Backward: a hook on the block's output gathers them again just before backward reaches the
//   block (the tensors that autograd saved are the parameters themselves, so they read the
//   gathered values). When every trainable parameter of the block has its gradient, the
//   gradients are averaged and reduce-scattered into the shares' .grad (each process receives
//   its share of the average), the whole gradients are released, and so are the parameters.
//   The reduce-scatter overlaps the backward of the blocks before it; the end of backward waits.
// - Prefetch: from the second step on, a block that starts its forward also starts the gather of
//   the block that ran after it in the last step, and a block that starts its backward the
//   gather of the one before it, so that each gather overlaps another block's compute
//   (set_prefetch; the share of the step still spent waiting is in stats().gather_wait).
// - The optimizer updates the shares (parameters_to_update gives them in place of the blocks'
//   parameters): elementwise updates (SGD, Adam, AdamW) are then exactly those of plain data
//   parallelism, each process computing its share.
//
// Parameters outside every sharded block stay whole on every process, as FSDP keeps its root's:
// a GradientReducer over replicated_parameters averages their gradients.
//
// Memory per process: the shares (1/N of each block's parameters, each padded to N equal
// pieces), plus one block gathered whole at a time with its gradients during backward, the next
// block's parameters gathered ahead, and one block's flat reduce-scatter buffer (about the
// block's size) in flight: starting a block's reduce-scatter collects the one before it.
//
// Every process must run each block as many times (each run is a collective): an evaluation that
// takes more batches on one process, or inference on one process only, hangs unless it runs
// inside GatheredParameters.
//
// Accelerator::prepare does all of this under zero_stage(3) (docs/zero.md, "Stage 3").
//
// A sharded start builds a model that is never whole in one process: inside a ShardedStart
// (Accelerator::sharded_start under zero_stage(3)), each Sharded block is sharded as soon as it
// is constructed, so a process holds one block whole at a time, just built, and the shares of
// the others. The values are those of the unsharded build from the same seed (the blocks draw
// from the random generator in the same order); the processes check that they built the same
// values (each block's, before it is cut).
//
//   accelerant::Accelerator acc(accelerant::AcceleratorOptions().zero_stage(3));
//   torch::manual_seed(seed);  // the same on every process
//   auto model = [&] { auto start = acc.sharded_start(); return std::make_shared<GPT>(config); }();
//   auto [m, opt] = acc.prepare(model, adamw);  // keeps the blocks' shares as they are
//
// Between steps the blocks' parameters hold no memory; GatheredParameters makes them whole for
// reading, printing or saving them. On the CPU a freed parameter points at reserved address space
// that may not be read: touching it there (printing, saving, model->to()) ends the process with
// SIGSEGV and a message naming the parameter and this fix, instead of reading garbage.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "accelerant/communicator.h"

namespace accelerant {

/// What a sharded block has done, for tests and benchmarks.
struct ShardedStats {
  /// All-gathers of the block's parameters (forward, backward, GatheredParameters).
  int64_t gathers = 0;
  /// Reduce-scatters of its gradients (synchronising backward passes).
  int64_t reduce_scatters = 0;
  /// Elements of this process's shares (padding included).
  int64_t share_elements = 0;
  /// Elements of the block's parameters, whole.
  int64_t parameter_elements = 0;
  /// Gathers started ahead of use, while another block ran (see set_prefetch).
  int64_t prefetches = 0;
  /// Time spent waiting for the block's all-gathers to finish when it needed its parameters:
  /// the part of the gathers the step sees (the whole gather without a prefetch).
  std::chrono::nanoseconds gather_wait{0};
};

/// A block whose parameters are sharded across processes once shard() is called (see the file
/// comment); before that, a pass-through that runs the block. It registers the block's children,
/// parameters and buffers under their own names (not the block itself), so a model's names are
/// the same with and without the wrapper, sharded or not: weights saved from one load into the
/// other.
class ShardedImpl : public torch::nn::Module {
 public:
  /// Wraps `block`, any module whose forward takes and returns one tensor.
  explicit ShardedImpl(torch::nn::AnyModule block);
  /// Wraps a Sequential (which AnyModule cannot hold: its forward is a template).
  explicit ShardedImpl(torch::nn::Sequential block);
  /// Wraps a module or TORCH_MODULE holder: Sharded(Block(config)).
  template <class Block, class = std::enable_if_t<
                             !std::is_same<std::decay_t<Block>, torch::nn::AnyModule>::value &&
                             !std::is_same<std::decay_t<Block>, torch::nn::Sequential>::value>>
  explicit ShardedImpl(Block block) : ShardedImpl(torch::nn::AnyModule(std::move(block))) {}
  ~ShardedImpl() override;

  /// The block's output. Sharded: gathers the parameters, runs the block and frees them, and
  /// with grad mode on arranges for backward to gather them again (see the file comment).
  torch::Tensor forward(torch::Tensor input);

  /// Keeps this process's share of each parameter of the block and frees the rest: a collective
  /// of `communicator`'s processes, which must all shard the same block (the same model, built
  /// alike; the values come from each process's own copy, so build it from the same seed or
  /// broadcast first). `communicator` must outlive the block. With one process nothing is
  /// sharded. Throws Error, changing nothing, for parameters that are not dense fp32 tensors
  /// with storage of their own, or when already sharded.
  void shard(Communicator& communicator);
  /// Whether shard() sharded the block (false with one process).
  bool sharded() const;
  /// This process's share of each of the block's parameters, in the order of its parameters():
  /// 1-D fp32 leaf tensors of equal length on every process (the last pieces padded with zeros),
  /// requiring grad where the parameter does. A synchronising backward leaves the share of the
  /// averaged gradient in their .grad (added to it, as autograd accumulates). Empty unless
  /// sharded.
  const std::vector<torch::Tensor>& shares() const;
  /// With sync off, backward keeps the block's whole gradients in the parameters' .grad
  /// (gradient accumulation: memory for the whole block's gradients); the next backward with sync
  /// on reduce-scatters everything accumulated. True when made.
  void set_sync(bool enabled);
  /// Whether a backward pass that leaves some of the block's trainable parameters without a
  /// gradient is an error (thrown at its end, after the processes reduced them as zeros) or
  /// allowed (they count as zeros: a branch a step skips). Every process must skip the same
  /// parameters: the block's reduce-scatter starts when its gradients are complete, so a
  /// parameter skipped on some processes only starts it later there than elsewhere, out of step
  /// with their other collectives (the shared-memory transport then names both processes'
  /// collectives; over Gloo the watchdog does after collective_timeout). False (an error) when
  /// made; the Accelerator sets AcceleratorOptions::allow_unused_parameters.
  void set_allow_unused_parameters(bool allowed);
  /// Whether other blocks start this block's gather ahead of its use: in forward the block that
  /// ran before it in the last step's order starts it, in backward the one after it, so that
  /// the gather overlaps their compute at the cost of a second block's parameters held at once.
  /// The order is the one the blocks ran forward in during the last step that ended with a
  /// backward pass; a prefetch not used by the end of that backward is waited for and freed.
  /// Every process must set it alike (the prefetches are collectives). True when made.
  void set_prefetch(bool enabled);
  /// What the block has done so far (a copy).
  ShardedStats stats() const;
  /// Whether the parameters hold their values now (always, unless sharded).
  bool gathered() const;

  /// The wrapped block.
  const std::shared_ptr<torch::nn::Module>& block() const;

  /// Sharded: all-gathers the parameters into their tensors. A collective. Nested calls count:
  /// the parameters stay whole until as many release() calls. GatheredParameters is the safe
  /// form; forward and backward call these themselves. Throws Error, before communicating, when
  /// the block's parameters changed since shard() (replaced, added, given other memory, cast).
  void gather();
  /// Sharded: frees the parameters' memory after the matching gather(); their shares stay.
  void release();
  /// Sharded: gathers the parameters (a collective) and stops sharding the block: from then on it
  /// is the plain block again, its parameters whole, and its shares are dropped (an optimizer
  /// over them no longer changes the block). Accelerator::end_training calls it, so that the
  /// model can be used after the process group is gone.
  void unshard();
  /// Sharded and gathered: keeps what was written into the whole parameters (a load) by copying
  /// this process's piece of each into its share, in place. Not a collective, so every process
  /// must have written the same values. Throws Error when the parameters are not gathered.
  void store_gathered();

 private:
  struct State;  // src/train/sharded.cpp: the block, its layout, shares and pass in progress
  friend void drop_prefetched_gathers();
  ShardedImpl(std::shared_ptr<torch::nn::Module> block,
              std::function<torch::Tensor(torch::Tensor)> forward);
  std::shared_ptr<State> state_;
};
/// The module holder of ShardedImpl: Sharded(block) makes one, as torch::nn::Linear(...) does.
TORCH_MODULE(Sharded);

/// Which entries of a Sequential wrap_blocks wraps: given each entry's name in the Sequential
/// ("0", "1", ...) and its module.
using BlockRule = std::function<bool(const std::string& name, const torch::nn::Module& module)>;

/// A Sequential with the entries of `model` for which `rule` holds wrapped in Sharded, the others
/// as they are, in the same order and under the same names (the wrapper adds none): the
/// automatic wrap by rule, as FSDP2's fully_shard on each transformer layer. A Sequential's
/// forward runs whatever it holds, so the model runs unchanged. Other containers cannot be wrapped
/// from outside in LibTorch (their forward calls the blocks themselves, and a C++ module has no
/// forward pre-hook): there, wrap each block as the model is built,
/// `blocks->push_back(Sharded(Block(config)))`. Wrap before sharding (before prepare); built
/// inside a ShardedStart, the wrapped entries are sharded here. Throws Error for an entry that is
/// a Sharded block already or holds one.
torch::nn::Sequential wrap_blocks(const torch::nn::Sequential& model, const BlockRule& rule);

/// A BlockRule: the entries whose modules have at least `parameters` parameter elements, in all
/// (a transformer layer, not a LayerNorm).
BlockRule blocks_with_at_least(int64_t parameters);

/// Shards every Sharded block inside `model` (shard() on each, in the order of
/// model.modules()) that is not sharded yet (a sharded start shards them as they are built);
/// returns them all. A collective: every process calls it on its copy of the model.
std::vector<std::shared_ptr<ShardedImpl>> shard_model(torch::nn::Module& model,
                                                      Communicator& communicator);

/// The Sharded blocks inside `model`, in the order of model.modules().
std::vector<std::shared_ptr<ShardedImpl>> sharded_blocks(const torch::nn::Module& model);

/// What an optimizer over `model` updates: each sharded block's shares in place of its
/// parameters, and every other trainable parameter itself.
std::vector<torch::Tensor> parameters_to_update(torch::nn::Module& model);

/// For an optimizer built over `model`'s parameters before it was sharded: replaces, in its
/// parameter groups, each parameter of a sharded block by its share (groups and their options
/// stay). Throws Error, changing nothing, when the optimizer holds state already (it is kept per
/// parameter, and the shares are new tensors).
void optimize_shares(torch::optim::Optimizer& optimizer, torch::nn::Module& model);

/// Waits for every gather a prefetch started ahead of use (ShardedImpl::set_prefetch) and frees
/// its memory. A prefetched gather holds the shares' values of the moment it started: the
/// Accelerator calls this before each optimizer step under stage 3; without it, call it before
/// changing the shares in place when a forward may have ended early since the last backward (an
/// evaluation that ran only some blocks). The end of every backward pass drops them too.
void drop_prefetched_gathers();

/// `model`'s named parameters outside every sharded block (those a GradientReducer averages
/// whole); all of them when nothing is sharded.
torch::OrderedDict<std::string, torch::Tensor> replicated_parameters(torch::nn::Module& model);

/// ZeRO stage 3's sharded start (see the file comment): while it lives, every Sharded block
/// constructed on this thread is sharded over `communicator` at once, after checking that every
/// process built the same values (a collective per block: every process must build the same
/// model, from the same seed). Scopes nest (the innermost counts); over one process blocks are
/// built whole, as without it. Movable, not copyable; it must end on the thread that made it.
class ShardedStart {
 public:
  /// No scope: changes nothing (what Accelerator::sharded_start gives below stage 3).
  ShardedStart();
  /// Shards each block built while this lives over `communicator`, which must outlive the blocks.
  explicit ShardedStart(Communicator& communicator);
  /// Ends the scope: blocks built after it are whole again (or sharded by the enclosing scope).
  ~ShardedStart();
  /// Takes over `other`'s scope (Accelerator::sharded_start returns one).
  ShardedStart(ShardedStart&& other) noexcept;
  ShardedStart& operator=(ShardedStart&&) = delete;
  ShardedStart(const ShardedStart&) = delete;
  ShardedStart& operator=(const ShardedStart&) = delete;

 private:
  struct Scope;  // src/train/sharded.cpp: the communicator and the scope it replaced
  std::unique_ptr<Scope> scope_;
};

/// While it lives, every sharded block of a model holds its whole parameters (a collective on
/// construction): for reading, printing or saving them between steps. Writes
/// to the parameters are not kept (the shares are the values) unless store() is called. Not
/// copyable.
class GatheredParameters {
 public:
  /// Gathers every sharded block of `model` (none sharded: nothing to do); throws Error, having
  /// released what it gathered, when a gather fails.
  explicit GatheredParameters(const torch::nn::Module& model);
  /// Frees the gathered parameters again (their shares stay).
  ~GatheredParameters();
  /// Keeps the values now in the gathered parameters (store_gathered on each block): after
  /// loading weights into them, on every process alike.
  void store();
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

 private:
  struct Blocks;  // src/train/sharded.cpp: the blocks it gathered
  std::unique_ptr<Blocks> blocks_;
};

}  // namespace accelerant
