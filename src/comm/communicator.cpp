#include "accelerant/communicator.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "accelerant/error.h"
#include "base/file_io.h"
#include "base/text.h"
#include "comm/collective_diagnosis.h"
#include "comm/communicator_impl.h"
#include "comm/reduce_op.h"

namespace accelerant {
namespace {

// The private state communicator.h declares but does not define (communicator_impl.h).
using CommunicatorImpl = detail::CommunicatorAccess::Impl;
using PendingState = detail::CommunicatorAccess::PendingState;

constexpr int64_t kMaxGatherDims = 8;

std::string shape_text(const torch::Tensor& t, bool free_first_dim = false) {
  std::vector<std::string> dims;
  for (int64_t d = 0; d < t.dim(); ++d) {
    dims.push_back(free_first_dim && d == 0 ? "*" : std::to_string(t.size(d)));
  }
  return "[" + detail::join(dims, ", ") + "]";
}

std::string signature(const std::string& op, const torch::Tensor& t, bool free_first_dim = false) {
  return detail::str(op, " ", c10::toString(t.scalar_type()), " ", shape_text(t, free_first_dim));
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

detail::CommBackend& CommunicatorImpl::backend_for(const torch::Tensor& t) const {
  if (t.is_cuda()) {
    if (!nccl) {
      throw Error(detail::str(
          rank_prefix, "A CUDA tensor was passed to a collective but this ",
          "communicator has no NCCL group. Fix: build against a CUDA LibTorch ",
          "and keep the ProcessState device on CUDA, or move the tensor to the ", "CPU first."));
    }
    return *nccl;
  }
  return *gloo;
}

namespace {

// The payload of a collective as its flight record shows it.
struct Payload {
  const char* dtype;
  int64_t elements;
};

Payload payload_of(const torch::Tensor& t) { return {c10::toString(t.scalar_type()), t.numel()}; }

// Marks the caller as blocked in collective `sequence` for as long as it lives (the watchdog's
// view of this rank). Nested marks (a gather's own exchange) keep the outer one.
class BlockedScope {
 public:
  BlockedScope(detail::BlockedIn& blocked, int64_t sequence) : blocked_(blocked) {
    if (blocked_.sequence.load() != 0) return;
    blocked_.since_ns.store(detail::steady_clock_ns());
    blocked_.sequence.store(sequence);
    owner_ = true;
  }
  ~BlockedScope() {
    if (owner_) blocked_.sequence.store(0);
  }
  BlockedScope(const BlockedScope&) = delete;
  BlockedScope& operator=(const BlockedScope&) = delete;

 private:
  detail::BlockedIn& blocked_;
  bool owner_ = false;
};

[[noreturn]] void fail(CommunicatorImpl& c, detail::CollectiveCall call,
                       const std::string& signature, const std::string& cause) {
  call.signature = signature;
  c.flight.finish(call.sequence, detail::CollectiveState::kFailed);
  const std::string record = detail::format_flight_record(c.flight.record(c.rank, c.size));
  // Before the diagnosis publishes it: a peer that saw it in the store and ended may make the
  // launcher read this file at once.
  if (!c.error_file.empty()) {
    detail::write_file_atomically(c.error_file + detail::kFlightRecordSuffix, record);
  }
  auto diagnosis = detail::diagnose_failure(*c.store, call, c.rank, c.size, c.timeout,
                                            c.rank_prefix, cause, record);
  c.broken_reason = diagnosis.message;
  if (diagnosis.different_collectives && diagnosis.missing.empty()) {
    throw CollectiveMismatchError(diagnosis.message);
  }
  throw CollectiveError(diagnosis.message, diagnosis.missing);
}

// Starts one public collective: refuses on a broken communicator, numbers the call, records it in
// the flight recorder with the public API that issued it and, in debug mode, checks the
// signatures across ranks. `describe` formats the call's signature; it runs only in debug mode or
// after a failure, so the training step's all-reduces pay no string formatting.
template <class Describe>
detail::CollectiveCall begin_call(CommunicatorImpl& c, const char* name, Payload payload,
                                  Describe&& describe) {
  if (!c.broken_reason.empty()) {
    throw CollectiveError(
        detail::str(c.rank_prefix, name,
                    " refused: this communicator broke earlier: ", c.broken_reason,
                    "\nFix: end this process; the launcher restarts "
                    "the group when max_restarts allows."),
        {});
  }
  detail::CollectiveCall call{++c.sequence, "", name};
  c.flight.start(call.sequence, name, detail::current_collective_label(), payload.dtype,
                 payload.elements);
  if (c.debug) {
    call.signature = describe();
    BlockedScope blocked(c.blocked, call.sequence);
    try {
      detail::check_signatures(*c.store, call, c.rank, c.size, c.timeout, c.rank_prefix);
    } catch (...) {
      c.flight.finish(call.sequence, detail::CollectiveState::kFailed);
      throw;
    }
  }
  return call;
}

// Runs `body` (the transport part of a collective) and turns a transport failure into a
// CollectiveError naming the ranks that never arrived.
template <class Describe, class Body>
auto run_or_fail(CommunicatorImpl& c, const detail::CollectiveCall& call, Describe&& describe,
                 Body&& body) {
  try {
    return body();
  } catch (const detail::ShmTransportError& e) {
    fail(c, call, describe(), e.what());
  } catch (const Error&) {  // already explained, e.g. the CollectiveMismatchError of a gather
    c.flight.finish(call.sequence, detail::CollectiveState::kFailed);
    throw;
  } catch (const c10::Error& e) {
    fail(c, call, describe(), e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(c, call, describe(), e.what());
  }
}

// One blocking public collective.
template <class Describe, class Body>
auto guarded(CommunicatorImpl& c, const char* name, Payload payload, Describe&& describe,
             Body&& body) {
  auto call = begin_call(c, name, payload, describe);
  BlockedScope blocked(c.blocked, call.sequence);
  if constexpr (std::is_void_v<decltype(body())>) {
    run_or_fail(c, call, describe, body);
    c.flight.finish(call.sequence, detail::CollectiveState::kCompleted);
  } else {
    auto result = run_or_fail(c, call, describe, body);
    c.flight.finish(call.sequence, detail::CollectiveState::kCompleted);
    return result;
  }
}

// Equal-shape all-gather without the guard; every rank's tensor in rank order.
std::vector<torch::Tensor> raw_all_gather(CommunicatorImpl& c, const torch::Tensor& t) {
  std::vector<torch::Tensor> inputs{t.contiguous()};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < c.size; ++r) outputs[0].push_back(torch::empty_like(inputs[0]));
  // Gloo's allgather divides by the payload's byte count and dies of SIGFPE on an empty one
  // (e.g. gather_bytes("") on every rank). The caller checked that every rank's is empty.
  if (t.numel() == 0) return outputs[0];
  wait(c.backend_for(t).allgather(outputs, inputs));
  return outputs[0];
}

// One row per rank: [ndim, dtype, size0, size1, ...]. Checked on every rank, so a mismatch in
// the trailing dimensions is always an error naming each rank's shape (no debug mode needed).
std::vector<std::vector<int64_t>> exchange_shapes(CommunicatorImpl& c, const torch::Tensor& t,
                                                  const std::string& op) {
  if (t.dim() > kMaxGatherDims) {
    throw Error(detail::str(c.rank_prefix, op, " supports up to ", kMaxGatherDims,
                            " dimensions, got ", t.dim(), ". Fix: reshape the tensor first."));
  }
  std::vector<int64_t> mine(2 + kMaxGatherDims, -1);
  mine[0] = t.dim();
  mine[1] = static_cast<int64_t>(t.scalar_type());
  for (int64_t d = 0; d < t.dim(); ++d) mine[2 + d] = t.size(d);
  auto meta = torch::tensor(mine, torch::kLong);
  auto rows = raw_all_gather(c, t.is_cuda() ? meta.to(t.device()) : meta);
  std::vector<std::vector<int64_t>> shapes;
  bool compatible = true;
  for (auto& row : rows) {
    auto cpu = row.cpu();
    std::vector<int64_t> v(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
    compatible = compatible && v[0] == mine[0] && v[1] == mine[1];
    for (int64_t d = 1; compatible && d < t.dim(); ++d) compatible = v[2 + d] == t.size(d);
    shapes.push_back(std::move(v));
  }
  if (!compatible) {
    std::string table;
    for (size_t r = 0; r < shapes.size(); ++r) {
      std::vector<int64_t> dims(shapes[r].begin() + 2, shapes[r].begin() + 2 + shapes[r][0]);
      table += detail::str("\n  rank ", r, ": ",
                           c10::toString(static_cast<c10::ScalarType>(shapes[r][1])), " [",
                           detail::join(dims, ", "), "]");
    }
    throw CollectiveMismatchError(detail::str(
        c.rank_prefix, op,
        " needs the same dtype and the same sizes after the first dimension "
        "on every rank, but got:",
        table, "\nFix: reshape or convert the tensors so that only the first dimension differs."));
  }
  return shapes;
}

// The arguments of reduce_scatter_ (`scatter`: input holds world_size() shards, output one) or
// all_gather_ (output holds world_size() copies of input's size).
void check_sharded_arguments(const CommunicatorImpl& c, const char* name,
                             const torch::Tensor& input, const torch::Tensor& output, bool scatter,
                             ReduceOp op) {
  auto refuse = [&](const std::string& what) {
    throw Error(detail::str(c.rank_prefix, name, ": ", what));
  };
  if (!input.defined() || !output.defined()) {
    refuse("input and output must be defined tensors. Fix: allocate output, e.g. torch::empty.");
  }
  if (input.scalar_type() != output.scalar_type()) {
    refuse(detail::str("input is ", c10::toString(input.scalar_type()), " but output is ",
                       c10::toString(output.scalar_type()),
                       ". Fix: give output the dtype of input."));
  }
  if (input.device() != output.device()) {
    refuse(detail::str("input is on ", input.device().str(), " but output on ",
                       output.device().str(), ". Fix: put both on the same device."));
  }
  for (const auto* t : {&input, &output}) {
    if (!t->is_contiguous()) {
      refuse(detail::str(t == &input ? "input" : "output",
                         " is not contiguous (a strided view of shape ", shape_text(*t),
                         "). Fix: pass a contiguous tensor (tensor.contiguous(), or for the "
                         "output a torch::empty to copy from afterwards)."));
    }
  }
  const int64_t n = c.size;
  if (scatter && input.numel() != n * output.numel()) {
    refuse(detail::str(
        "input has ", input.numel(), " elements and output ", output.numel(),
        ", but input must hold one shard of output's size per rank: world_size() * output.numel() "
        "= ",
        n, " * ", output.numel(), " = ", n * output.numel(),
        ". Fix: output must have input.numel()/world_size() elements",
        input.numel() % n == 0
            ? detail::str(" (", input.numel() / n, ")")
            : detail::str(", and input.numel() must be a multiple of world_size() = ", n,
                          " (pad it)"),
        "."));
  }
  if (!scatter && output.numel() != n * input.numel()) {
    refuse(detail::str("input has ", input.numel(), " elements and output ", output.numel(),
                       ", but output must hold every rank's input: world_size() * input.numel() = ",
                       n, " * ", input.numel(), " = ", n * input.numel(),
                       ". Fix: output must have world_size() * input.numel() elements."));
  }
  if (scatter && op == ReduceOp::kMean && !input.is_floating_point()) {
    refuse(detail::str("mean needs a floating-point tensor, got ",
                       c10::toString(input.scalar_type()),
                       ". Fix: convert first, e.g. tensor.to(torch::kFloat), or reduce with sum."));
  }
}

void check_source_rank(const CommunicatorImpl& c, const char* op, int src) {
  if (src >= 0 && src < c.size) return;
  throw Error(detail::str(c.rank_prefix, op, ": src ", src, " is not a rank of this world of ",
                          c.size, " processes. Fix: pass a rank between 0 and ", c.size - 1,
                          " (the same on every rank)."));
}

}  // namespace

Communicator::Communicator() : impl_(std::make_unique<Impl>()) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

int Communicator::rank() const { return impl_->rank; }
int Communicator::world_size() const { return impl_->size; }
const std::string& Communicator::broken_reason() const { return impl_->broken_reason; }
bool Communicator::shared_memory_all_reduce() const { return impl_->shm != nullptr; }
const std::string& Communicator::all_reduce_path() const { return impl_->all_reduce_path; }

void Communicator::all_reduce_(const torch::Tensor& tensor, ReduceOp op) {
  all_reduce_async_(tensor, op).wait();
}

// What a collective in flight needs to finish: the transport's handle, the tensors on the wire
// (an fp32 or contiguous copy when the caller's cannot travel as it is), where the answer lands
// and the call's identity for the failure report.
struct PendingCollective::State {
  CommunicatorImpl* comm = nullptr;
  detail::CollectiveCall call;
  const char* name = "all_reduce";      // or "reduce_scatter", "all_gather"
  c10::intrusive_ptr<c10d::Work> work;  // Gloo or NCCL, or
  std::future<void> shm_done;           // the shared-memory path
  torch::Tensor wire;                   // kept alive while the transport uses it
  torch::Tensor input;                  // the caller's input (reduce_scatter, all_gather)
  torch::Tensor result;  // the answer when the transport is done: divided for kMean, then copied
                         // into target unless it is target
  torch::Tensor target;
  ReduceOp op = ReduceOp::kSum;
  bool reduces = true;  // false for all_gather

  std::string describe() const {
    if (!input.defined()) return signature(detail::str(name, "(", to_string(op), ")"), target);
    return detail::str(name, reduces ? detail::str("(", to_string(op), ")") : std::string(), " ",
                       c10::toString(input.scalar_type()), " ", shape_text(input), " -> ",
                       shape_text(target));
  }
};

bool PendingCollective::done() const {
  if (!state_) return true;
  if (state_->shm_done.valid()) {
    return state_->shm_done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  return !state_->work || state_->work->isCompleted();
}

void PendingCollective::wait() {
  if (!state_) return;
  auto state = std::move(state_);  // a second wait() returns at once, even after a failure
  CommunicatorImpl& c = *state->comm;
  BlockedScope blocked(c.blocked, state->call.sequence);
  run_or_fail(
      c, state->call, [&] { return state->describe(); },
      [&] {
        if (state->shm_done.valid()) {
          state->shm_done.get();
        } else if (state->work) {
          state->work->wait();
        }
        if (!state->result.defined()) return;  // nothing travelled (no elements)
        if (state->reduces && state->op == ReduceOp::kMean) state->result.div_(c.size);
        if (!state->result.is_same(state->target)) {
          state->target.copy_(state->result.view(state->target.sizes()));
        }
      });
  c.flight.finish(state->call.sequence, detail::CollectiveState::kCompleted);
}

namespace {

// Queues the all-reduce of state.wire: through the shared-memory segment when it carries that
// dtype, else through the tensor's backend (Gloo for CPU tensors, NCCL for CUDA ones).
void queue_all_reduce(CommunicatorImpl& c, PendingState& state, ReduceOp op) {
  if (c.shm && detail::ShmAllReduce::supports(state.wire)) {
    state.shm_done = c.shm->submit(state.wire, op);
    return;
  }
  c10d::AllreduceOptions opts;
  opts.reduceOp = detail::to_c10d(op);
  std::vector<torch::Tensor> tensors{state.wire};
  state.work = c.backend_for(state.wire).allreduce(tensors, opts);
}

}  // namespace

PendingCollective Communicator::all_reduce_async_(const torch::Tensor& tensor, ReduceOp op) {
  if (op == ReduceOp::kMean && !tensor.is_floating_point()) {
    throw Error(
        detail::str(impl_->rank_prefix, "all_reduce(mean) needs a floating-point tensor, got ",
                    c10::toString(tensor.scalar_type()),
                    ". Fix: convert first, e.g. tensor.to(torch::kFloat), or reduce with sum."));
  }
  if (impl_->size == 1) return {};
  auto state = std::make_shared<PendingState>();
  state->comm = impl_.get();
  state->target = tensor;
  state->op = op;
  auto describe = [&] { return state->describe(); };
  state->call = begin_call(*impl_, "all_reduce", payload_of(tensor), describe);
  run_or_fail(*impl_, state->call, describe, [&] {
    // Gloo cannot reduce bf16 (nor a strided view): reduce an fp32 / contiguous copy.
    const bool upcast = tensor.scalar_type() == torch::kBFloat16 && !tensor.is_cuda();
    state->wire = upcast ? tensor.to(torch::kFloat) : tensor.contiguous();
    state->result = state->wire;
    queue_all_reduce(*impl_, *state, op);
  });
  return detail::CommunicatorAccess::pending(std::move(state));
}

namespace {

// A reduce-scatter's or all-gather's pending state with its call begun (numbered, recorded,
// checked across ranks in debug mode): what both set up alike. The payload is the whole side,
// the input of a reduce-scatter and the output of an all-gather.
std::shared_ptr<PendingState> begin_sharded(CommunicatorImpl& c, const char* name,
                                            const torch::Tensor& input, const torch::Tensor& output,
                                            ReduceOp op, bool reduces) {
  auto state = std::make_shared<PendingState>();
  state->comm = &c;
  state->name = name;
  state->input = input;
  state->target = output;
  state->op = op;
  state->reduces = reduces;
  state->call =
      begin_call(c, name, payload_of(reduces ? input : output), [&] { return state->describe(); });
  return state;
}

}  // namespace

void Communicator::reduce_scatter_(const torch::Tensor& input, const torch::Tensor& output,
                                   ReduceOp op) {
  reduce_scatter_async_(input, output, op).wait();
}

PendingCollective Communicator::reduce_scatter_async_(const torch::Tensor& input,
                                                      const torch::Tensor& output, ReduceOp op) {
  check_sharded_arguments(*impl_, "reduce_scatter_", input, output, /*scatter=*/true, op);
  if (impl_->size == 1) {
    output.copy_(input.view(output.sizes()));
    return {};
  }
  auto state = begin_sharded(*impl_, "reduce_scatter", input, output, op, /*reduces=*/true);
  auto describe = [&] { return state->describe(); };
  run_or_fail(*impl_, state->call, describe, [&] {
    if (input.numel() == 0) return;  // every rank agrees on it (else debug mode or the timeout)
    const int64_t shard = output.numel();
    if (input.is_cuda()) {  // NCCL reduces and scatters natively, bf16 included
      torch::Tensor in = input, out = output;
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = detail::to_c10d(op);
      state->work = impl_->backend_for(in)._reduce_scatter_base(out, in, opts);
      state->result = output;
      return;
    }
    // bf16 travels as fp32 (Gloo cannot reduce it; the shared-memory path takes the same road so
    // that both give all_reduce's bits).
    const bool upcast = input.scalar_type() == torch::kBFloat16;
    torch::Tensor wire = upcast ? input.to(torch::kFloat) : input;
    if (impl_->shm && !impl_->shm->hierarchical() && detail::ShmAllReduce::supports(wire)) {
      state->wire = wire;
      state->result = upcast ? torch::empty({shard}, torch::kFloat) : output;
      state->shm_done = impl_->shm->submit_reduce_scatter(wire, state->result, op);
      return;
    }
    // Gloo (no reduce-scatter in 1.13) and the hierarchical path: all-reduce a copy, keep this
    // rank's shard. Twice the traffic of a reduce-scatter; see docs/collectives.md.
    state->wire = upcast ? wire.reshape({-1}) : input.reshape({-1}).clone();
    state->result = state->wire.narrow(0, impl_->rank * shard, shard);
    queue_all_reduce(*impl_, *state, op);
  });
  return detail::CommunicatorAccess::pending(std::move(state));
}

void Communicator::all_gather_(const torch::Tensor& input, const torch::Tensor& output) {
  all_gather_async_(input, output).wait();
}

PendingCollective Communicator::all_gather_async_(const torch::Tensor& input,
                                                  const torch::Tensor& output) {
  check_sharded_arguments(*impl_, "all_gather_", input, output, /*scatter=*/false, ReduceOp::kSum);
  if (impl_->size == 1) {
    output.copy_(input.view(output.sizes()));
    return {};
  }
  auto state =
      begin_sharded(*impl_, "all_gather", input, output, ReduceOp::kSum, /*reduces=*/false);
  auto describe = [&] { return state->describe(); };
  run_or_fail(*impl_, state->call, describe, [&] {
    if (input.numel() == 0) return;  // Gloo would die of SIGFPE on an empty payload
    state->result = output;          // every path writes straight into it
    if (input.is_cuda()) {
      torch::Tensor in = input, out = output;
      state->work = impl_->backend_for(in)._allgather_base(out, in);
      return;
    }
    if (impl_->shm && !impl_->shm->hierarchical()) {  // only bytes move: any dtype
      state->shm_done = impl_->shm->submit_all_gather(input, output);
      return;
    }
    // Gloo has neither bf16 nor bool, but only bytes move: send them as a type of the same width.
    // Its allgather copies each rank's part into the views of output given to it.
    const auto wire_type = input.scalar_type() == torch::kBFloat16 ? torch::kHalf
                           : input.scalar_type() == torch::kBool   ? torch::kByte
                                                                   : input.scalar_type();
    // Gloo copies the input into this rank's part of output: not onto itself (in place).
    const bool in_place =
        input.data_ptr() ==
        static_cast<char*>(output.data_ptr()) + impl_->rank * input.numel() * input.element_size();
    std::vector<torch::Tensor> inputs{
        (in_place ? input.clone() : input).reshape({-1}).view(wire_type)};
    const auto flat = output.view({-1}).view(wire_type);
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int r = 0; r < impl_->size; ++r) {
      outputs[0].push_back(flat.narrow(0, r * input.numel(), input.numel()));
    }
    state->work = impl_->gloo->allgather(outputs, inputs);
  });
  return detail::CommunicatorAccess::pending(std::move(state));
}

torch::Tensor Communicator::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  torch::Tensor result = tensor.clone(at::MemoryFormat::Contiguous);
  all_reduce_(result, op);
  return result;
}

std::vector<torch::Tensor> Communicator::gather_list(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;
  if (impl_->size == 1) return {t.clone()};
  auto describe = [&] { return signature("gather", t, /*free_first_dim=*/true); };
  return guarded(*impl_, "gather", payload_of(t), describe, [&] {
    auto shapes = exchange_shapes(*impl_, t, "gather");
    int64_t longest = 0;
    for (auto& s : shapes) longest = std::max(longest, s[2]);
    torch::Tensor padded = t;
    if (t.size(0) < longest) {
      auto pad_shape = t.sizes().vec();
      pad_shape[0] = longest - t.size(0);
      padded = torch::cat({t, torch::zeros(pad_shape, t.options())});
    }
    // Gloo has neither bf16 nor bool: they travel as fp32 and uint8 and come back as they were.
    const auto wire_type = t.is_cuda()                           ? t.scalar_type()
                           : t.scalar_type() == torch::kBFloat16 ? torch::kFloat
                           : t.scalar_type() == torch::kBool     ? torch::kByte
                                                                 : t.scalar_type();
    auto parts = raw_all_gather(*impl_, padded.to(wire_type));
    for (size_t r = 0; r < parts.size(); ++r) {
      parts[r] = parts[r].narrow(0, 0, shapes[r][2]).to(t.scalar_type());
    }
    return parts;
  });
}

torch::Tensor Communicator::gather(const torch::Tensor& tensor) {
  return torch::cat(gather_list(tensor));
}

torch::Tensor Communicator::pad_across_processes(const torch::Tensor& tensor, int64_t dim,
                                                 double pad_value, bool pad_first) {
  if (tensor.dim() == 0) return tensor;
  dim = dim < 0 ? dim + tensor.dim() : dim;
  if (dim < 0 || dim >= tensor.dim()) {
    throw Error(detail::str(impl_->rank_prefix, "pad_across_processes: dim ", dim,
                            " is out of range for a tensor of shape ", shape_text(tensor),
                            ". Fix: pass a dimension between ", -tensor.dim(), " and ",
                            tensor.dim() - 1, "."));
  }
  auto size = torch::tensor({tensor.size(dim)}, torch::kLong);
  all_reduce_(size, ReduceOp::kMax);
  const int64_t longest = size.item<int64_t>();
  if (longest == tensor.size(dim)) return tensor;
  auto pad_shape = tensor.sizes().vec();
  pad_shape[dim] = longest - tensor.size(dim);
  auto pad = torch::full(pad_shape, pad_value, tensor.options());
  return pad_first ? torch::cat({pad, tensor}, dim) : torch::cat({tensor, pad}, dim);
}

void Communicator::broadcast_(const torch::Tensor& tensor, int src) {
  check_source_rank(*impl_, "broadcast_", src);
  if (impl_->size == 1) return;
  auto describe = [&] { return signature(detail::str("broadcast(src=", src, ")"), tensor); };
  guarded(*impl_, "broadcast", payload_of(tensor), describe, [&] {
    // Gloo has no bf16 type; a broadcast only moves bytes, so send them as fp16 (same width).
    // Gloo has neither bf16 nor bool; a broadcast only moves bytes, so send them as a type of
    // the same width (fp16, uint8).
    torch::Tensor wire = tensor.contiguous();
    torch::Tensor bytes = wire;
    if (!tensor.is_cuda() && tensor.scalar_type() == torch::kBFloat16)
      bytes = wire.view(torch::kHalf);
    if (!tensor.is_cuda() && tensor.scalar_type() == torch::kBool) bytes = wire.view(torch::kByte);
    std::vector<torch::Tensor> tensors{bytes};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    wait(impl_->backend_for(wire).broadcast(tensors, opts));
    if (!wire.is_same(tensor)) tensor.copy_(wire);
  });
}

std::vector<std::string> Communicator::gather_bytes(const std::string& bytes) {
  if (impl_->size == 1) return {bytes};
  auto tensor = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  std::vector<std::string> all;
  for (const auto& t : gather_list(tensor)) {
    auto cpu = t.cpu().contiguous();
    all.emplace_back(static_cast<const char*>(cpu.data_ptr()), static_cast<size_t>(cpu.numel()));
  }
  return all;
}

std::string Communicator::broadcast_bytes(const std::string& bytes, int src) {
  check_source_rank(*impl_, "broadcast_bytes", src);
  if (impl_->size == 1) return bytes;
  auto describe = [&] { return detail::str("broadcast_bytes(src=", src, ")"); };
  const Payload payload{"bytes", static_cast<int64_t>(bytes.size())};
  return guarded(*impl_, "broadcast_bytes", payload, describe, [&] {
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    std::vector<torch::Tensor> length{
        torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kLong)};
    wait(impl_->gloo->broadcast(length, opts));
    auto data = torch::empty({length[0].item<int64_t>()}, torch::kUInt8);
    if (impl_->rank == src) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
    std::vector<torch::Tensor> payload{data};
    if (data.numel() > 0) wait(impl_->gloo->broadcast(payload, opts));
    return std::string(reinterpret_cast<const char*>(data.data_ptr()), data.numel());
  });
}

void Communicator::barrier() {
  if (impl_->size == 1) return;
  guarded(
      *impl_, "barrier", Payload{"none", 0}, [] { return std::string("barrier"); },
      [&] { wait(impl_->gloo->barrier()); });
}

}  // namespace accelerant
