// Slurm's hostlist expressions (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST): the compact form in
// which Slurm names the machines of a job, expanded by our own parser so that a worker started by
// srun can find the machine of rank 0 without calling `scontrol show hostnames`.
//
// The grammar, as Slurm writes it: comma-separated groups (commas inside brackets belong to the
// brackets); a group is literal text with any number of bracket sets; a bracket set is a
// comma-separated list of numbers and ranges "lo-hi" (lo ≤ hi). Numbers keep the width of the
// range's lower bound, so n[008-010] is n008 n009 n010 and n[8-10] is n8 n9 n10. Several bracket
// sets in one group expand as a cartesian product with the first set varying slowest:
// a[1-2]-b[3-4] is a1-b3 a1-b4 a2-b3 a2-b4. Empty groups (a trailing comma) are skipped, as
// Slurm does; duplicates are kept.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace accelerant::detail {

/// More hosts than any cluster has: an expression that expands to more is refused rather than
/// expanded (it is a typo, and would take the memory of a million names).
constexpr std::size_t kMaxSlurmHosts = 1000000;

/// The host names of `text`, in Slurm's order. `variable` names where the text came from, for the
/// error: bad input (empty, an unclosed or stray bracket, a reversed or non-numeric range, more
/// than kMaxSlurmHosts hosts) throws EnvironmentError naming the variable, its value, what is
/// wrong and the fix.
std::vector<std::string> expand_slurm_hostlist(const std::string& text,
                                               const std::string& variable);

}  // namespace accelerant::detail
