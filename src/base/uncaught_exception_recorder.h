// A worker started by a launcher (fork+exec, so not inside accelerant::launch's own try/catch)
// that dies of an uncaught exception would leave only "terminate called ..." in its stderr. This
// records the exception's text in the file the launcher named (ACCELERANT_ERROR_FILE), which the
// launcher's failure report quotes. Installed when the process state is created.
#pragma once
#include <exception>
#include <string>

namespace accelerant::detail {

/// The text of a caught exception for a failure report: what() (without LibTorch's C++
/// backtrace), or a note that the type is not derived from std::exception.
std::string exception_text(std::exception_ptr exception);

/// From now on, an uncaught exception writes its text to `path` before the process terminates
/// as it would have (the previous terminate handler still runs).
void record_uncaught_exceptions_to(const std::string& path);

}  // namespace accelerant::detail
