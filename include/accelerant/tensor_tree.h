// Tensors inside nested containers, as Accelerate's send_to_device / recursively_apply and
// Fabric's apply_to_collection treat them: one call moves or maps every tensor of a batch,
// whatever its structure.
//
//   std::map<std::string, std::vector<torch::Tensor>> features = ...;
//   auto on_gpu = accelerant::send_to_device(features, torch::kCUDA, /*non_blocking=*/true);
//   auto halves = accelerant::apply_to_tensors(batch, [](const torch::Tensor& t) {
//     return t.is_floating_point() ? t.to(torch::kHalf) : t;
//   });
//
// Understood: torch::Tensor, accelerant::Batch, std::vector, std::array, std::map (over its
// values), std::pair, std::tuple, std::optional, nested in any way. Numbers, enums and strings
// pass through unchanged. An undefined tensor is left as it is and not visited. Any other type is
// refused at compile time: specialise accelerant::TensorTree<T> for it (the same two functions as
// the specialisations below) and it joins in.
#pragma once
#include <torch/types.h>

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accelerant/batch.h"

namespace accelerant {

namespace detail {
template <class T>
constexpr bool tensor_tree_unknown_v = false;
}  // namespace detail

/// How apply_to_tensors and for_each_tensor see inside a T: `static T apply(const T&, F&)` (a
/// copy with every tensor t replaced by fn(t)) and `static void visit(const T&, F&)` (fn(t) on
/// every tensor, in a fixed order). Specialise it for your own types.
template <class T, class Enable = void>
struct TensorTree {
  static_assert(detail::tensor_tree_unknown_v<T>,
                "accelerant::apply_to_tensors / send_to_device / for_each_tensor: this type is "
                "neither a tensor, a Batch, a standard container of them nor a number or string. "
                "Fix: specialise accelerant::TensorTree<YourType> with apply() and visit() "
                "(see tensor_tree.h), or pass the tensors in a std::vector or std::map.");
};

/// A copy of `value` in which every defined tensor t is replaced by fn(t) (fn: const Tensor& ->
/// Tensor); the structure, the names and everything that is not a tensor stay as they were.
template <class T, class F>
T apply_to_tensors(const T& value, F&& fn) {
  return TensorTree<T>::apply(value, fn);
}

/// Calls fn(t) (fn: const Tensor& -> anything) on every defined tensor of `value`, in a fixed
/// order (containers in their order, a Batch in items() order): the same order on every rank.
template <class T, class F>
void for_each_tensor(const T& value, F&& fn) {
  TensorTree<T>::visit(value, fn);
}

/// A copy of `value` with every tensor on `device` (Tensor::to; a tensor already there is not
/// copied). `non_blocking`: an asynchronous copy where the source allows it (pinned memory to a
/// GPU); the device's stream orders it before later work on it.
template <class T>
T send_to_device(const T& value, torch::Device device, bool non_blocking = false) {
  return apply_to_tensors(value,
                          [&](const torch::Tensor& t) { return t.to(device, non_blocking); });
}

/// The leaves: a tensor is mapped when defined.
template <>
struct TensorTree<torch::Tensor> {
  /// fn(t), or t itself when undefined.
  template <class F>
  static torch::Tensor apply(const torch::Tensor& t, F& fn) {
    return t.defined() ? torch::Tensor(fn(t)) : t;
  }
  /// fn(t) when t is defined.
  template <class F>
  static void visit(const torch::Tensor& t, F& fn) {
    if (t.defined()) fn(t);
  }
};

/// Numbers, enums and strings pass through untouched (as in Accelerate's recursively_apply).
template <class T>
struct TensorTree<T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T> ||
                                      std::is_same_v<T, std::string>>> {
  /// `value` itself.
  template <class F>
  static T apply(const T& value, F&) {
    return value;
  }
  /// Nothing to visit.
  template <class F>
  static void visit(const T&, F&) {}
};

/// A Batch: every tensor of items(), keeping the names and their order.
template <>
struct TensorTree<Batch> {
  /// A Batch with the same names, each tensor mapped.
  template <class F>
  static Batch apply(const Batch& batch, F& fn) {
    Batch out;
    for (const auto& [name, tensor] : batch.items()) out.set(name, fn(tensor));
    return out;
  }
  /// fn on each tensor in items() order.
  template <class F>
  static void visit(const Batch& batch, F& fn) {
    for (const auto& item : batch.items()) fn(item.second);
  }
};

/// A vector: each element, in order.
template <class T, class A>
struct TensorTree<std::vector<T, A>> {
  /// Each element mapped.
  template <class F>
  static std::vector<T, A> apply(const std::vector<T, A>& values, F& fn) {
    std::vector<T, A> out;
    out.reserve(values.size());
    for (const auto& v : values) out.push_back(TensorTree<T>::apply(v, fn));
    return out;
  }
  /// Each element in order.
  template <class F>
  static void visit(const std::vector<T, A>& values, F& fn) {
    for (const auto& v : values) TensorTree<T>::visit(v, fn);
  }
};

/// An array: each element, in order.
template <class T, std::size_t N>
struct TensorTree<std::array<T, N>> {
  /// Each element mapped.
  template <class F>
  static std::array<T, N> apply(const std::array<T, N>& values, F& fn) {
    std::array<T, N> out;
    for (std::size_t i = 0; i < N; ++i) out[i] = TensorTree<T>::apply(values[i], fn);
    return out;
  }
  /// Each element in order.
  template <class F>
  static void visit(const std::array<T, N>& values, F& fn) {
    for (const auto& v : values) TensorTree<T>::visit(v, fn);
  }
};

/// A map: each value, in key order; the keys are kept as they are.
template <class K, class V, class C, class A>
struct TensorTree<std::map<K, V, C, A>> {
  /// Each value mapped.
  template <class F>
  static std::map<K, V, C, A> apply(const std::map<K, V, C, A>& values, F& fn) {
    std::map<K, V, C, A> out;
    for (const auto& [key, v] : values) out.emplace(key, TensorTree<V>::apply(v, fn));
    return out;
  }
  /// Each value in key order.
  template <class F>
  static void visit(const std::map<K, V, C, A>& values, F& fn) {
    for (const auto& item : values) TensorTree<V>::visit(item.second, fn);
  }
};

/// A pair: first, then second.
template <class A, class B>
struct TensorTree<std::pair<A, B>> {
  /// Both mapped.
  template <class F>
  static std::pair<A, B> apply(const std::pair<A, B>& value, F& fn) {
    return {TensorTree<A>::apply(value.first, fn), TensorTree<B>::apply(value.second, fn)};
  }
  /// First, then second.
  template <class F>
  static void visit(const std::pair<A, B>& value, F& fn) {
    TensorTree<A>::visit(value.first, fn);
    TensorTree<B>::visit(value.second, fn);
  }
};

/// A tuple: each element, in order.
template <class... Ts>
struct TensorTree<std::tuple<Ts...>> {
  /// Each element mapped (evaluated in order: braced initialisation).
  template <class F>
  static std::tuple<Ts...> apply(const std::tuple<Ts...>& value, F& fn) {
    return std::apply(
        [&](const Ts&... parts) { return std::tuple<Ts...>{TensorTree<Ts>::apply(parts, fn)...}; },
        value);
  }
  /// Each element in order.
  template <class F>
  static void visit(const std::tuple<Ts...>& value, F& fn) {
    std::apply([&](const Ts&... parts) { (TensorTree<Ts>::visit(parts, fn), ...); }, value);
  }
};

/// An optional: its value when it has one.
template <class T>
struct TensorTree<std::optional<T>> {
  /// The value mapped, or nullopt.
  template <class F>
  static std::optional<T> apply(const std::optional<T>& value, F& fn) {
    if (!value) return std::nullopt;
    return TensorTree<T>::apply(*value, fn);
  }
  /// The value, when there is one.
  template <class F>
  static void visit(const std::optional<T>& value, F& fn) {
    if (value) TensorTree<T>::visit(*value, fn);
  }
};

}  // namespace accelerant
