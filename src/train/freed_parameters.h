// What a ZeRO-3 sharded block's parameters point at between uses: address space that holds no
// memory and may be neither read nor written (PROT_NONE, reserved without backing). Reading a
// freed parameter there (printing it, saving it, model->to() between steps) would otherwise
// read a null or dangling pointer, crash without a word or return garbage. Here it faults, and a
// SIGSEGV handler that knows these ranges says which parameter was touched and the fix before
// the process dies of the signal as it would have. Private to src/train.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace accelerant::detail {

/// One block's reserved ranges, one per parameter, each as large as the parameter whole; named
/// for the fault handler. Not copyable; unregisters and unmaps itself when destroyed.
class FreedParameters {
 public:
  /// Reserves a range of `bytes[i]` for each parameter `names[i]`; `owner` says whose they are in
  /// the message ("rank 1 of 4"). Throws Error when the address space cannot be reserved.
  FreedParameters(const std::vector<std::string>& names, const std::vector<size_t>& bytes,
                  const std::string& owner);
  ~FreedParameters();
  FreedParameters(const FreedParameters&) = delete;
  FreedParameters& operator=(const FreedParameters&) = delete;

  /// Where parameter `i` points while freed (64-byte aligned).
  void* address(size_t i) const;

  struct Ranges;  // freed_parameters.cpp: the mapping and its registration

 private:
  std::unique_ptr<Ranges> ranges_;
};

}  // namespace accelerant::detail
