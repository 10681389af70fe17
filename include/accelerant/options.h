// The one way Accelerant's options structs declare an option: a getter and a chainable setter over
// a private member, as LibTorch's TORCH_ARG makes them (torch/arg.h), so that
// `AcceleratorOptions().zero_stage(2).cpu(true)` reads like LibTorch's own options, without this
// LibTorch-free header needing LibTorch.
#pragma once

#include <utility>

/// Declares option `name` of type `T` in an options struct: `name(value)` sets it and returns the
/// struct (to chain), `name()` reads it, and the member `name_` holds it. Write its default after
/// the macro: `ACCELERANT_OPTION(int, zero_stage) = 0;`. Leaves the struct's access private.
#define ACCELERANT_OPTION(T, name)                                \
 public:                                                          \
  inline auto name(const T& new_##name)->decltype(*this) {        \
    this->name##_ = new_##name;                                   \
    return *this;                                                 \
  }                                                               \
  inline auto name(T&& new_##name)->decltype(*this) {             \
    this->name##_ = std::move(new_##name);                        \
    return *this;                                                 \
  }                                                               \
  inline const T& name() const noexcept { return this->name##_; } \
  inline T& name() noexcept { return this->name##_; }             \
                                                                  \
 private:                                                         \
  T name##_
