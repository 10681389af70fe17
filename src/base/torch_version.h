// What this build knows of the LibTorch it was compiled against, without linking it
// (torch/version.h is macros only): the LibTorch-free core (version.cpp) answers for the launcher.
#pragma once

namespace accelerant::detail {

/// Whether the workers' c10d::TCPStore clients speak the protocol of the launcher's own store
/// server (launch/job_store.h: LibTorch 1.x). LibTorch 2.x changed it; then the launcher leaves
/// hosting the store to rank 0's c10d server, as torchrun without its agent store does.
bool workers_speak_agent_store_protocol();

}  // namespace accelerant::detail
