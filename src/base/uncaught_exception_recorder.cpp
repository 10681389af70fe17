#include "base/uncaught_exception_recorder.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <exception>

namespace accelerant::detail {
namespace {

std::string& error_path() {
  static std::string path;
  return path;
}

std::terminate_handler& previous_handler() {
  static std::terminate_handler previous = nullptr;
  return previous;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void record_then_terminate() {
  if (auto exception = std::current_exception()) {
    const std::string text = exception_text(exception);
    const std::string& path = error_path();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      write_all(fd, text);
      ::close(fd);
    }
  }
  if (auto previous = previous_handler()) previous();
  std::abort();
}

}  // namespace

std::string exception_text(std::exception_ptr exception) {
  try {
    std::rethrow_exception(exception);
  } catch (const c10::Error& e) {  // LibTorch's what() carries a C++ backtrace: keep it short
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of a type not derived from std::exception";
  }
}

void record_uncaught_exceptions_to(const std::string& path) {
  if (path.empty()) return;
  error_path() = path;
  std::terminate_handler previous = std::set_terminate(record_then_terminate);
  if (previous != record_then_terminate) previous_handler() = previous;
}

}  // namespace accelerant::detail
