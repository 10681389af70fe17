// ZeRO stage 3's sharded block (accelerant/sharded.h): its parameters' shares, the all-gather
// that makes them whole around forward and backward, and the reduce-scatter of their gradients.
//
// Layout: parameter p of a block is cut into N pieces of chunk[p] elements (its element count
// divided by N, rounded up to 16 elements so that each piece starts on a 64-byte line); process
// r keeps piece r, padded with zeros past the parameter's end. Gathering a parameter is one
// all-gather of its pieces straight into its own storage, padded to N pieces: piece r is its
// elements [r * chunk, (r + 1) * chunk). For the gradients, a process's pieces of all the block's
// parameters lie one after another in S elements (piece p at offset[p]), so one reduce-scatter of
// N * S gradient elements gives each process its S.
//
// Freeing a parameter empties its storage (0 bytes) but keeps the storage object: the tensors
// that autograd saved for backward are the parameters themselves, and read the values written
// back into that storage when backward gathers again. Those values are written through a tensor
// of their own (storage_alias), so that the write does not count as an in-place change of a
// tensor that autograd saved.
#include "accelerant/sharded.h"

#include <c10/core/StorageImpl.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "accelerant/error.h"
#include "base/step_timing.h"
#include "base/text.h"
#include "base/trace_events.h"
#include "comm/collective_label.h"
#include "train/end_of_backward.h"
#include "train/freed_parameters.h"
#include "train/gradient_ready_hook.h"

namespace accelerant {

namespace {

constexpr int64_t kShareAlignment = 16;  // elements: 64 bytes of fp32

// Gives the storage of `param` `bytes` bytes of new memory (0 frees it), keeping the storage
// object that autograd's saved tensors point at.
void resize_storage(const torch::Tensor& param, size_t bytes) {
  c10::StorageImpl* storage = param.storage().unsafeGetStorageImpl();
  c10::Allocator* allocator = storage->allocator();
  if (allocator == nullptr) allocator = c10::GetAllocator(param.device().type());
  storage->set_data_ptr_noswap(allocator->allocate(bytes));
  storage->set_nbytes(bytes);
}

// A flat tensor over the storage of `param` with a version counter of its own (see the file
// comment).
torch::Tensor storage_alias(const torch::Tensor& param, int64_t elements) {
  torch::Tensor alias =
      torch::empty({0}, torch::TensorOptions(param.dtype()).device(param.device()));
  alias.set_(param.storage(), 0, {elements}, {1});
  return alias;
}

// Rows [N, chunk] of the gathered layout <-> a parameter's `numel` elements, flat: the full
// rows, then what remains of the last one.
template <class Copy>
void for_each_row_run(int64_t numel, int64_t chunk, Copy copy) {
  const int64_t full = numel / chunk, rest = numel - full * chunk;
  if (full > 0) copy(0, full, int64_t{0});
  if (rest > 0) copy(full, 1, rest);
}

// A per-parameter fingerprint of `params`' values: the sum of their bit patterns and of their
// values. Equal builds from the same seed give equal bits; another seed differs in both.
std::string value_fingerprints(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> bits;
  std::vector<double> values;
  for (const auto& p : params) {
    const torch::Tensor flat = p.detach().reshape({-1});
    bits.push_back(flat.view(torch::kInt).sum(torch::kLong).item<int64_t>());
    values.push_back(flat.sum(torch::kDouble).item<double>());
  }
  std::string out(reinterpret_cast<const char*>(bits.data()), bits.size() * sizeof(int64_t));
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
  return out;
}

}  // namespace

namespace {
// A ShardedStart's scope; they nest, and the innermost of this thread counts.
struct StartScope {
  Communicator* communicator = nullptr;
  StartScope* enclosing = nullptr;
  int blocks_built = 0;  // for errors: "block 3 built in it"
};
thread_local StartScope* innermost_sharded_start = nullptr;
}  // namespace

struct ShardedStart::Scope {
  StartScope scope;
};

ShardedStart::ShardedStart() = default;

ShardedStart::ShardedStart(Communicator& communicator)
    : scope_(std::make_unique<Scope>(Scope{{&communicator, innermost_sharded_start, 0}})) {
  innermost_sharded_start = &scope_->scope;
}

ShardedStart::ShardedStart(ShardedStart&& other) noexcept = default;

ShardedStart::~ShardedStart() {
  if (!scope_) return;
  // Unlinked wherever it sits in this thread's chain: scopes may end out of order (members,
  // std::optional), and none may be left pointing at this one.
  StartScope* self = &scope_->scope;
  if (innermost_sharded_start == self) {
    innermost_sharded_start = self->enclosing;
    return;
  }
  for (StartScope* s = innermost_sharded_start; s != nullptr; s = s->enclosing) {
    if (s->enclosing == self) {
      s->enclosing = self->enclosing;
      return;
    }
  }
}

struct ShardedImpl::State {
  std::shared_ptr<torch::nn::Module> block;
  std::function<torch::Tensor(torch::Tensor)> run_block;
  Communicator* communicator = nullptr;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<int64_t> numel, chunk, offset;
  int64_t share_numel = 0;  // S
  std::vector<torch::Tensor> shares;
  std::vector<size_t> trainable;                  // indices of the parameters that require grad
  std::vector<const c10::StorageImpl*> storages;  // each parameter's, which gather refills
  // Where the parameters point while freed, on the CPU: a read there is named (see the header).
  std::unique_ptr<detail::FreedParameters> freed;
  bool unsharded = false;  // unshard() ended the sharding for good

  mutable std::mutex mutex;
  int gather_depth = 0;                // gathers not yet released
  bool gathered_for_backward = false;  // a backward pass holds one gather
  bool prefetch_enabled = true;        // set_prefetch
  // A gather started ahead of use (prefetch_locked): the parameters hold their memory and these
  // all-gathers fill it; the next gather waits for them instead of starting its own.
  std::vector<PendingCollective> gathering;
  bool prefetched = false;
  // While a profiler trace is recorded: when the gathers in flight started and their bytes, and
  // when the reduce-scatter in flight started (-1: not traced).
  int64_t gather_traced_from_us = -1, gather_bytes = 0, scatter_traced_from_us = -1;
  bool sync = true;
  bool allow_unused = false;  // set_allow_unused_parameters
  bool in_pass = false;       // a backward pass has started on this block and not ended
  std::vector<bool> ready;
  size_t ready_count = 0;
  bool scattering = false;
  torch::Tensor scatter_in, scatter_out;
  PendingCollective pending;
  ShardedStats stats;
  // Grad accumulators keep the post-hooks firing only while these references live.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::weak_ptr<State> self;

  int rank() const { return communicator->rank(); }
  int world() const { return communicator->world_size(); }

  void check_shardable(const std::vector<torch::Tensor>& candidates) const {
    std::unordered_set<const c10::StorageImpl*> storages;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const torch::Tensor& p = candidates[i];
      const bool own_storage = p.is_contiguous() && p.storage_offset() == 0 &&
                               p.storage().nbytes() == static_cast<size_t>(p.numel()) * 4;
      if (p.scalar_type() != torch::kFloat || p.is_sparse() || !own_storage ||
          !storages.insert(p.storage().unsafeGetStorageImpl()).second) {
        throw Error(detail::str(
            "Sharded::shard: parameter '", names[i], "' (shape ", p.sizes(), ", ", p.toString(),
            ") is not a dense fp32 tensor with storage of its own, which a sharded block frees "
            "and gathers again. Likely cause: the model was cast to another dtype, or two "
            "parameters share memory (tied weights). Fix: keep fp32 parameters (bf16 autocast "
            "does), and keep tied weights outside sharded blocks."));
      }
    }
  }

  // The parameters shard() laid out must still be the block's, fp32, where they were, and with
  // the storage this block manages: a module changed after shard (moved, cast, a parameter
  // replaced or added) would gather into tensors the block no longer runs on, or not at all.
  // Runs at every gather (twice per step): parameters(), not named_parameters(), so that no name
  // is built unless something changed.
  void check_unchanged() const {
    const auto now = block->parameters();
    std::string change;
    if (now.size() != params.size()) {
      change = detail::str("it has ", now.size(), " parameters, ", params.size(), " when sharded");
    }
    for (size_t i = 0; change.empty() && i < params.size(); ++i) {
      const torch::Tensor& p = now[i];
      if (!p.is_same(params[i])) {
        change = detail::str("parameter '", block->named_parameters()[i].key(),
                             "' is another tensor than the one sharded");
      } else if (p.scalar_type() != torch::kFloat || p.device() != shares[i].device()) {
        change = detail::str("parameter '", names[i], "' is now ", p.toString(), " on ", p.device(),
                             ", sharded as fp32 on ", shares[i].device());
      } else if (p.storage().unsafeGetStorageImpl() != storages[i]) {
        change = detail::str("parameter '", names[i], "' was given other memory (set_data, to())");
      }
    }
    if (change.empty()) return;
    throw Error(detail::str(
        "Sharded block: the module changed after it was sharded: ", change,
        ". The block's values live in its shares, laid out for the parameters it had then. Fix: "
        "build, move and cast the model before shard (before Accelerator::prepare), and change "
        "its parameters only through the optimizer."));
  }

  // A sharded start: every process built this block from its own random generator, and each
  // keeps its own piece of it, so nothing else would notice processes seeded differently.
  void check_same_values_everywhere(Communicator& comm, int built) const {
    std::vector<torch::Tensor> whole;
    std::vector<std::string> param_names;
    for (const auto& item : block->named_parameters()) {
      param_names.push_back(item.key());
      whole.push_back(item.value());
    }
    const auto everyone = comm.gather_bytes(value_fingerprints(whole));
    for (size_t r = 1; r < everyone.size(); ++r) {
      if (everyone[r].size() != everyone[0].size()) {
        throw Error(detail::str(rank_prefix(comm.rank(), comm.world_size()),
                                "sharded start: block ", built, " built in this ShardedStart has ",
                                everyone[r].size() / 16, " parameters on rank ", r, " and ",
                                everyone[0].size() / 16,
                                " on rank 0. Fix: build the same model on every process."));
      }
    }
    std::vector<int> differing;
    for (size_t r = 1; r < everyone.size(); ++r) {
      if (everyone[r] != everyone[0]) differing.push_back(static_cast<int>(r));
    }
    if (differing.empty()) return;
    const std::string& theirs = everyone[differing.front()];
    size_t first = 0;
    const size_t n = param_names.size();
    while (first + 1 < n && theirs.compare(first * 8, 8, everyone[0], first * 8, 8) == 0 &&
           theirs.compare((n + first) * 8, 8, everyone[0], (n + first) * 8, 8) == 0) {
      ++first;
    }
    throw Error(detail::str(
        rank_prefix(comm.rank(), comm.world_size()), "sharded start: block ", built,
        " built in this ShardedStart has other values on ",
        differing.size() == 1 ? "rank " : "ranks ", detail::join(differing, ", "),
        " than on rank 0 (first: parameter '", n == 0 ? "" : param_names[first],
        "'), and each process keeps only its own piece of it. Likely cause: the processes "
        "seeded their random generators differently, or not at all, before building the model. "
        "Fix: call torch::manual_seed(seed) with the same seed on every process before building "
        "it (or build it whole and let prepare broadcast rank 0's values)."));
  }

  void lay_out() {
    const int n = world();
    for (const auto& p : params) {
      const int64_t per = (p.numel() + n - 1) / n;
      const int64_t c = std::max<int64_t>(
          kShareAlignment, (per + kShareAlignment - 1) / kShareAlignment * kShareAlignment);
      numel.push_back(p.numel());
      chunk.push_back(c);
      offset.push_back(share_numel);
      share_numel += c;
      stats.parameter_elements += p.numel();
    }
    stats.share_elements = share_numel;
  }

  // Share r of each parameter, as a leaf of its own.
  void cut_shares() {
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor share = torch::zeros({chunk[i]}, params[i].options());
      share.set_requires_grad(params[i].requires_grad());
      shares.push_back(share);
      if (params[i].requires_grad()) trainable.push_back(i);
    }
    ready.assign(params.size(), false);
    copy_parameters_into_shares();
  }

  // This process's piece of each (whole) parameter into its share, in place: the shares stay
  // the tensors the optimizer holds.
  void copy_parameters_into_shares() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor flat = params[i].detach().reshape({-1});
      const int64_t begin = std::min(numel[i], rank() * chunk[i]);
      const int64_t length = std::min(chunk[i], numel[i] - begin);
      shares[i].detach().narrow(0, 0, length).copy_(flat.narrow(0, begin, length));
    }
  }

  // Starts the all-gather of every parameter into its own storage (see the file comment), one
  // collective per parameter, without waiting.
  void start_gather_locked() {
    check_unchanged();  // on every process alike (the same model), before any collective
    torch::NoGradGuard no_grad;
    detail::ScopedCollectiveLabel label("ZeRO-3 parameter all-gather");
    // Each parameter's storage, padded to its N pieces, is the all-gather's output: process r's
    // piece is elements [r * chunk, (r + 1) * chunk) of the parameter, so the gathered pieces
    // lie in the parameter's own order and no second buffer or copy is needed (one collective
    // per parameter instead of one per block: a block's worth of memory less while it runs).
    gather_traced_from_us = detail::tracing() ? detail::trace_now_us() : -1;
    gather_bytes = 0;
    try {
      for (size_t i = 0; i < params.size(); ++i) {
        const int64_t padded = world() * chunk[i];
        gather_bytes += padded * 4;
        resize_storage(params[i], static_cast<size_t>(padded) * 4);
        const torch::Tensor whole = storage_alias(params[i], padded);
        const torch::Tensor mine = whole.narrow(0, rank() * chunk[i], chunk[i]);
        mine.copy_(shares[i].detach());
        gathering.push_back(communicator->all_gather_async_(mine, whole));
      }
    } catch (...) {
      // The gathers started write into the parameters' memory: finished before it goes.
      for (auto& pending : gathering) {
        try {
          pending.wait();
        } catch (...) {
        }
      }
      gathering.clear();
      for (size_t i = 0; i < params.size(); ++i) free_parameter(i);
      throw;
    }
  }

  // Waits for the gathers in flight; the time it blocks is the gather's cost the step sees.
  void finish_gather_locked() {
    const auto start = std::chrono::steady_clock::now();
    {
      // In the step-time breakdown a wait on the other ranks, as the gradients' all-reduce is.
      detail::PhaseTimer waiting(detail::StepPhase::all_reduce, "ZeRO-3 all-gather wait");
      for (auto& pending : gathering) pending.wait();
    }
    gathering.clear();
    // On a lane of its own: a gather overlaps other blocks' compute (a prefetch).
    if (gather_traced_from_us >= 0) {
      detail::add_trace_span_on_lane("ZeRO-3 all-gathers", "ZeRO-3 all-gather", "comm",
                                     gather_traced_from_us,
                                     detail::trace_now_us() - gather_traced_from_us,
                                     {{"bytes", gather_bytes}, {"prefetched", prefetched ? 1 : 0}});
      gather_traced_from_us = -1;
    }
    prefetched = false;
    stats.gather_wait += std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start);
  }

  // The prefetch schedule shared by every block of the process (defined below the struct).
  struct Schedule;
  static Schedule& schedule();
  static void record_forward(const std::shared_ptr<State>& state);
  static void prefetch_from(const std::shared_ptr<State>& state, int step);
  static void finish_backward_pass();
  static void before_use(const std::shared_ptr<State>& state);
  static void drop_prefetches();

  void gather_locked();  // below Schedule, which it reads

  // Starts this block's gather ahead of its use, while another block computes: its next gather
  // only waits for what is left. False when there is nothing to do: not sharded, prefetch off,
  // whole already or on its way.
  bool prefetch_locked() {
    // in_pass: its backward has run in this pass already (an activation checkpoint's
    // recomputation runs forward again inside backward): nothing will use a prefetch.
    if (communicator == nullptr || !prefetch_enabled || gather_depth > 0 || prefetched || in_pass) {
      return false;
    }
    start_gather_locked();
    prefetched = true;
    ++stats.prefetches;
    return true;
  }

  // A prefetch that was not used: waited for, and the memory freed.
  void drop_prefetch_locked() {
    if (!prefetched) return;
    finish_gather_locked();
    if (gather_depth == 0) {
      for (size_t i = 0; i < params.size(); ++i) free_parameter(i);
    }
  }

  ~State() {
    for (auto& pending : gathering) {
      try {
        pending.wait();  // the collective writes into the parameters' storage
      } catch (...) {
      }
    }
    // Tensors held elsewhere may outlive the block: they must not point into the reserved range
    // once it is unmapped (another mapping could take those addresses and be read silently).
    if (freed) {
      for (const auto& p : params) {
        if (p.storage().nbytes() == 0) resize_storage(p, 0);
      }
    }
  }

  void release_locked() {
    if (gather_depth == 0) {
      throw Error(
          "Sharded::release without a matching gather(). Fix: pair each gather() with one "
          "release(), or use GatheredParameters.");
    }
    if (--gather_depth > 0) return;
    for (size_t i = 0; i < params.size(); ++i) free_parameter(i);
  }

  // Parameter i's memory goes; on the CPU it then points at address space that faults with its
  // name (freed_parameters.h), elsewhere at nothing.
  void free_parameter(size_t i) {
    const torch::Tensor& p = params[i];
    if (!freed) {
      resize_storage(p, 0);
      return;
    }
    c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(freed->address(i), p.device()));  // not owned
    storage->set_nbytes(0);
  }

  void reserve_freed_ranges(const Communicator& comm) {
    if (params.front().device().type() != torch::kCPU) return;
    std::vector<size_t> bytes;
    for (const auto& p : params) bytes.push_back(static_cast<size_t>(p.numel()) * 4);
    freed = std::make_unique<detail::FreedParameters>(
        names, bytes, detail::str("rank ", comm.rank(), " of ", comm.world_size()));
  }

  // The whole gradients, averaged over the processes: each process's pieces into its row of
  // N * S elements (zeros in the padding); the reduce-scatter then sums each row on its process.
  void start_reduce_scatter() {
    collect_previous_scatter();  // before this block's buffers exist
    torch::NoGradGuard no_grad;
    scatter_in = torch::zeros({world() * share_numel}, shares.front().options());
    const torch::Tensor rows = scatter_in.view({world(), share_numel});
    for (size_t i : trainable) {
      torch::Tensor& grad = params[i].mutable_grad();
      if (!grad.defined()) continue;  // unused in this pass (zeros)
      const torch::Tensor flat = grad.reshape({-1});
      const torch::Tensor pieces = rows.narrow(1, offset[i], chunk[i]);
      for_each_row_run(numel[i], chunk[i], [&](int64_t row, int64_t count, int64_t rest) {
        if (rest == 0) {
          pieces.narrow(0, row, count)
              .copy_(flat.narrow(0, row * chunk[i], count * chunk[i]).view({count, chunk[i]}));
        } else {
          pieces[row].narrow(0, 0, rest).copy_(flat.narrow(0, row * chunk[i], rest));
        }
      });
      grad = torch::Tensor();  // only the share stays
    }
    scatter_in.div_(world());  // the average is the sum of (gradient / N)
    scatter_out = torch::empty({share_numel}, scatter_in.options());
    detail::ScopedCollectiveLabel label("ZeRO-3 gradient reduce-scatter");
    scatter_traced_from_us = detail::tracing() ? detail::trace_now_us() : -1;
    pending = communicator->reduce_scatter_async_(scatter_in, scatter_out);
    scattering = true;
  }

  // One block's reduce-scatter in flight at a time: starting one first collects the one started
  // before it (by another block), which has had this block's backward to run in. Without this,
  // every block's flat buffers would stay until the end of backward: the whole model's
  // gradients again. The blocks of one backward run on one thread (autograd's), so taking the
  // previous block's lock while holding this one's cannot meet the opposite order.
  void collect_previous_scatter() {
    static std::mutex in_flight_mutex;
    static std::weak_ptr<State> in_flight;
    std::shared_ptr<State> previous;
    {
      std::lock_guard<std::mutex> lock(in_flight_mutex);
      previous = in_flight.lock();
      in_flight = self;
    }
    if (!previous || previous.get() == this) return;
    std::lock_guard<std::mutex> lock(previous->mutex);
    previous->collect_scatter_locked();
  }

  // Waits for this block's reduce-scatter, adds each share of the averaged gradients into the
  // share's .grad (as autograd accumulates), and frees the buffers.
  void collect_scatter_locked() {
    if (!scattering) return;
    scattering = false;
    pending.wait();
    if (scatter_traced_from_us >= 0) {
      detail::add_trace_span_on_lane("ZeRO-3 reduce-scatters", "ZeRO-3 gradient reduce-scatter",
                                     "comm", scatter_traced_from_us,
                                     detail::trace_now_us() - scatter_traced_from_us,
                                     {{"bytes", static_cast<int64_t>(scatter_in.numel()) * 4}});
      scatter_traced_from_us = -1;
    }
    torch::NoGradGuard no_grad;
    for (size_t i : trainable) {
      const torch::Tensor piece = scatter_out.narrow(0, offset[i], chunk[i]);
      torch::Tensor& grad = shares[i].mutable_grad();
      if (grad.defined()) {
        grad.add_(piece);
      } else {
        grad = piece.clone();
      }
    }
    scatter_in = scatter_out = torch::Tensor();
    ++stats.reduce_scatters;
  }

  // Every trainable parameter has its gradient for this pass: reduce-scatter them (when
  // synchronising) and free the parameters, which backward no longer reads.
  void block_backward_done() {
    // Backward no longer reads the parameters: their memory goes before the reduce-scatter's
    // buffer is made, so that the two are not held at once.
    if (gathered_for_backward) {
      gathered_for_backward = false;
      release_locked();
    }
    if (sync) start_reduce_scatter();
  }

  // True when it gathered (the first time in this pass).
  bool before_backward() {
    std::lock_guard<std::mutex> lock(mutex);
    if (gathered_for_backward) return false;
    gather_locked();  // a failed gather leaves nothing to release and no pass begun
    gathered_for_backward = true;
    std::weak_ptr<State> weak = self;
    detail::queue_end_of_backward([weak] {
      if (auto state = weak.lock()) {
        finish_backward_pass();  // first, so that an error below leaves no prefetch behind
        state->end_of_backward();
      }
    });
    return true;
  }

  void on_gradient(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (communicator == nullptr) return;  // unsharded: the block's gradients stay whole
    if (!in_pass) {
      in_pass = true;
      std::fill(ready.begin(), ready.end(), false);
      ready_count = 0;
    }
    if (ready[i]) return;
    ready[i] = true;
    if (++ready_count == trainable.size()) block_backward_done();
  }

  void end_of_backward() {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<std::string> missing;
    if (in_pass && ready_count < trainable.size()) {
      for (size_t i : trainable) {
        if (!ready[i]) missing.push_back(names[i]);
      }
      block_backward_done();  // the missing ones count as zeros, so the ranks stay in step
    }
    in_pass = false;
    if (gathered_for_backward) {  // backward reached the block but none of its parameters
      gathered_for_backward = false;
      release_locked();
    }
    collect_scatter_locked();
    if (!missing.empty() && !allow_unused) {
      throw Error(detail::str(
          rank_prefix(rank(), world()), missing.size(), " of ", trainable.size(),
          " trainable parameters of a sharded block got no gradient in this backward pass: ",
          detail::join(missing, ", "),
          ". They were reduced as zeros. Likely cause: the block's forward did not use them. "
          "Fix: freeze them before sharding (requires_grad false), make forward use them, or "
          "allow it (AcceleratorOptions::allow_unused_parameters, "
          "Sharded::set_allow_unused_parameters) when every process skips them alike."));
    }
  }

  // A post-hook on each trainable parameter's gradient accumulator says when its gradient for
  // this pass is complete; it holds the state weakly.
  void hook_gradient_accumulators() {
    for (size_t i : trainable) {
      std::weak_ptr<State> weak = self;
      accumulators.push_back(detail::on_gradient_ready(
          params[i], "Sharded::shard: parameter '" + names[i] + "'", [weak, i] {
            if (auto state = weak.lock()) state->on_gradient(i);
          }));
    }
  }
};

// Which block's gather to start ahead (as FSDP prefetches): the order in which the blocks ran
// forward in the last step that ended with a backward pass. In forward, a block that starts
// prefetches the block after it; in backward, the block before it. Every process runs the blocks
// in the same order (each gather is a collective already), so every process starts the same
// prefetches in the same order. Process-wide, as the blocks of one step share the collectives.
//
// A prefetched gather holds the shares' values of the moment it started, so it may only be used
// before they change: by the block it was started for, as the next block to be used. Any other
// use first drops it (waits for it and frees the memory), and so does the end of a backward pass
// (the optimizer step comes after it): a prefetch an evaluation left behind, or a forward that
// ended early, is never used after a step.
struct ShardedImpl::State::Schedule {
  std::mutex mutex;
  std::vector<std::weak_ptr<State>> recording;  // this step's forward order so far
  std::vector<std::weak_ptr<State>> order;      // the last step's
  // Each block's place in them, so that the forward step does not search (checked against the
  // weak pointer there: an address can be a later block's).
  std::unordered_map<const State*, size_t> recording_place, order_place;
  std::vector<std::weak_ptr<State>> prefetched;  // started ahead, not used yet
  std::weak_ptr<State> expected;                 // the block the prefetch was started for
};

ShardedImpl::State::Schedule& ShardedImpl::State::schedule() {
  static Schedule s;
  return s;
}

void ShardedImpl::State::gather_locked() {
  if (gather_depth > 0) {
    ++gather_depth;
    return;
  }
  if (!prefetched) start_gather_locked();
  finish_gather_locked();
  gather_depth = 1;
  ++stats.gathers;
}

void ShardedImpl::State::record_forward(const std::shared_ptr<State>& state) {
  Schedule& s = schedule();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto found = s.recording_place.find(state.get());
  if (found != s.recording_place.end() && s.recording[found->second].lock() == state) {
    return;  // the first run counts (evaluation repeats them)
  }
  s.recording_place[state.get()] = s.recording.size();
  s.recording.push_back(state);
}

// Prefetches the block `step` places from `state` in the last step's order (+1 in forward, -1 in
// backward), if there is one.
void ShardedImpl::State::prefetch_from(const std::shared_ptr<State>& state, int step) {
  Schedule& s = schedule();
  std::shared_ptr<State> next;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto found = s.order_place.find(state.get());
    if (found != s.order_place.end() && s.order[found->second].lock() == state) {
      const auto j = static_cast<std::ptrdiff_t>(found->second) + step;
      if (j >= 0 && j < static_cast<std::ptrdiff_t>(s.order.size())) next = s.order[j].lock();
    }
  }
  if (!next || next == state) return;
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(next->mutex);
    started = next->prefetch_locked();
  }
  if (started) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.prefetched.push_back(next);
    s.expected = next;
  }
}

void ShardedImpl::State::drop_prefetches() {
  Schedule& s = schedule();
  std::vector<std::shared_ptr<State>> unused;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const auto& weak : s.prefetched) {
      if (auto block = weak.lock()) unused.push_back(block);
    }
    s.prefetched.clear();
    s.expected.reset();
  }
  for (const auto& block : unused) {
    std::lock_guard<std::mutex> lock(block->mutex);
    block->drop_prefetch_locked();
  }
}

// Before `state` gathers: a prefetch started for another block is dropped (see Schedule).
void ShardedImpl::State::before_use(const std::shared_ptr<State>& state) {
  Schedule& s = schedule();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.prefetched.empty()) return;
    if (s.expected.lock() == state) {
      s.prefetched.clear();  // it is used now
      s.expected.reset();
      return;
    }
  }
  drop_prefetches();
}

// At the end of a backward pass (the first block's end-of-backward callback): this step's
// forward order becomes the one to prefetch by, and prefetches nobody used are waited for and
// freed, so that no gather started before the optimizer step outlives it.
void ShardedImpl::State::finish_backward_pass() {
  Schedule& s = schedule();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.recording.empty()) {
      s.order = std::move(s.recording);
      s.order_place = std::move(s.recording_place);
      s.recording.clear();
      s.recording_place.clear();
    }
  }
  drop_prefetches();
}

ShardedImpl::ShardedImpl(std::shared_ptr<torch::nn::Module> block,
                         std::function<torch::Tensor(torch::Tensor)> forward)
    : state_(std::make_shared<State>()) {
  state_->block = std::move(block);
  state_->run_block = std::move(forward);
  state_->self = state_;
  // The block's own children, parameters and buffers, under their own names: a model reads the
  // same names (state dicts, safetensors, checkpoints) whether or not its blocks are wrapped, as
  // FSDP keeps a module's names. The tensors are the block's, so the block runs on them.
  Module& inner = *state_->block;
  for (const auto& child : inner.named_children()) register_module(child.key(), child.value());
  for (const auto& p : inner.named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner.named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  // A sharded start cuts the block now, while this is the only whole block.
  StartScope* start = innermost_sharded_start;
  if (start != nullptr && start->communicator->world_size() > 1) {
    // What shard() would refuse, refused before the values are read: an inner block built in
    // this scope holds no values, a parameter of another dtype cannot be fingerprinted alike.
    for (const auto& nested : sharded_blocks(*state_->block)) {
      if (nested->sharded()) {
        throw Error(
            "sharded start: a Sharded block holds another Sharded block; each parameter can be "
            "sharded once. Fix: wrap the inner blocks only (as FSDP wraps each transformer "
            "layer), or the outer one only.");
      }
    }
    std::vector<torch::Tensor> params;
    state_->names.clear();
    for (const auto& item : state_->block->named_parameters()) {
      state_->names.push_back(item.key());
      params.push_back(item.value());
    }
    state_->check_shardable(params);
    state_->check_same_values_everywhere(*start->communicator, ++start->blocks_built);
    shard(*start->communicator);
  }
}

namespace {

torch::nn::AnyModule non_empty(torch::nn::AnyModule block) {
  if (block.is_empty()) {
    throw Error("Sharded got an empty module. Fix: pass the block to wrap, e.g. Sharded(Block()).");
  }
  return block;
}

torch::nn::Sequential non_empty(torch::nn::Sequential block) {
  if (block.is_empty()) {
    throw Error(
        "Sharded got an empty Sequential holder. Fix: pass the block to wrap, e.g. "
        "Sharded(torch::nn::Sequential(...)).");
  }
  return block;
}

}  // namespace

ShardedImpl::ShardedImpl(torch::nn::AnyModule block)
    : ShardedImpl(non_empty(block).ptr(),
                  [block](torch::Tensor x) mutable { return block.forward(std::move(x)); }) {}

ShardedImpl::ShardedImpl(torch::nn::Sequential block)
    : ShardedImpl(non_empty(block).ptr(),
                  [block](torch::Tensor x) mutable { return block->forward(std::move(x)); }) {}

ShardedImpl::~ShardedImpl() = default;

torch::Tensor ShardedImpl::forward(torch::Tensor input) {
  if (!sharded()) return state_->run_block(std::move(input));
  State::record_forward(state_);
  gather();  // uses a prefetch started for this block, or drops one started for another
  torch::Tensor output;
  try {
    State::prefetch_from(state_, +1);
    output = state_->run_block(std::move(input));
  } catch (...) {
    release();
    throw;
  }
  release();
  if (torch::GradMode::is_enabled() && output.requires_grad()) {
    std::weak_ptr<State> weak = state_;
    output.register_hook([weak](const torch::Tensor&) {
      auto state = weak.lock();
      if (!state) return;
      State::before_use(state);
      if (state->before_backward()) State::prefetch_from(state, -1);
    });
  }
  return output;
}

void ShardedImpl::shard(Communicator& communicator) {
  State& s = *state_;
  if (sharded()) {
    throw Error(
        "Sharded::shard: this block is sharded already. Fix: shard each block once "
        "(shard_model shards every block of a model).");
  }
  if (s.unsharded) {
    throw Error(
        "Sharded::shard: this block was unsharded (Accelerator::end_training does it), and its "
        "hooks and layout are spent. Fix: build a new model to shard it again.");
  }
  if (communicator.world_size() == 1) return;  // one process keeps everything
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : s.block->named_parameters()) {
    names.push_back(item.key());
    params.push_back(item.value());
  }
  if (params.empty()) return;  // nothing to shard
  s.names = std::move(names);
  s.check_shardable(params);
  s.params = std::move(params);
  s.reserve_freed_ranges(communicator);  // the one step that can fail: before anything changes
  s.communicator = &communicator;
  for (const auto& p : s.params) s.storages.push_back(p.storage().unsafeGetStorageImpl());
  s.lay_out();
  s.cut_shares();
  s.hook_gradient_accumulators();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i].mutable_grad() = torch::Tensor();
    s.free_parameter(i);
  }
}

bool ShardedImpl::sharded() const { return state_->communicator != nullptr; }

const std::vector<torch::Tensor>& ShardedImpl::shares() const { return state_->shares; }

void ShardedImpl::set_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->sync = enabled;
}

void ShardedImpl::set_allow_unused_parameters(bool allowed) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->allow_unused = allowed;
}

void ShardedImpl::set_prefetch(bool enabled) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->prefetch_enabled = enabled;
}

ShardedStats ShardedImpl::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

bool ShardedImpl::gathered() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !sharded() || state_->gather_depth > 0;
}

const std::shared_ptr<torch::nn::Module>& ShardedImpl::block() const { return state_->block; }

void ShardedImpl::gather() {
  if (!sharded()) return;
  State::before_use(state_);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->gather_locked();
}

void ShardedImpl::unshard() {
  if (!sharded()) return;
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  s.collect_scatter_locked();
  s.drop_prefetch_locked();
  if (s.gather_depth == 0) s.gather_locked();
  s.gather_depth = 0;
  s.gathered_for_backward = s.in_pass = false;
  s.communicator = nullptr;  // sharded() is false from here: forward runs the block as it is
  s.unsharded = true;
  s.shares.clear();
  s.stats.share_elements = 0;
}

void ShardedImpl::store_gathered() {
  if (!sharded()) return;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->gather_depth == 0) {
    throw Error(
        "Sharded::store_gathered: the block's parameters are not gathered, so there are no "
        "whole values to keep. Fix: call it inside GatheredParameters (or between gather() and "
        "release()), after writing the parameters.");
  }
  state_->copy_parameters_into_shares();
}

void ShardedImpl::release() {
  if (!sharded()) return;
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->release_locked();
}

void drop_prefetched_gathers() { ShardedImpl::State::drop_prefetches(); }

torch::nn::Sequential wrap_blocks(const torch::nn::Sequential& model, const BlockRule& rule) {
  torch::nn::Sequential wrapped;
  const auto names = model->named_children();
  size_t i = 0;
  for (const auto& entry : *model) {
    const std::string& name = names[i++].key();
    const auto module = entry.ptr();
    if (!rule(name, *module)) {
      wrapped->push_back(std::string(name), entry);
      continue;
    }
    if (!sharded_blocks(*module).empty()) {
      throw Error(detail::str(
          "wrap_blocks: entry '", name,
          "' is a Sharded block already or holds one; each "
          "parameter can be sharded once. Fix: make the rule skip it, or wrap the model once."));
    }
    wrapped->push_back(std::string(name), Sharded(entry));
  }
  return wrapped;
}

BlockRule blocks_with_at_least(int64_t parameters) {
  return [parameters](const std::string&, const torch::nn::Module& module) {
    int64_t n = 0;
    for (const auto& p : module.parameters()) n += p.numel();
    return n >= parameters && n > 0;
  };
}

std::vector<std::shared_ptr<ShardedImpl>> sharded_blocks(const torch::nn::Module& model) {
  std::vector<std::shared_ptr<ShardedImpl>> blocks;
  for (const auto& module : model.modules(/*include_self=*/true)) {
    if (auto block = std::dynamic_pointer_cast<ShardedImpl>(module)) blocks.push_back(block);
  }
  return blocks;
}

std::vector<std::shared_ptr<ShardedImpl>> shard_model(torch::nn::Module& model,
                                                      Communicator& communicator) {
  auto blocks = sharded_blocks(model);
  for (const auto& block : blocks) {
    if (!sharded_blocks(*block->block()).empty()) {
      throw Error(
          "shard_model: a Sharded block holds another Sharded block; each parameter can be "
          "sharded once. Fix: wrap the inner blocks only (as FSDP wraps each transformer "
          "layer), or the outer one only.");
    }
  }
  for (const auto& block : blocks) {
    if (!block->sharded()) block->shard(communicator);
  }
  return blocks;
}

namespace {

// Parameter identity -> (its sharded block, its index there), for the sharded blocks of `model`.
std::unordered_map<const c10::TensorImpl*, std::pair<ShardedImpl*, size_t>> sharded_index(
    torch::nn::Module& model) {
  std::unordered_map<const c10::TensorImpl*, std::pair<ShardedImpl*, size_t>> index;
  for (const auto& block : sharded_blocks(model)) {
    if (!block->sharded()) continue;
    const auto params = block->block()->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      index[params[i].unsafeGetTensorImpl()] = {block.get(), i};
  }
  return index;
}

}  // namespace

std::vector<torch::Tensor> parameters_to_update(torch::nn::Module& model) {
  const auto index = sharded_index(model);
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    if (!p.requires_grad()) continue;
    auto found = index.find(p.unsafeGetTensorImpl());
    out.push_back(found == index.end() ? p : found->second.first->shares()[found->second.second]);
  }
  return out;
}

void optimize_shares(torch::optim::Optimizer& optimizer, torch::nn::Module& model) {
  const auto index = sharded_index(model);
  if (index.empty()) return;
  if (!optimizer.state().empty()) {
    throw Error(detail::str(
        "optimize_shares: the optimizer holds state for ", optimizer.state().size(),
        " parameters already, kept per parameter, and the shares that replace them are new "
        "tensors. Fix: shard (or prepare) before the first step, or load the state after."));
  }
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto found = index.find(p.unsafeGetTensorImpl());
      if (found != index.end()) p = found->second.first->shares()[found->second.second];
    }
  }
}

torch::OrderedDict<std::string, torch::Tensor> replicated_parameters(torch::nn::Module& model) {
  const auto index = sharded_index(model);
  torch::OrderedDict<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    if (!index.count(item.value().unsafeGetTensorImpl())) out.insert(item.key(), item.value());
  }
  return out;
}

struct GatheredParameters::Blocks {
  std::vector<std::shared_ptr<ShardedImpl>> gathered;
};

GatheredParameters::GatheredParameters(const torch::nn::Module& model)
    : blocks_(std::make_unique<Blocks>(Blocks{sharded_blocks(model)})) {
  auto& gathered = blocks_->gathered;
  for (size_t b = 0; b < gathered.size(); ++b) {
    try {
      gathered[b]->gather();
    } catch (...) {
      while (b-- > 0) gathered[b]->release();  // the destructor will not run
      throw;
    }
  }
}

void GatheredParameters::store() {
  for (const auto& block : blocks_->gathered) block->store_gathered();
}

GatheredParameters::~GatheredParameters() {
  for (const auto& block : blocks_->gathered) block->release();
}

}  // namespace accelerant
