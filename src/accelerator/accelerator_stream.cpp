// Accelerator::prepare for stream loaders: a sharded copy that agrees with the other ranks at
// every step (the note "Uneven stream ends" in accelerant/stream_loader.h) and is saved by
// save_state.
#include "accelerant/accelerator.h"
#include "accelerant/error.h"
#include "accelerant/process_state.h"
#include "accelerator/accelerator_impl.h"
#include "accelerator/batch_to_device.h"
#include "base/text.h"
#include "base/torch_compat.h"
#include "checkpoint/training_checkpoint.h"
#include "comm/collective_label.h"
#include "graph/metrics_recording.h"
#include "train/resume_hook.h"
#include "train/stream_loader_internal.h"

namespace accelerant {

StreamLoader Accelerator::prepare_stream_loader(const StreamLoader& loader) {
  refuse_under_in_place_recovery("stream loader");
  const torch::Device device = impl_->device_;
  const bool downcast = impl_->settings_.downcast_bf16;
  // As prepare_data_loader moves a DataLoader's batches (in the worker threads when there are).
  std::function<Batch(Batch)> transform =
      detail::batch_to_device(device, downcast, /*pin=*/device.is_cuda());
  std::function<torch::Tensor(const torch::Tensor&)> all_reduce_max;
  std::function<std::string(const std::string&, int)> broadcast_text;
  if (impl_->world_size_ > 1) {
    broadcast_text = [](const std::string& text, int src) {
      detail::ScopedCollectiveLabel label("stream loader error");
      return ProcessState::get().communicator().broadcast_bytes(text, src);
    };
    // The communicator in force at each step (never this Accelerator: the loader may outlive it).
    all_reduce_max = [device](const torch::Tensor& values) {
      detail::ScopedCollectiveLabel label("stream loader step");
      return ProcessState::get().communicator().all_reduce(values.to(device), ReduceOp::kMax);
    };
  }
  StreamLoader prepared = [&] {
    try {
      return detail::StreamLoaderAccess::sharded(
          loader, {impl_->rank_, impl_->world_size_, impl_->rank_prefix_, impl_->state_,
                   std::move(transform), impl_->resume_hook_, std::move(all_reduce_max),
                   std::move(broadcast_text)});
    } catch (const Error& e) {
      throw Error(detail::str(impl_->rank_prefix_, "prepare(stream loader): ", e.what()));
    }
  }();
  const size_t index = impl_->checkpointed_->streams.size();
  impl_->checkpointed_->streams.push_back(prepared);
  // A checkpoint loaded before this loader existed (auto_resume) still knows where it was.
  if (index < impl_->checkpointed_->loaded_streams.size()) {
    prepared.set_position(impl_->checkpointed_->loaded_streams[index]);
  }
  if (impl_->options_.auto_resume() && !impl_->resume_armed_) {  // armed once, by the first loader
    impl_->resume_armed_ = true;
    impl_->resume_hook_->arm([this] { resume_from_latest(); });
  }
  return prepared;
}

}  // namespace accelerant
