#include "train/freed_parameters.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {

struct FreedParameters::Ranges {
  char* base = nullptr;
  size_t size = 0;
  std::vector<size_t> offsets;  // each parameter's start in the mapping, and the end last
  std::vector<std::string> names;
  std::string owner;
  int slot = -1;  // in the registry
};

namespace {

// The registry the fault handler reads: a fixed array of pointers, so that the handler neither
// allocates nor locks. Registration takes a mutex; the handler only loads.
constexpr int kRegistrySlots = 4096;  // blocks alive at once
std::atomic<const FreedParameters::Ranges*> registry[kRegistrySlots];
std::mutex registry_mutex;
struct sigaction previous_action;
bool handler_installed = false;

void write_text(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n, left -= static_cast<size_t>(n);
  }
}

// Async-signal-safe: names the parameter a fault landed in, if any is ours, then gives the
// signal back to whoever had it (the default action: the process dies of SIGSEGV).
void on_fault(int signal, siginfo_t* info, void* context) {
  const char* address = static_cast<const char*>(info->si_addr);
  for (const auto& entry : registry) {
    const FreedParameters::Ranges* r = entry.load(std::memory_order_acquire);
    if (r == nullptr || address < r->base || address >= r->base + r->size) continue;
    size_t i = 0;
    while (i + 1 < r->names.size() && address >= r->base + r->offsets[i + 1]) ++i;
    write_text("\naccelerant: ");
    write_text(r->owner.c_str());
    write_text(": parameter '");
    write_text(r->names[i].c_str());
    write_text(
        "' of a ZeRO stage 3 sharded block was read or written outside the block's forward and "
        "backward, where it holds no memory (this process keeps only its share of it). Likely "
        "cause: the model's parameters were printed, saved, copied, moved or cast between steps. "
        "Fix: do it inside accelerant::GatheredParameters (which makes every block whole while "
        "it lives), build, move and cast the model before prepare, and change its parameters "
        "only through the optimizer.\n");
    break;
  }
  // Not ours, or said: the previous disposition takes the fault, as if we were not here.
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction != nullptr) {
      previous_action.sa_sigaction(signal, info, context);
      return;
    }
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal);
    return;
  }
  ::signal(signal, SIG_DFL);  // returning re-runs the access, which now kills the process
}

void install_handler_locked() {
  if (handler_installed) return;
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (::sigaction(SIGSEGV, &action, &previous_action) == 0) handler_installed = true;
}

constexpr size_t kAlignment = 64;

}  // namespace

FreedParameters::FreedParameters(const std::vector<std::string>& names,
                                 const std::vector<size_t>& bytes, const std::string& owner)
    : ranges_(std::make_unique<Ranges>()) {
  Ranges& r = *ranges_;
  r.names = names;
  r.owner = owner;
  for (size_t b : bytes) {
    r.offsets.push_back(r.size);
    r.size += std::max<size_t>(kAlignment, (b + kAlignment - 1) / kAlignment * kAlignment);
  }
  r.offsets.push_back(r.size);
  void* base = ::mmap(nullptr, std::max<size_t>(r.size, 1), PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    throw Error(str("Sharded::shard: reserving ", r.size,
                    " bytes of address space for the "
                    "freed parameters failed (",
                    std::strerror(error),
                    "). Fix: raise the "
                    "address-space limit (ulimit -v)."));
  }
  r.base = static_cast<char*>(base);
  std::lock_guard<std::mutex> lock(registry_mutex);
  install_handler_locked();
  for (int s = 0; s < kRegistrySlots; ++s) {
    if (registry[s].load() == nullptr) {
      r.slot = s;
      registry[s].store(ranges_.get(), std::memory_order_release);
      break;
    }
  }
  // With every slot taken the ranges still hold no memory; a fault there is only not named.
}

FreedParameters::~FreedParameters() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (ranges_->slot >= 0) registry[ranges_->slot].store(nullptr, std::memory_order_release);
  }
  ::munmap(ranges_->base, std::max<size_t>(ranges_->size, 1));
}

void* FreedParameters::address(size_t i) const { return ranges_->base + ranges_->offsets[i]; }

}  // namespace accelerant::detail
