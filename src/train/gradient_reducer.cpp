#include "accelerant/gradient_reducer.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "accelerant/error.h"
#include "accelerant/gradient_buckets.h"
#include "base/step_timing.h"
#include "base/tensor_alias.h"
#include "base/text.h"
#include "base/trace_events.h"
#include "comm/collective_label.h"
#include "train/end_of_backward.h"
#include "train/gradient_ready_hook.h"

namespace accelerant {

namespace {

// Gloo cannot reduce bf16, so bf16 gradients travel in an fp32 bucket (also the more exact sum).
torch::ScalarType wire_dtype(const GradientBucket& bucket) {
  return bucket.dtype == torch::kBFloat16 && bucket.device.is_cpu() ? torch::kFloat : bucket.dtype;
}

void check_zero_stage(int stage) {
  if (stage < 0 || stage > 2) {
    throw Error(detail::str("GradientReducerOptions::zero_stage is ", stage,
                            "; ZeRO has stages 0 (off), 1 (optimizer state) and 2 (also ",
                            "gradients). Fix: pick one of those."));
  }
}

}  // namespace

struct GradientReducer::State {
  Communicator* communicator = nullptr;
  GradientReducerOptions options;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<GradientBucket> plan;
  std::vector<torch::Tensor> flat;                // one buffer per bucket
  std::vector<std::vector<torch::Tensor>> views;  // per bucket, per packed parameter
  std::vector<int> bucket_of;                     // parameter index -> bucket, -1 when frozen
  std::vector<size_t> slot_of;                    // parameter index -> position in its bucket
  // Parameter index -> whether its .grad can live in the bucket itself (same dtype and device as
  // the bucket): then autograd accumulates straight into the bucket and nothing is copied.
  std::vector<bool> bindable;
  // Grad accumulators keep our post-hooks firing only while these references live.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;

  mutable std::mutex mutex;
  bool sync = true;
  std::vector<std::function<void(bool)>> sync_followers;
  bool in_backward = false;      // a backward pass has started reducing and not finished
  std::vector<bool> ready;       // per parameter, this pass
  std::vector<int64_t> waiting;  // per bucket: gradients still to come this pass
  size_t next_bucket = 0;        // buckets start strictly in plan order
  size_t ready_count = 0;
  size_t trainable = 0;
  std::vector<PendingCollective> in_flight;
  // Per bucket: when its all-reduce started on the trace clock, while a trace is recorded; -1 else.
  std::vector<int64_t> launched_us;
  GradientReducerStats stats;

  // ZeRO (options.zero_stage > 0 on several processes): bucket b's buffer is padded to N equal
  // shares of share_numel[b] elements (a multiple of kShareAlignment, so that every share starts
  // on a 64-byte line); this rank owns share `rank` of every bucket.
  static constexpr int64_t kShareAlignment = 16;
  static constexpr size_t kBucketsInFlight = 2;
  bool zero = false;
  std::vector<int64_t> share_numel;
  // Stage 2: per bucket, where its reduce-scatter puts this rank's share: the gradient that stays
  // (the sharded update reads it through its pieces). The buckets themselves exist only from
  // their first gradient of a pass until their reduce-scatter is done.
  std::vector<torch::Tensor> averaged_share;
  // Stage 2: the buffers behind the buckets alive now, and those free for the next ones. Each is
  // as large as the largest bucket, so that any bucket fits any buffer: after the first pass
  // backward takes no new memory for them (kBucketsInFlight + 1 buffers at most, as a rule).
  std::vector<torch::Tensor> bucket_buffer;
  std::vector<torch::Tensor> spare_buffers;
  int64_t largest_bucket = 0;
  size_t next_share = 0;     // stage 2, this pass: the first bucket not yet reduced to its share
  torch::Tensor gather_out;  // gather_parameters' scratch (largest bucket)

  int64_t share_begin(size_t b) const { return communicator->rank() * share_numel[b]; }
  bool scatters_gradients() const { return zero && options.zero_stage() == 2; }

  void start_pass() {
    std::fill(ready.begin(), ready.end(), false);
    for (size_t b = 0; b < plan.size(); ++b)
      waiting[b] = static_cast<int64_t>(plan[b].params.size());
    next_bucket = 0;
    next_share = 0;
    ready_count = 0;
    stats.buckets_started_during_backward = 0;
    stats.gradient_copies = 0;
    in_backward = true;
  }

  // Starts every bucket that is full and whose predecessors have started.
  void start_full_buckets() {
    while (next_bucket < plan.size() && waiting[next_bucket] == 0) {
      const size_t b = next_bucket++;
      flat[b].div_(
          communicator->world_size());  // average = sum of (grad / N): no pass after the wait
      detail::ScopedCollectiveLabel label("backward bucket", static_cast<int64_t>(b));
      launched_us[b] = detail::tracing() ? detail::trace_now_us() : -1;
      in_flight[b] = scatters_gradients()
                         ? communicator->reduce_scatter_async_(flat[b], averaged_share[b])
                         : communicator->all_reduce_async_(flat[b], ReduceOp::kSum);
      if (ready_count < trainable) ++stats.buckets_started_during_backward;
    }
    // Stage 2: buckets whose reduce-scatter is done go back to the allocator while backward goes
    // on; beyond kBucketsInFlight the oldest is waited for, which bounds the whole buckets alive
    // (DeepSpeed bounds its reduction buffers the same way).
    if (scatters_gradients()) {
      while (next_share < next_bucket &&
             (in_flight[next_share].done() || next_bucket - next_share > kBucketsInFlight)) {
        keep_share(next_share++);
      }
    }
  }

  // Stage 2, once bucket b's reduce-scatter is done: its average is in averaged_share[b], and the
  // bucket goes back to the allocator (for the next bucket of this pass to reuse).
  void keep_share(size_t b) {
    in_flight[b].wait();  // returns at once, or throws the collective's failure
    trace_bucket(b);
    views[b].clear();
    flat[b] = torch::Tensor();
    spare_buffers.push_back(std::move(bucket_buffer[b]));
    bucket_buffer[b] = torch::Tensor();
  }

  // Stage 2: bucket b's buffer for this pass, made at its first gradient. Every element is
  // written before the reduce-scatter: the gradients by mark_ready, the padding here.
  void ensure_bucket(size_t b) {
    if (flat[b].defined()) return;
    const GradientBucket& bucket = plan[b];
    // A spare on the bucket's device (a model may span devices), else a new buffer.
    auto spare = std::find_if(spare_buffers.begin(), spare_buffers.end(),
                              [&](const torch::Tensor& t) { return t.device() == bucket.device; });
    if (spare == spare_buffers.end()) {
      bucket_buffer[b] =
          torch::empty({largest_bucket}, torch::TensorOptions(torch::kFloat).device(bucket.device));
    } else {
      bucket_buffer[b] = std::move(*spare);
      spare_buffers.erase(spare);
    }
    flat[b] = bucket_buffer[b].narrow(0, 0, share_numel[b] * communicator->world_size());
    flat[b].narrow(0, bucket.numel, flat[b].numel() - bucket.numel).zero_();
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      views[b].push_back(flat[b].narrow(0, bucket.offsets[k], params[bucket.params[k]].numel()));
    }
  }

  bool in_bucket(size_t i) const {
    const int b = bucket_of[i];
    return flat[b].defined() &&
           detail::aliases(params[i].grad(), flat[b], plan[b].offsets[slot_of[i]]);
  }

  // The gradient of parameter i becomes its bucket slot's alias (autograd then accumulates into
  // the bucket), keeping the value it has.
  void bind_to_bucket(size_t i) {
    const int b = bucket_of[i];
    torch::Tensor& param = params[i];
    torch::Tensor alias = detail::alias_into(flat[b], plan[b].offsets[slot_of[i]], param.sizes());
    if (param.grad().defined()) {
      alias.copy_(param.grad());
    } else {
      alias.zero_();
    }
    param.mutable_grad() = alias;
  }

  void mark_ready(size_t i) {
    const int b = bucket_of[i];
    const torch::Tensor& grad = params[i].grad();
    if (grad.defined() && grad.is_sparse()) {
      throw Error(detail::str("Parameter '", names[i],
                              "' has a sparse gradient, which the gradient ",
                              "reducer cannot bucket. Fix: use dense gradients (e.g. Embedding ",
                              "without sparse=true)."));
    }
    if (scatters_gradients()) {
      // Into the bucket, and the .grad goes: after the reduce-scatter only the share stays.
      ensure_bucket(b);
      torch::NoGradGuard no_grad;
      torch::Tensor& view = views[b][slot_of[i]];
      if (grad.defined()) {
        ++stats.gradient_copies;
        view.copy_(grad.reshape({-1}));
      } else {
        view.zero_();
      }
      params[i].mutable_grad() = torch::Tensor();
      ready[i] = true;
      ++ready_count;
      --waiting[b];
      return;
    }
    torch::Tensor& view = views[b][slot_of[i]];
    if (in_bucket(i)) {
      // Already there: autograd accumulated into the bucket.
    } else if (bindable[i]) {
      ++stats.gradient_copies;  // e.g. zero_grad set it to none, or a new .grad was assigned
      bind_to_bucket(i);
    } else if (grad.defined()) {
      ++stats.gradient_copies;
      view.copy_(grad.reshape({-1}));
    } else {
      view.zero_();
    }
    ready[i] = true;
    ++ready_count;
    --waiting[b];
  }

  void on_gradient(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) return;
    // A parameter seen twice means the previous pass never finished (its backward threw).
    if (!in_backward || ready[i]) {
      start_pass();
      std::weak_ptr<State> weak = self;
      // Not Engine::queue_callback: inside a checkpoint's recomputation that would end the pass
      // when the nested backward ends (train/end_of_backward.h).
      detail::queue_end_of_backward([weak] {
        if (auto state = weak.lock()) state->finish_pass();
      });
    }
    mark_ready(i);
    start_full_buckets();
  }

  // A profiler trace's span of bucket b, from its launch until its wait returned: a bucket that
  // finished earlier ends where the end of backward found it done (the communicator reports no
  // completion time). Each bucket has a lane of its own, since the buckets' spans overlap.
  void trace_bucket(size_t b) {
    if (launched_us[b] < 0 || !detail::tracing()) return;
    const std::string name =
        detail::str(scatters_gradients() ? "reduce-scatter bucket " : "all-reduce bucket ", b);
    const int64_t bytes = flat[b].numel() * static_cast<int64_t>(flat[b].element_size());
    detail::add_trace_span_on_lane(name, name, "comm", launched_us[b],
                                   detail::trace_now_us() - launched_us[b],
                                   {{"bytes", bytes}, {"bucket", static_cast<int64_t>(b)}});
    launched_us[b] = -1;
  }

  // End of backward: reduce what never became ready (or refuse), wait, write back.
  void finish_pass() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!in_backward) return;
    in_backward = false;
    std::vector<std::string> unused;
    for (size_t i = 0; i < params.size(); ++i) {
      if (bucket_of[i] >= 0 && !ready[i]) unused.push_back(names[i]);
    }
    if (!unused.empty() && !options.allow_unused_parameters()) {
      throw Error(detail::str(
          rank_prefix(communicator->rank(), communicator->world_size()), unused.size(), " of ",
          trainable, " trainable parameters got no gradient in this backward pass: ",
          detail::join(unused, ", "),
          ". Their gradients cannot be averaged across processes, and the other ranks would wait "
          "for them. Likely cause: forward() did not use them (a branch not taken, a head not "
          "called). Fix: freeze them before prepare (requires_grad false), make forward use them, "
          "or set AcceleratorOptions::allow_unused_parameters(true) to treat them as zero "
          "gradients."));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bucket_of[i] >= 0 && !ready[i]) mark_ready(i);
    }
    start_full_buckets();
    const auto wait_start = std::chrono::steady_clock::now();
    {
      detail::PhaseTimer waiting(detail::StepPhase::all_reduce, "all-reduce wait");
      if (scatters_gradients()) {
        while (next_share < plan.size()) keep_share(next_share++);  // waits, traces, frees
      } else {
        for (size_t b = 0; b < in_flight.size(); ++b) {
          in_flight[b].wait();
          trace_bucket(b);
        }
      }
    }
    stats.exposed_wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    torch::NoGradGuard no_grad;
    for (size_t b = 0; b < plan.size() && !scatters_gradients(); ++b) {
      for (size_t k = 0; k < plan[b].params.size(); ++k) {
        const size_t i = plan[b].params[k];
        torch::Tensor& param = params[i];
        const torch::Tensor& averaged = views[b][k];
        if (in_bucket(i)) continue;  // averaged in place
        if (param.grad().defined()) {
          param.mutable_grad().copy_(averaged.view(param.grad().sizes()));
        } else {  // unused here (allowed): the other ranks' average
          param.mutable_grad() = averaged.view(param.sizes()).to(param.scalar_type()).clone();
        }
      }
    }
    ++stats.reductions;
  }

  // Construction, step by step (the constructor runs them in this order).

  // The elements bucket b's buffer holds: its own, padded under ZeRO to `world` equal shares
  // (which it records in share_numel).
  int64_t padded_numel(const GradientBucket& bucket, int world) {
    if (!zero) return bucket.numel;
    if (wire_dtype(bucket) != torch::kFloat) {
      throw Error(detail::str(
          "ZeRO shards fp32 gradients; a bucket holds ", c10::toString(bucket.dtype),
          " ones. Likely cause: the model was cast to bf16 (mixed_precision with downcast). ",
          "Fix: keep fp32 parameters (bf16 autocast does), or zero_stage(0)."));
    }
    const int64_t unit = kShareAlignment;
    const int64_t share = (bucket.numel + world * unit - 1) / (world * unit) * unit;
    share_numel.push_back(share);
    return share * world;
  }

  // Bucket b's memory (its flat buffer, or under stage 2 its averaged share) and its
  // parameters' bucket and slot.
  void allocate_bucket(size_t b, int world) {
    const GradientBucket& bucket = plan[b];
    const int64_t padded = padded_numel(bucket, world);
    // Stage 2 makes its buckets during each backward (ensure_bucket) and keeps the shares.
    const bool per_pass = scatters_gradients();
    largest_bucket = std::max(largest_bucket, padded);
    averaged_share.push_back(
        per_pass ? torch::zeros({padded / world},
                                torch::TensorOptions(torch::kFloat).device(bucket.device))
                 : torch::Tensor());
    flat.push_back(
        per_pass ? torch::Tensor()
                 : torch::zeros({padded},
                                torch::TensorOptions(wire_dtype(bucket)).device(bucket.device)));
    views.emplace_back();
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      bucket_of[i] = static_cast<int>(b);
      slot_of[i] = k;
      if (!per_pass) views[b].push_back(flat[b].narrow(0, bucket.offsets[k], params[i].numel()));
      ++trainable;
    }
  }

  void decide_bindable() {
    bindable.assign(params.size(), false);
    for (size_t i = 0; i < params.size(); ++i) {
      const int b = bucket_of[i];
      bindable[i] = b >= 0 && options.gradient_as_bucket_view() && !scatters_gradients() &&
                    flat[b].scalar_type() == params[i].scalar_type();
    }
  }

  // The per-pass bookkeeping, sized for the plan.
  void size_pass_state() {
    ready.assign(params.size(), false);
    waiting.assign(plan.size(), 0);
    in_flight.resize(plan.size());
    bucket_buffer.resize(plan.size());
    launched_us.assign(plan.size(), -1);
    stats.buckets = static_cast<int64_t>(plan.size());
  }

  void bind_gradients_to_buckets() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (bindable[i]) bind_to_bucket(i);
    }
  }

  // A post-hook on each trainable parameter's gradient accumulator tells the reducer when its
  // gradient is ready; it holds the state weakly, so a reducer destroyed mid-backward is safe.
  void hook_gradient_accumulators() {
    for (size_t i = 0; i < params.size(); ++i) {
      if (bucket_of[i] < 0) continue;
      std::weak_ptr<State> weak = self;
      accumulators.push_back(
          detail::on_gradient_ready(params[i], "Parameter '" + names[i] + "'", [weak, i] {
            if (auto state = weak.lock()) state->on_gradient(i);
          }));
    }
  }

  std::weak_ptr<State> self;
};

GradientReducer::GradientReducer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    Communicator& communicator, GradientReducerOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.self = state_;
  s.communicator = &communicator;
  s.options = options;
  for (const auto& item : named_parameters) {
    s.names.push_back(item.key());
    s.params.push_back(item.value());
  }
  s.plan = plan_buckets(s.params, BucketPlanOptions()
                                      .bucket_cap_bytes(options.bucket_cap_bytes())
                                      .first_bucket_cap_bytes(options.first_bucket_cap_bytes()));
  s.bucket_of.assign(s.params.size(), -1);
  s.slot_of.assign(s.params.size(), 0);
  const int world = communicator.world_size();
  check_zero_stage(options.zero_stage());
  s.zero = options.zero_stage() > 0 && world > 1;
  for (size_t b = 0; b < s.plan.size(); ++b) s.allocate_bucket(b, world);
  s.decide_bindable();
  s.size_pass_state();
  if (communicator.world_size() == 1) return;  // nothing to average: no hooks, no cost
  s.bind_gradients_to_buckets();
  s.hook_gradient_accumulators();
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::set_sync(bool enabled) {
  std::vector<std::function<void(bool)>> followers;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->sync = enabled;
    followers = state_->sync_followers;
  }
  for (const auto& follow : followers) follow(enabled);
}

void GradientReducer::add_sync_follower(std::function<void(bool)> follower) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->sync_followers.push_back(std::move(follower));
}

bool GradientReducer::sync() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->sync;
}

GradientReducerStats GradientReducer::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

std::vector<FusedShardPiece> GradientReducer::shard_pieces(
    const std::vector<torch::Tensor>& optimizer_params) const {
  const State& s = *state_;
  if (!s.zero) {
    throw Error(
        "GradientReducer::shard_pieces: ZeRO is off for this reducer (zero_stage 0, or one "
        "process). Fix: set GradientReducerOptions::zero_stage(1 or 2) on several processes.");
  }
  std::unordered_map<const c10::TensorImpl*, int64_t> index_of;
  for (size_t j = 0; j < optimizer_params.size(); ++j)
    index_of[optimizer_params[j].unsafeGetTensorImpl()] = static_cast<int64_t>(j);
  std::vector<bool> seen(optimizer_params.size(), false);
  std::vector<FusedShardPiece> pieces;
  for (size_t b = 0; b < s.plan.size(); ++b) {
    const int64_t lo = s.share_begin(b), hi = lo + s.share_numel[b];
    for (size_t k = 0; k < s.plan[b].params.size(); ++k) {
      const size_t i = s.plan[b].params[k];
      auto found = index_of.find(s.params[i].unsafeGetTensorImpl());
      if (found == index_of.end()) {
        throw Error(detail::str(
            "ZeRO: the model's trainable parameter '", s.names[i], "' is not in the optimizer, ",
            "so no process would update its share. Fix: give the optimizer all of the model's ",
            "trainable parameters (model->parameters()), or freeze this one before prepare."));
      }
      seen[found->second] = true;
      const int64_t first = s.plan[b].offsets[k], last = first + s.params[i].numel();
      const int64_t from = std::max(first, lo), to = std::min(last, hi);
      if (from >= to) continue;
      FusedShardPiece piece{found->second, from - first, to - from, torch::Tensor()};
      // Stage 2: the piece's gradient is where the reduce-scatter leaves it.
      if (s.scatters_gradients()) piece.grad = s.averaged_share[b].narrow(0, from - lo, to - from);
      pieces.push_back(std::move(piece));
    }
  }
  for (size_t j = 0; j < optimizer_params.size(); ++j) {
    if (!seen[j]) {
      throw Error(detail::str(
          "ZeRO: optimizer parameter ", j, " (shape ", optimizer_params[j].sizes(),
          ") is not a trainable parameter of the prepared model, so its gradient is neither "
          "reduced nor sharded. Fix: one optimizer per prepared model, over that model's "
          "parameters."));
    }
  }
  return pieces;
}

void GradientReducer::gather_parameters() {
  State& s = *state_;
  if (!s.zero) return;
  torch::NoGradGuard no_grad;
  detail::ScopedCollectiveLabel label("ZeRO parameter all-gather");
  for (size_t b = 0; b < s.plan.size(); ++b) {
    const GradientBucket& bucket = s.plan[b];
    const int64_t share = s.share_numel[b], lo = s.share_begin(b), hi = lo + share;
    const int64_t padded = share * s.communicator->world_size();
    if (!s.gather_out.defined() || s.gather_out.numel() < padded ||
        s.gather_out.device() != bucket.device) {
      s.gather_out =
          torch::empty({padded}, torch::TensorOptions(torch::kFloat).device(bucket.device));
    }
    // In place: this rank's share is packed straight into its part of `out`, the all-gather
    // copies only the peers' shares, and only theirs are unpacked. This rank's own elements are
    // in its parameters already (its update wrote them there).
    const torch::Tensor out = s.gather_out.narrow(0, 0, padded), mine = out.narrow(0, lo, share);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const torch::Tensor flat_param = s.params[bucket.params[k]].detach().view({-1});
      const int64_t first = bucket.offsets[k], last = first + flat_param.numel();
      const int64_t from = std::max(first, lo), to = std::min(last, hi);
      if (from < to)
        out.narrow(0, from, to - from).copy_(flat_param.narrow(0, from - first, to - from));
    }
    s.communicator->all_gather_(mine, out);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const torch::Tensor flat_param = s.params[bucket.params[k]].detach().view({-1});
      const int64_t first = bucket.offsets[k], last = first + flat_param.numel();
      auto unpack = [&](int64_t from, int64_t to) {
        if (from < to)
          flat_param.narrow(0, from - first, to - from).copy_(out.narrow(0, from, to - from));
      };
      unpack(first, std::min(last, lo));  // the elements before this rank's share
      unpack(std::max(first, hi), last);  // and after it
    }
  }
}

std::vector<torch::Tensor> GradientReducer::gradient_shares() const {
  const State& s = *state_;
  return s.scatters_gradients() ? s.averaged_share : std::vector<torch::Tensor>();
}

void GradientReducer::abandon_pass() {
  {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto& pending : s.in_flight) {
      try {
        pending.wait();
      } catch (...) {  // the failure is the one being recovered from
      }
      pending = PendingCollective();
    }
    s.in_backward = false;
  }
  zero_gradients();
}

void GradientReducer::zero_gradients() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    torch::Tensor& param = s.params[i];
    if (s.bucket_of[i] >= 0 && param.grad().defined() && !s.in_bucket(i))
      param.mutable_grad().zero_();
  }
  for (torch::Tensor& flat : s.flat) {
    if (flat.defined()) flat.zero_();
  }
  for (torch::Tensor& share : s.averaged_share) {
    if (share.defined()) share.zero_();
  }
}

}  // namespace accelerant
