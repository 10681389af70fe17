// AcceleratorOptions::auto_resume's one way into the training loop. The Accelerator arms the hook
// once its first loader is prepared (loading needs every object prepared first); a prepared
// loader's begin(), the start of an epoch's `for`, fires it. Nothing else does: a loader's getters
// (epoch, position, size) never load a checkpoint or talk to other ranks.
#pragma once
#include <functional>
#include <utility>

namespace accelerant::detail {

class ResumeHook {
 public:
  /// `resume` runs at the next fire(), once.
  void arm(std::function<void()> resume) { resume_ = std::move(resume); }
  /// An explicit load_state replaces the pending resume; a destroyed Accelerator cannot run it.
  void disarm() { resume_ = nullptr; }
  /// Runs the armed resume, if any, exactly once: it is disarmed before it runs, so a resume that
  /// throws is not retried by the next loop.
  void fire() {
    if (!resume_) return;
    auto resume = std::move(resume_);
    resume_ = nullptr;
    resume();
  }

 private:
  std::function<void()> resume_;
};

}  // namespace accelerant::detail
