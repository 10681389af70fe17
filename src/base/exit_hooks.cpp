#include "base/exit_hooks.h"

#include <cstdlib>
#include <mutex>
#include <vector>

namespace accelerant::detail {
namespace {

struct ExitHooks {
  std::mutex mutex;
  std::vector<std::function<void()>> hooks;
  size_t next_to_run = 0;
  bool atexit_installed = false;
};

ExitHooks& exit_hooks() {
  static ExitHooks* hooks = new ExitHooks();  // never destroyed: it runs during exit
  return *hooks;
}

}  // namespace

void add_exit_hook(std::function<void()> hook) {
  ExitHooks& h = exit_hooks();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.hooks.push_back(std::move(hook));
  if (!h.atexit_installed) {
    h.atexit_installed = true;
    std::atexit([] { run_exit_hooks(); });
  }
}

void run_exit_hooks() {
  ExitHooks& h = exit_hooks();
  for (;;) {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(h.mutex);
      if (h.next_to_run >= h.hooks.size()) return;
      hook = h.hooks[h.next_to_run++];
    }
    hook();  // outside the lock: a hook may add another
  }
}

}  // namespace accelerant::detail
