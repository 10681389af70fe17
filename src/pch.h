// Precompiled for every target: LibTorch's headers dominate compile time (see docs/building.md).
#pragma once
#include <torch/torch.h>
