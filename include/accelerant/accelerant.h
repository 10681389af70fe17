// Accelerant: one LibTorch training loop on one CPU, many processes, GPUs and machines.
// Include this one header; see README.md for the tour and docs/ for each part.
#pragma once

#include "accelerant/accelerator.h"
#include "accelerant/accelerator_options.h"
#include "accelerant/autocast.h"
#include "accelerant/communicator.h"
#include "accelerant/config.h"
#include "accelerant/cpu_settings.h"
#include "accelerant/data_loader.h"
#include "accelerant/data_sharding.h"
#include "accelerant/distributed_env.h"
#include "accelerant/error.h"
#include "accelerant/fused_optimizer.h"
#include "accelerant/grad_scaler.h"
#include "accelerant/gradient_buckets.h"
#include "accelerant/gradient_reducer.h"
#include "accelerant/launch.h"
#include "accelerant/prepared_optimizer.h"
#include "accelerant/process_state.h"
#include "accelerant/training_state.h"
#include "accelerant/version.h"
