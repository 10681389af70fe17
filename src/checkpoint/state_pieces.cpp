#include "checkpoint/state_pieces.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/serialize.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "accelerant/error.h"
#include "base/text.h"
#include "base/uncaught_exception_recorder.h"
#include "train/fused_state_conversion.h"
#include "train/fused_state_format.h"

namespace accelerant::detail {

std::string archive_to_bytes(const std::function<void(torch::serialize::OutputArchive&)>& fill) {
  torch::serialize::OutputArchive archive;
  fill(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

torch::serialize::InputArchive archive_from_bytes(const std::string& bytes, const std::string& what,
                                                  torch::Device device) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (const std::exception&) {
    throw CheckpointError(
        str(what, " cannot be read as a LibTorch archive (",
            exception_text(std::current_exception()), "). Likely cause: it ",
            "was damaged after its checksum was taken, or written by another program. Fix: ",
            "use another checkpoint."));
  }
  return archive;
}

std::map<std::string, torch::Tensor> named_state(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) state[p.key()] = p.value();
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state[b.key()] = b.value();
  return state;
}

std::vector<std::string> state_mismatches(
    const std::map<std::string, torch::Tensor>& model,
    const std::map<std::string, std::vector<int64_t>>& saved) {
  std::vector<std::string> missing, unexpected, reshaped;
  for (const auto& [name, shape] : saved) {
    auto it = model.find(name);
    if (it == model.end()) {
      unexpected.push_back(name);
    } else if (it->second.sizes() != c10::IntArrayRef(shape)) {
      reshaped.push_back(
          detail::str(name, " saved ", c10::IntArrayRef(shape), ", model ", it->second.sizes()));
    }
  }
  for (const auto& [name, tensor] : model) {
    if (!saved.count(name)) missing.push_back(name);
  }
  std::vector<std::string> problems;
  if (!missing.empty()) problems.push_back("not in the checkpoint: " + join(missing, ", "));
  if (!unexpected.empty())
    problems.push_back("in the checkpoint but not in the model: " + join(unexpected, ", "));
  if (!reshaped.empty()) problems.push_back("shapes differ: " + join(reshaped, "; "));
  return problems;
}

std::string module_state_bytes(const torch::nn::Module& module) {
  return archive_to_bytes([&](torch::serialize::OutputArchive& archive) {
    for (const auto& [name, tensor] : named_state(module))
      archive.write(name, tensor.detach().cpu());
  });
}

std::vector<std::string> module_state_mismatches(const torch::nn::Module& module,
                                                 const std::string& bytes,
                                                 const std::string& what) {
  auto archive = archive_from_bytes(bytes, what);
  std::map<std::string, std::vector<int64_t>> saved;
  for (const auto& name : archive.keys()) {
    torch::Tensor tensor;
    // A module's state holds tensors only: anything else (an optimizer's version string, a
    // sub-archive) means the file is another kind of state, swapped in.
    if (!archive.try_read(name, tensor)) {
      throw CheckpointError(
          str(what, " is not a module's state: it holds '", name, "', which is not a tensor (",
              name == "pytorch_version" ? "it is an optimizer's state" : "another kind of file",
              "). Likely cause: files were swapped between checkpoints or edited, and the "
              "manifest's checksums rewritten to match. Fix: use another checkpoint (auto_resume "
              "takes the newest one that loads)."),
          what);
    }
    saved[name] = tensor.sizes().vec();
  }
  return state_mismatches(named_state(module), saved);
}

void load_module_state(torch::nn::Module& module, const std::string& bytes,
                       const std::string& what) {
  auto archive = archive_from_bytes(bytes, what);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : named_state(module)) {
    torch::Tensor saved;
    archive.read(name, saved);
    tensor.copy_(saved);
  }
}

namespace {
std::string gradients_of(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                         bool only_when_nonzero) {
  bool any_nonzero = false;
  std::string bytes = archive_to_bytes([&](torch::serialize::OutputArchive& archive) {
    for (size_t i = 0; i < models.size(); ++i) {
      torch::serialize::OutputArchive model_archive;
      for (const auto& p : models[i]->named_parameters(/*recurse=*/true)) {
        const torch::Tensor& grad = p.value().grad();
        if (!grad.defined()) continue;
        any_nonzero = any_nonzero || (grad != 0).any().item<bool>();
        model_archive.write(p.key(), grad.detach().cpu());
      }
      archive.write(std::to_string(i), model_archive);
    }
  });
  return only_when_nonzero && !any_nonzero ? std::string() : bytes;
}
}  // namespace

std::string pending_gradient_bytes(const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  return gradients_of(models, /*only_when_nonzero=*/true);
}

std::string gradient_bytes(const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  return gradients_of(models, /*only_when_nonzero=*/false);
}

std::vector<std::string> gradient_mismatches(
    const std::vector<std::shared_ptr<torch::nn::Module>>& models, const std::string& bytes,
    const std::string& what) {
  auto archive = archive_from_bytes(bytes, what);
  std::vector<std::string> problems;
  for (size_t i = 0; i < models.size(); ++i) {
    torch::serialize::InputArchive model_archive;
    if (!archive.try_read(std::to_string(i), model_archive)) {
      problems.push_back(str("no gradients of model ", i));
      continue;
    }
    for (const auto& p : models[i]->named_parameters(/*recurse=*/true)) {
      torch::Tensor saved;
      if (model_archive.try_read(p.key(), saved) && saved.sizes() != p.value().sizes()) {
        problems.push_back(detail::str("model ", i, " gradient of ", p.key(), " saved ",
                                       saved.sizes(), ", parameter ", p.value().sizes()));
      }
    }
  }
  return problems;
}

void load_gradients(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                    const std::string& bytes, const std::string& what) {
  auto archive = archive_from_bytes(bytes, what);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < models.size(); ++i) {
    torch::serialize::InputArchive model_archive;
    archive.read(std::to_string(i), model_archive);
    for (auto& p : models[i]->named_parameters(/*recurse=*/true)) {
      torch::Tensor& param = p.value();
      torch::Tensor saved;
      if (!model_archive.try_read(p.key(), saved)) {
        param.mutable_grad() = torch::Tensor();  // none at the save: the next backward starts it
      } else if (param.grad().defined() && param.grad().sizes() == saved.sizes()) {
        param.mutable_grad().copy_(saved);  // in place: a gradient bound to a bucket stays bound
      } else {
        param.mutable_grad() = saved.detach().to(param.device(), param.scalar_type());
      }
    }
  }
}

// LibTorch 1.13's Optimizer::load restores the per-parameter state but not the parameter groups'
// options (learning rate, momentum, ...), which schedulers change: they are kept beside it.
const char* kGroupOptions = "accelerant_param_group_options";

const char* kFusedUpdater = "accelerant_fused_updater";
const char* kSharesOfProcesses = "accelerant_zero3_shares_of_processes";

namespace {
// The parameter groups' options (learning rate, momentum, ...) saved beside the state, when there.
void restore_group_options(torch::optim::Optimizer& optimizer,
                           torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive groups;
  if (!archive.try_read(kGroupOptions, groups)) return;
  for (size_t i = 0; i < optimizer.param_groups().size(); ++i) {
    torch::serialize::InputArchive options;
    groups.read(std::to_string(i), options);
    optimizer.param_groups()[i].options().serialize(options);
  }
}

// Inside a catch: the saved optimizer state `what` does not fit this optimizer, and why.
[[noreturn]] void refuse_optimizer_state(const std::string& what) {
  throw CheckpointError(
      str(what, " does not fit this optimizer (", exception_text(std::current_exception()),
          "). Likely cause: a different optimizer type or different parameter groups than when it "
          "was saved. Fix: build the optimizer as the saved run did."));
}

// Where `optimizer`'s state belongs: beside its first parameter (archives load onto one device).
torch::Device device_of(const torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    if (!group.params().empty()) return group.params().front().device();
  }
  return torch::kCPU;
}
}  // namespace

void copy_archive(torch::serialize::InputArchive& from, torch::serialize::OutputArchive& to,
                  const std::vector<std::string>& except) {
  for (const std::string& key : from.keys()) {
    if (std::find(except.begin(), except.end(), key) != except.end()) continue;
    torch::serialize::InputArchive nested;
    torch::Tensor tensor;
    c10::IValue value;
    if (from.try_read(key, nested)) {
      torch::serialize::OutputArchive copy;
      copy_archive(nested, copy);
      to.write(key, copy);
    } else if (from.try_read(key, tensor)) {
      to.write(key, tensor);
    } else if (from.try_read(key, value)) {
      to.write(key, value);
    }
  }
}

void copy_group_options(torch::serialize::InputArchive& from, torch::serialize::OutputArchive& to) {
  torch::serialize::InputArchive groups;
  if (!from.try_read(kGroupOptions, groups)) return;
  torch::serialize::OutputArchive copy;
  copy_archive(groups, copy);
  to.write(kGroupOptions, copy);
}

namespace {
void write_optimizer_state(torch::serialize::OutputArchive& archive,
                           const torch::optim::Optimizer& optimizer, const FusedUpdater* fused) {
  optimizer.save(archive);
  if (fused) {
    torch::serialize::OutputArchive state;
    fused->save(state);
    archive.write(kFusedUpdater, state);
  }
  torch::serialize::OutputArchive groups;
  for (size_t i = 0; i < optimizer.param_groups().size(); ++i) {
    torch::serialize::OutputArchive options;
    optimizer.param_groups()[i].options().serialize(options);
    groups.write(std::to_string(i), options);
  }
  archive.write(kGroupOptions, groups);
}
}  // namespace

std::string optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                                  const FusedUpdater* fused) {
  return archive_to_bytes([&](torch::serialize::OutputArchive& archive) {
    write_optimizer_state(archive, optimizer, fused);
  });
}

std::string share_optimizer_state_bytes(const torch::optim::Optimizer& optimizer,
                                        const FusedUpdater* fused, int processes,
                                        const std::vector<ShareSlot>& slots) {
  return archive_to_bytes([&](torch::serialize::OutputArchive& archive) {
    write_optimizer_state(archive, optimizer, fused);
    archive.write(kSharesOfProcesses, torch::tensor(static_cast<int64_t>(processes)));
    archive.write(kShareSlotsKey, share_slots_tensor(slots));
  });
}

SavedShares saved_shares(torch::serialize::InputArchive& archive, const std::string& what) {
  SavedShares saved;
  torch::Tensor processes, slots;
  if (!archive.try_read(kSharesOfProcesses, processes)) return saved;
  saved.processes = static_cast<int>(processes.item<int64_t>());
  if (!archive.try_read(kShareSlotsKey, slots)) {
    throw CheckpointError(str(what, " is a ZeRO stage-3 state without its share layout (",
                              kShareSlotsKey, "): it was saved by an earlier development ",
                              "version. Fix: resume with the version that saved it, or from ",
                              "the weights alone (accelerant checkpoint merge, then load_model)."));
  }
  try {
    saved.slots = share_slots_from_tensor(slots);
  } catch (const Error& e) {
    throw CheckpointError(str(what, ": ", e.what()));
  }
  return saved;
}

torch::serialize::InputArchive* fused_state_in(torch::serialize::InputArchive& archive,
                                               torch::serialize::InputArchive& nested) {
  if (archive.try_read(kFusedUpdater, nested)) return &nested;
  torch::Tensor kind;
  return archive.try_read(kFusedKindKey, kind) ? &archive : nullptr;
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const std::string& bytes,
                          const std::string& what, FusedUpdater* fused) {
  const torch::Device device = device_of(optimizer);
  auto archive = archive_from_bytes(bytes, what, device);
  try {
    // Parameters without saved state (no step yet when it was saved) must not keep today's.
    optimizer.state().clear();
    optimizer.load(archive);
    torch::serialize::InputArchive fused_state;
    const bool saved_fused = archive.try_read(kFusedUpdater, fused_state);
    if (fused && saved_fused) {
      fused->load(fused_state);
    } else if (fused) {
      // Saved by an optimizer that stepped by itself (fused_optimizers off, no ZeRO): its
      // per-parameter state becomes the fused update's, which keeps it from now on.
      const std::string converted = archive_to_bytes([&](torch::serialize::OutputArchive& out) {
        write_optimizer_state_as_fused(optimizer, out);
      });
      auto whole = archive_from_bytes(converted, what, device);
      fused->load(whole);
      optimizer.state().clear();
    } else if (saved_fused) {
      // Saved with a fused update (fused_optimizers, or ZeRO on one process); this optimizer
      // steps by itself: the fused state becomes its per-parameter state.
      load_fused_state_into_optimizer(optimizer, fused_state);
    }
    restore_group_options(optimizer, archive);
  } catch (const std::exception&) {
    refuse_optimizer_state(what);
  }
}

bool optimizer_sharded(torch::optim::Optimizer& optimizer, const FusedUpdater* fused) {
  const FusedUpdater* updater = fused ? fused : fused_updater_of(optimizer);
  return updater && updater->sharded();
}

void load_fused_form(torch::optim::Optimizer& optimizer, const std::string& bytes,
                     const std::string& what, FusedUpdater* fused) {
  // Null when this optimizer steps by itself (no ZeRO, fused_optimizers off, or one process):
  // the state then becomes its per-parameter state.
  FusedUpdater* updater = fused ? fused : fused_updater_of(optimizer);
  auto whole = archive_from_bytes(bytes, what, device_of(optimizer));
  try {
    if (updater) {
      if (fused) optimizer.state().clear();
      updater->load(whole);
    } else {
      load_fused_state_into_optimizer(optimizer, whole);
    }
    restore_group_options(optimizer, whole);
  } catch (const std::exception&) {
    refuse_optimizer_state(what);
  }
}

void load_sharded_optimizer_state(torch::optim::Optimizer& optimizer,
                                  const std::vector<std::string>& shards, const std::string& what,
                                  FusedUpdater* fused) {
  std::string merged;
  try {
    std::vector<torch::serialize::InputArchive> archives(shards.size()), states(shards.size());
    std::vector<torch::serialize::InputArchive*> pointers;
    for (size_t r = 0; r < shards.size(); ++r) {
      archives[r] = archive_from_bytes(shards[r], str(what, " (rank ", r, "'s shard)"));
      // A fused type saves its update's state at the top; prepare's updater beside the
      // optimizer's own (empty) state.
      auto* state = fused_state_in(archives[r], states[r]);
      if (state == nullptr || (fused && state == &archives[r])) {
        throw Error(str("rank ", r, "'s shard has no fused optimizer state"));
      }
      pointers.push_back(state);
    }
    try {
      merged = archive_to_bytes([&](torch::serialize::OutputArchive& out) {
        merge_optimizer_shards(pointers, out);
        copy_group_options(archives[0], out);
      });
    } catch (const Error& e) {  // the shards disagree: said as such, not as another optimizer
      throw CheckpointError(str(what, " and the other ranks' shards cannot be merged: ", e.what()));
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception&) {
    refuse_optimizer_state(what);
  }
  load_fused_form(optimizer, merged, what, fused);
}

namespace {
// LRScheduler::step_count_ is protected; a member pointer taken in a derived class reaches it
// without changing LibTorch.
struct StepCountAccess : torch::optim::LRScheduler {
  static unsigned torch::optim::LRScheduler::*member() { return &StepCountAccess::step_count_; }
};
}  // namespace

unsigned scheduler_step_count(const torch::optim::LRScheduler& scheduler) {
  return scheduler.*StepCountAccess::member();
}

void set_scheduler_step_count(torch::optim::LRScheduler& scheduler, unsigned steps) {
  scheduler.*StepCountAccess::member() = steps;
}

std::string rng_state_bytes() {
  return archive_to_bytes([](torch::serialize::OutputArchive& archive) {
    archive.write("cpu", at::detail::getDefaultCPUGenerator().get_state());
    if (torch::cuda::is_available()) {
      for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
        const auto& gen = at::globalContext().defaultGenerator(
            c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
        archive.write(str("cuda_", i), gen.get_state());
      }
    }
  });
}

void load_rng_state(const std::string& bytes, const std::string& what) {
  auto archive = archive_from_bytes(bytes, what);
  torch::Tensor cpu;
  if (!archive.try_read("cpu", cpu)) {
    throw CheckpointError(str(what, " has no CPU generator state. Fix: use another checkpoint."));
  }
  std::vector<std::pair<int64_t, torch::Tensor>> cuda;
  if (torch::cuda::is_available()) {
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      torch::Tensor state;
      if (archive.try_read(str("cuda_", i), state)) cuda.emplace_back(i, state);
    }
  }
  at::Generator cpu_generator = at::detail::getDefaultCPUGenerator();  // a handle to the global one
  cpu_generator.set_state(cpu);
  for (auto& [i, state] : cuda) {
    auto gen = at::globalContext().defaultGenerator(
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    gen.set_state(state);
  }
}

}  // namespace accelerant::detail
