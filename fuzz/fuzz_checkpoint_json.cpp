// libFuzzer target: the checkpoint's JSON parsers (manifest.json and state.json) on arbitrary
// text. Each must either throw CheckpointError or return a value whose formatted text parses back
// to the same text (format(parse(format(x))) == format(x)). Any other exception escaping — a
// nlohmann::json type error, std::out_of_range — or a sanitizer report is a bug.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "accelerant/checkpoint.h"
#include "accelerant/error.h"

namespace {

template <class Parse, class Format>
void check_round_trip(const std::string& text, const char* what, Parse parse, Format format) {
  std::string formatted;
  try {
    formatted = format(parse(text, "fuzz input"));
  } catch (const accelerant::CheckpointError&) {
    return;
  }
  if (format(parse(formatted, "formatted input")) != formatted) {
    std::cerr << "fuzz_checkpoint_json: " << what << " changed in a round trip:\n"
              << formatted << "\n";
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  check_round_trip(text, "manifest.json", accelerant::parse_checkpoint_manifest,
                   accelerant::format_checkpoint_manifest);
  check_round_trip(text, "state.json", accelerant::parse_checkpoint_state,
                   accelerant::format_checkpoint_state);
  return 0;
}
