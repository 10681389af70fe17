// Every environment variable Accelerant reads, declared once, and the one parser of each kind of
// value that variables (and the config file and options carrying the same settings) hold.
//
// The table (environment_variables()) is the only list: docs/environment.md is generated from it
// (`accelerant env --markdown`, compared by ctest environment.doc_matches_table), `accelerant env`
// prints its variables, and environment_value() refuses a name it does not declare. ctest
// `environment` (scripts/check-environment) fails on a getenv() outside src/base/environment.cpp
// and on a variable name in src/ or tools/ that the table lacks. To read a new variable: add its
// row to the table in src/base/environment.cpp, then regenerate the page.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace accelerant {

/// One row of the table: what a variable holds and who reads it.
struct EnvVariable {
  const char* name;  ///< e.g. "ACCELERANT_METRICS"
  const char* type;  ///< the values it takes, e.g. "bool", "integer ≥ 0", "no | fp16 | bf16"
  const char* default_value;  ///< what applies when it is unset
  const char* meaning;        ///< what it does
  const char* read_by;        ///< the layer and file (or outside program) that reads it
};

/// The table, in documentation order (launch contract first).
const std::vector<EnvVariable>& environment_variables();

/// The row of `name`, or nullptr when the table does not declare it.
const EnvVariable* find_environment_variable(const std::string& name);

/// The one accessor to this process's environment: getenv(name), or std::nullopt when unset (an
/// empty value is returned as ""; callers that treat it as unset say so). Throws Error naming the
/// table when `name` is not declared in it, so that an undeclared read fails in every test that
/// reaches it.
std::optional<std::string> environment_value(const std::string& name);

/// environment_value(name) parsed by parse_bool; std::nullopt when unset or empty.
std::optional<bool> environment_flag(const std::string& name);

/// The one bool parser. Accepted, in any case: 1, true, yes, y, on (true) and 0, false, no, n, off
/// (false): what the environment readers, YAML 1.1's booleans and the config questions took. `from`
/// names where the text came from: a variable's name (then the error is an EnvironmentError for it,
/// reading NAME=value), or a description such as "my.yaml (key cpu)". Anything else throws,
/// naming `from`, the text and the accepted values.
bool parse_bool(const std::string& text, const std::string& from);

/// Autocast precision: kNo (full fp32 precision), kFp16 (CUDA only, with loss scaling) or kBf16
/// (CPU and CUDA autocast). Written "no", "fp16" and "bf16" (parse_mixed_precision).
enum class MixedPrecision { kNo, kFp16, kBf16 };
/// "no", "fp16" or "bf16".
const char* to_string(MixedPrecision precision);

/// The one mixed-precision parser. Accepted, in any case: no (full fp32 precision), fp16 (CUDA
/// only, with loss scaling), bf16 (CPU and CUDA autocast). Nothing else: "fp32" and "none" are
/// refused (with a hint to write no) so that every source of the setting (AcceleratorOptions,
/// LaunchOptions, ACCELERANT_MIXED_PRECISION, the config file, --mixed_precision) takes the same
/// spellings. `from` as for parse_bool.
MixedPrecision parse_mixed_precision(const std::string& text, const std::string& from);

/// What the launcher does when a worker fails, while LaunchOptions::max_restarts allows. Written
/// "restart_group" and "replace_failed_worker" (parse_recovery).
enum class Recovery {
  /// Stops every worker and starts the whole group again (torchrun's way); each process resumes
  /// from the last checkpoint (auto_resume).
  kRestartGroup,
  /// Starts a replacement for the failed worker only, as the group's next generation
  /// (ProcessState::restart_count); the other workers keep running and form the group again with
  /// it (ProcessState::regroup), on one machine or several; a lost machine's workers are replaced
  /// when its launcher comes back (LaunchOptions::rejoin_timeout). The Accelerator recovers a
  /// failed step by itself, and under ZeRO falls back to the last checkpoint (docs/launching.md);
  /// a program without one calls regroup itself.
  kReplaceFailedWorker,
};

/// "restart_group" or "replace_failed_worker".
const char* to_string(Recovery recovery);
/// The one parser of a Recovery (LaunchOptions, the config file's recovery, accelerant launch
/// --recovery): restart_group or replace_failed_worker, in any case. `from` as for parse_bool.
Recovery parse_recovery(const std::string& text, const std::string& from);

/// How many machines a job runs on: between `fewest` and `most` (elastic membership), or exactly
/// `most` when both are equal.
struct MachineCount {
  int fewest = 1;  ///< the fewest machines the job goes on with (LaunchOptions::min_nodes)
  int most = 1;    ///< the machines it starts with and may grow back to (LaunchOptions::num_nodes)
};
/// The one parser of a machine count (accelerant launch --num_nodes / --nnodes): "N" (exactly N)
/// or torchrun's "MIN:MAX" (elastic: 1 <= MIN <= MAX). `from` as for parse_bool.
MachineCount parse_machine_count(const std::string& text, const std::string& from);

}  // namespace accelerant
