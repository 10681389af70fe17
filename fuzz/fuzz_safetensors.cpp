// libFuzzer target: decode_safetensors on arbitrary bytes. It must either throw CheckpointError
// or return contents that survive a round trip (encode, decode again: the same names, dtypes,
// shapes, bytes and metadata). Anything else — another exception, a crash, a sanitizer report, an
// allocation larger than the input warrants — is a bug the fuzzer reports.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "accelerant/error.h"
#include "accelerant/safetensors.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "fuzz_safetensors: " << what << "\n";
  std::abort();
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  const size_t n = static_cast<size_t>(a.numel()) * a.element_size();
  return n == static_cast<size_t>(b.numel()) * b.element_size() &&
         (n == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), n) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  accelerant::SafetensorsContents decoded;
  try {
    decoded = accelerant::decode_safetensors(bytes, "fuzz input");
  } catch (const accelerant::CheckpointError&) {
    return 0;  // rejected with the error the API promises
  }
  const accelerant::SafetensorsContents again =
      accelerant::decode_safetensors(accelerant::encode_safetensors(decoded), "re-encoded input");
  if (again.metadata != decoded.metadata) fail("metadata changed in a round trip");
  if (again.tensors.size() != decoded.tensors.size()) fail("tensor count changed in a round trip");
  for (size_t i = 0; i < decoded.tensors.size(); ++i) {
    const auto& [name, tensor] = decoded.tensors[i];
    const auto& [name2, tensor2] = again.tensors[i];
    if (name != name2 || tensor.scalar_type() != tensor2.scalar_type() ||
        tensor.sizes() != tensor2.sizes() || !same_bytes(tensor, tensor2)) {
      fail("tensor \"" + name + "\" changed in a round trip");
    }
  }
  return 0;
}
