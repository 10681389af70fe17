// Accelerant: one LibTorch training loop on one CPU, many processes, GPUs and machines.
// Include this one header; see README.md for the tour and docs/ for each part.
#pragma once

#include "accelerant/autocast.h"
#include "accelerant/communicator.h"
#include "accelerant/data_sharding.h"
#include "accelerant/distributed_env.h"
#include "accelerant/error.h"
#include "accelerant/grad_scaler.h"
#include "accelerant/gradient_buckets.h"
#include "accelerant/launch.h"
#include "accelerant/process_state.h"
#include "accelerant/version.h"
