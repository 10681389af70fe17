#include "accelerant/batch.h"

#include <algorithm>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {

namespace {

// data and target are members (the easy case stays a plain field access); every other name lives
// in the list. Null when `name` is neither.
template <class B>
auto* member(B& batch, const std::string& name) {
  return name == "data" ? &batch.data : name == "target" ? &batch.target : nullptr;
}

template <class List>
auto find(List& named, const std::string& name) {
  return std::find_if(named.begin(), named.end(),
                      [&](const auto& item) { return item.first == name; });
}

}  // namespace

bool Batch::has(const std::string& name) const {
  if (const auto* m = member(*this, name)) return m->defined();
  return find(named_, name) != named_.end();
}

const torch::Tensor& Batch::operator[](const std::string& name) const {
  const auto* m = member(*this, name);
  if (m && m->defined()) return *m;
  if (!m) {
    auto it = find(named_, name);
    if (it != named_.end()) return it->second;
  }
  throw Error(detail::str("Batch: no tensor named \"", name, "\"; this batch holds [",
                          detail::join(names(), ", "),
                          "]. Likely cause: a misspelt name, or a dataset or collate that does not "
                          "set it. Fix: use one of those names, or set(\"",
                          name, "\", tensor) where the batch is made."));
}

torch::Tensor& Batch::operator[](const std::string& name) {
  return const_cast<torch::Tensor&>(static_cast<const Batch&>(*this)[name]);
}

Batch& Batch::set(const std::string& name, torch::Tensor tensor) {
  if (name.empty())
    throw Error("Batch::set: the name is empty. Fix: name the tensor, e.g. \"input_ids\".");
  if (auto* m = member(*this, name)) {
    *m = std::move(tensor);
    return *this;
  }
  auto it = find(named_, name);
  if (!tensor.defined()) {
    if (it != named_.end()) named_.erase(it);
  } else if (it != named_.end()) {
    it->second = std::move(tensor);
  } else {
    named_.emplace_back(name, std::move(tensor));
  }
  return *this;
}

std::vector<Batch::Item> Batch::items() const {
  std::vector<Item> out;
  out.reserve(named_.size() + 2);
  if (data.defined()) out.emplace_back("data", data);
  if (target.defined()) out.emplace_back("target", target);
  out.insert(out.end(), named_.begin(), named_.end());
  return out;
}

std::vector<std::string> Batch::names() const {
  std::vector<std::string> out;
  for (auto& item : items()) out.push_back(std::move(item.first));
  return out;
}

std::vector<torch::Tensor> Batch::tensors() const {
  std::vector<torch::Tensor> out;
  for (auto& item : items()) out.push_back(std::move(item.second));
  return out;
}

}  // namespace accelerant
