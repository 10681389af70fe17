#include "accelerant/accelerator_options.h"

#include "accelerant/environment.h"
#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant {

namespace {

// One setting's lookup through the layers, remembering which layer answered.
class Resolver {
 public:
  Resolver(const EnvLookup& env, const ConfigValues& config, std::string config_path,
           AcceleratorSettings& out)
      : env_(env), config_(config), config_path_(std::move(config_path)), out_(out) {}

  // The text of `key` from the environment or config, with the source's name in `from`.
  std::optional<std::string> lower_layers(const std::string& key, const std::string& variable,
                                          const std::string& config_key, std::string& from) const {
    if (auto value = env_(variable); value && !value->empty()) {
      from = variable;
      return value;
    }
    if (auto it = config_.find(config_key); it != config_.end()) {
      from = detail::str(config_path_, " (key ", config_key, ")");
      return it->second;
    }
    return std::nullopt;
  }

  // A setting the launch contract carries (parse_launch_contract already read and checked its
  // variable): the option, else the launcher's value, else the config file.
  template <class T, class Parse>
  void resolve_launched(const char* key, const std::optional<T>& option,
                        const std::optional<T>& launched, const std::string& variable,
                        const std::string& config_key, Parse parse, T& target) {
    if (option) {
      target = *option;
      out_.sources[key] = "option";
    } else if (launched) {
      target = *launched;
      out_.sources[key] = variable;
    } else if (auto it = config_.find(config_key); it != config_.end()) {
      const std::string from = detail::str(config_path_, " (key ", config_key, ")");
      target = parse(it->second, from);
      out_.sources[key] = from;
    }
  }

  template <class T, class Parse>
  void resolve(const char* key, const std::optional<T>& option, const std::string& variable,
               const std::string& config_key, Parse parse, T& target) {
    if (option) {
      target = *option;
      out_.sources[key] = "option";
      return;
    }
    std::string from;
    if (auto text = lower_layers(key, variable, config_key, from)) {
      target = parse(*text, from);
      out_.sources[key] = from;
    }
  }

 private:
  const EnvLookup& env_;
  const ConfigValues& config_;
  std::string config_path_;
  AcceleratorSettings& out_;
};

int64_t parse_positive(const std::string& text, const std::string& from) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 1) return v;
  } catch (const std::exception&) {
  }
  throw Error(detail::str("\"", text, "\" (from ", from, ") is not a whole number of 1 or more. ",
                          "Fix: set it to 1, 2, 4, ..."));
}

uint64_t parse_seed(const std::string& text, const std::string& from) {
  try {
    size_t used = 0;
    const unsigned long long v = std::stoull(text, &used);
    if (used == text.size() && text[0] != '-') return v;
  } catch (const std::exception&) {
  }
  throw Error(detail::str("seed \"", text, "\" (from ", from,
                          ") is not a non-negative whole number. ", "Fix: use e.g. 42."));
}

// The config file's collective_timeout: seconds, already checked by load_config (>= 0.001).
std::chrono::milliseconds parse_config_seconds(const std::string& text, const std::string& from) {
  try {
    size_t used = 0;
    const double seconds = std::stod(text, &used);
    if (used == text.size() && seconds >= 0.001) {
      return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
    }
  } catch (const std::exception&) {
  }
  throw Error(detail::str("\"", text, "\" (from ", from,
                          ") is not a number of seconds of 0.001 or ",
                          "more. Fix: e.g. 1800 for 30 minutes."));
}

}  // namespace

AcceleratorSettings resolve_accelerator_settings(const AcceleratorOptions& o, const EnvLookup& env,
                                                 const ConfigValues& config,
                                                 const std::string& config_path) {
  AcceleratorSettings s;
  Resolver r(env, config, config_path, s);
  // The launch contract is the one reader of the variables a launcher sets.
  const LaunchContract launched = parse_launch_contract(env);
  r.resolve_launched("mixed_precision", o.mixed_precision(), launched.mixed_precision,
                     "ACCELERANT_MIXED_PRECISION", "mixed_precision", parse_mixed_precision,
                     s.mixed_precision);
  r.resolve_launched("downcast_bf16", o.downcast_bf16(), launched.downcast_bf16,
                     "ACCELERANT_DOWNCAST_BF16", "downcast_bf16", parse_bool, s.downcast_bf16);
  if (o.gradient_accumulation_steps() && *o.gradient_accumulation_steps() < 1) {
    parse_positive(std::to_string(*o.gradient_accumulation_steps()),
                   "AcceleratorOptions::gradient_accumulation_steps");
  }
  r.resolve_launched("gradient_accumulation_steps", o.gradient_accumulation_steps(),
                     launched.gradient_accumulation_steps, "ACCELERANT_GRADIENT_ACCUMULATION_STEPS",
                     "gradient_accumulation_steps", parse_positive, s.gradient_accumulation_steps);
  r.resolve("split_batches", o.split_batches(), "ACCELERANT_SPLIT_BATCHES", "split_batches",
            parse_bool, s.split_batches);
  r.resolve("even_batches", o.even_batches(), "ACCELERANT_EVEN_BATCHES", "even_batches", parse_bool,
            s.even_batches);
  r.resolve_launched("cpu", o.cpu(), launched.cpu, "ACCELERANT_USE_CPU", "cpu", parse_bool, s.cpu);
  // The process state's two settings: resolved here once, then handed to ProcessState.
  if (o.collective_timeout() && o.collective_timeout()->count() <= 0) {
    throw Error(detail::str("AcceleratorOptions::collective_timeout is ",
                            o.collective_timeout()->count(),
                            " ms; it must be more than 0. Fix: e.g. std::chrono::minutes(30)."));
  }
  r.resolve_launched("collective_timeout", o.collective_timeout(), launched.collective_timeout,
                     "ACCELERANT_TIMEOUT_MS", "collective_timeout", parse_config_seconds,
                     s.collective_timeout);
  r.resolve_launched("debug", o.debug(), launched.debug, "ACCELERANT_DEBUG_MODE", "debug",
                     parse_bool, s.debug);
  r.resolve("cpu_defaults", o.cpu_defaults(), "ACCELERANT_CPU_DEFAULTS", "cpu_defaults", parse_bool,
            s.cpu_defaults);
  uint64_t seed = 0;
  std::optional<uint64_t> seed_option = o.seed();
  r.resolve("seed", seed_option, "ACCELERANT_SEED", "seed", parse_seed, seed);
  if (s.sources.count("seed")) s.seed = seed;
  return s;
}

}  // namespace accelerant
