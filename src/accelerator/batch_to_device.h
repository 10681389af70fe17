// How a prepared loader (DataLoader or StreamLoader) moves its batches to the Accelerator's device.
#pragma once
#include <torch/types.h>

#include <functional>

#include "accelerant/batch.h"

namespace accelerant::detail {

/// The transform a prepared loader applies to each batch (in its worker threads when it has
/// some): every tensor of the batch, named ones included, to `device`, floating ones as bf16 when
/// `downcast`; to a GPU staged in page-locked memory and copied on a side stream when `pin`
/// (detail::to_device_from_worker). Empty (no transform) on the CPU without `downcast`.
std::function<Batch(Batch)> batch_to_device(torch::Device device, bool downcast, bool pin);

}  // namespace accelerant::detail
