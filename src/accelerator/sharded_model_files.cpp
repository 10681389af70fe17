#include "accelerator/sharded_model_files.h"

#include <exception>
#include <memory>

#include "accelerant/error.h"
#include "base/text.h"
#include "checkpoint/model_by_blocks.h"
#include "checkpoint/safetensors_stream.h"
#include "checkpoint/state_pieces.h"

namespace accelerant::detail {

void save_model_by_blocks(const torch::nn::Module& model, const std::string& dir,
                          int64_t max_shard_bytes, const CheckpointRanks& ranks) {
  const auto tensors = model_tensors_in_file_order(model);
  std::unique_ptr<ModelSafetensorsWriter> writer;
  std::exception_ptr failure;  // the main process's, said on every process at the end
  if (ranks.is_main()) {
    try {
      std::vector<TensorLayout> layouts;
      for (const auto& [name, tensor] : tensors) layouts.push_back(layout_of(name, tensor));
      writer = std::make_unique<ModelSafetensorsWriter>(dir, std::move(layouts), max_shard_bytes);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  visit_model_by_blocks(model, /*keep=*/false, [&](const std::string&, torch::Tensor& tensor) {
    if (!writer) return;
    try {
      writer->write(tensor);
    } catch (...) {
      failure = std::current_exception();
      writer.reset();  // removes what it wrote; the walk goes on for the other processes
    }
  });
  if (writer) {
    try {
      writer->finish();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  on_every_process(ranks, "save_model into " + dir, [&] {
    if (failure) std::rethrow_exception(failure);
  });
}

void load_model_by_blocks(torch::nn::Module& model, const std::string& dir,
                          const CheckpointRanks& ranks) {
  std::unique_ptr<MappedModelWeights> weights;
  on_every_process(ranks, "load_model from " + dir, [&] {
    weights = std::make_unique<MappedModelWeights>(dir);
    const auto problems = state_mismatches(named_state(model), weights->shapes());
    if (!problems.empty()) {
      throw CheckpointError(
          str("the weights in ", dir,
              " do not fit the model; nothing was loaded: ", join(problems, "; "),
              ". Fix: build the model with the same layers and sizes as the one saved."),
          dir);
    }
  });
  torch::NoGradGuard no_grad;
  visit_model_by_blocks(model, /*keep=*/true, [&](const std::string& name, torch::Tensor& tensor) {
    tensor.copy_(weights->tensor(name));
    weights->forget(name);
  });
}

}  // namespace accelerant::detail
