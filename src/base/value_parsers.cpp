// The one parser per kind of setting value (environment.h): the environment, the config file,
// the options and the CLI's flags all call these, so a spelling accepted in one is accepted in all.
#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {
namespace {

// A variable reads NAME=value (and its error is an EnvironmentError for it); any other source
// (a config key, an option) reads "value" (from SOURCE).
[[noreturn]] void refuse(const std::string& text, const std::string& from, const std::string& what,
                         const std::string& accepted, const std::string& fix) {
  if (find_environment_variable(from) != nullptr) {
    throw EnvironmentError(from, text,
                           detail::str(from, "=", text, " is ", what, ". Accepted: ", accepted,
                                       ". Fix: ", fix, " (or unset ", from, ")."));
  }
  throw Error(detail::str("\"", text, "\" (from ", from, ") is ", what, ". Accepted: ", accepted,
                          ". Fix: ", fix, "."));
}

}  // namespace

bool parse_bool(const std::string& text, const std::string& from) {
  const std::string v = detail::lower(text);
  if (v == "1" || v == "true" || v == "yes" || v == "y" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "n" || v == "off") return false;
  refuse(text, from, "not a boolean", "1, true, yes, y, on or 0, false, no, n, off, in any case",
         "use one of them, e.g. 1 or 0");
}

const char* to_string(MixedPrecision precision) {
  switch (precision) {
    case MixedPrecision::kNo:
      return "no";
    case MixedPrecision::kFp16:
      return "fp16";
    case MixedPrecision::kBf16:
      return "bf16";
  }
  return "unknown";
}

const char* to_string(Recovery recovery) {
  switch (recovery) {
    case Recovery::kRestartGroup:
      return "restart_group";
    case Recovery::kReplaceFailedWorker:
      return "replace_failed_worker";
  }
  return "unknown";
}

Recovery parse_recovery(const std::string& text, const std::string& from) {
  const std::string v = detail::lower(text);
  if (v == "restart_group") return Recovery::kRestartGroup;
  if (v == "replace_failed_worker") return Recovery::kReplaceFailedWorker;
  refuse(text, from, "not a known recovery", "restart_group or replace_failed_worker",
         "use restart_group (every worker restarts from the last checkpoint) or "
         "replace_failed_worker (only the failed one is replaced; the others go on)");
}

MachineCount parse_machine_count(const std::string& text, const std::string& from) {
  const auto whole = [](const std::string& part, int& out) {
    if (part.empty() || part.size() > 6 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return false;
    out = std::stoi(part);
    return out >= 1;
  };
  MachineCount count;
  const size_t colon = text.find(':');
  const bool read =
      colon == std::string::npos
          ? whole(text, count.most) && whole(text, count.fewest)
          : whole(text.substr(0, colon), count.fewest) && whole(text.substr(colon + 1), count.most);
  if (!read || count.fewest > count.most) {
    refuse(text, from,
           read ? "a range whose fewest machines exceed its most" : "not a machine count",
           "N (exactly N machines) or MIN:MAX (elastic: at least MIN, at most MAX), whole numbers "
           "from 1 with MIN <= MAX",
           "write e.g. 2, or 1:2 to go on with one machine when the other is lost");
  }
  return count;
}

MixedPrecision parse_mixed_precision(const std::string& text, const std::string& from) {
  const std::string v = detail::lower(text);
  if (v == "no") return MixedPrecision::kNo;
  if (v == "fp16") return MixedPrecision::kFp16;
  if (v == "bf16") return MixedPrecision::kBf16;
  refuse(text, from,
         v == "fp32" || v == "none" ? "not a mixed precision (full precision is written no)"
                                    : "not a known mixed precision",
         "no (full precision), fp16 (CUDA only) or bf16 (CPU or CUDA), in any case",
         "use no, fp16 or bf16");
}

}  // namespace accelerant
