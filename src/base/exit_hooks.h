// Work a higher layer wants done when the process ends, registered here so that the layers that
// end processes (a forked worker leaves with _exit, which skips atexit) need not know what it is.
// The metrics report (ACCELERANT_METRICS=1) is the first user.
#pragma once
#include <functional>

namespace accelerant::detail {

/// Registers `hook` to run once when the process ends: at exit(), or at run_exit_hooks() for a
/// process that leaves with _exit. Hooks run in the order they were added. A forked child
/// inherits the hooks its parent had added.
void add_exit_hook(std::function<void()> hook);

/// Runs every hook added so far, once each; for processes about to _exit. Hooks added later, or
/// a second call, run only what has not run yet.
void run_exit_hooks();

}  // namespace accelerant::detail
