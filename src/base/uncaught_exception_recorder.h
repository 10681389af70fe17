// A worker started by a launcher (fork+exec, so not inside accelerant::launch's own try/catch)
// that dies of an exception would leave only "terminate called ..." in its stderr. This records
// the exception's text in the files the launcher named, which its failure report quotes:
// ACCELERANT_ERROR_FILE (plain text, for Accelerant's launchers) and TORCHELASTIC_ERROR_FILE (JSON,
// torchrun's @record contract: {"message": text, "timestamp": seconds}). Installed when the
// process state is created, and by accelerant::launch when it runs in place under a launcher.
#pragma once
#include <exception>
#include <string>

namespace accelerant::detail {

/// The text of a caught exception for a failure report: what() (without LibTorch's C++
/// backtrace), or a note that the type is not derived from std::exception.
std::string exception_text(std::exception_ptr exception);

/// From now on, an uncaught exception writes its text to `path` (plain text) and to
/// `torchelastic_path` (torchrun's JSON) before the process terminates as it would have (the
/// previous terminate handler still runs). An empty path is not written.
void record_uncaught_exceptions_to(const std::string& path,
                                   const std::string& torchelastic_path = "");

/// Writes `exception` to the files record_uncaught_exceptions_to named, now (for an exception
/// about to end the process through another path, e.g. caught by main and turned into an exit
/// status).
void record_exception(std::exception_ptr exception);

}  // namespace accelerant::detail
