// What a DataLoader yields and a GraphStep takes: one batch of training data.
#pragma once
#include <torch/data/example.h>

namespace accelerant {

/// A batch: the input tensor (`data`) and the target tensor (`target`).
using Batch = torch::data::Example<>;

}  // namespace accelerant
