#include "base/uncaught_exception_recorder.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <ctime>
#include <exception>
#include <nlohmann/json.hpp>

namespace accelerant::detail {
namespace {

std::string& error_path() {
  static std::string path;
  return path;
}

std::string& torchelastic_path() {
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

void write_file(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  write_all(fd, text);
  ::close(fd);
}

[[noreturn]] void record_then_terminate() {
  if (auto exception = std::current_exception()) record_exception(exception);
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

void record_exception(std::exception_ptr exception) {
  if (error_path().empty() && torchelastic_path().empty()) return;
  const std::string text = exception_text(exception);
  write_file(error_path(), text);
  // torchrun's failure summary prints "message" as the traceback when it is a string.
  const nlohmann::json record = {{"message", text},
                                 {"timestamp", std::to_string(std::time(nullptr))}};
  write_file(torchelastic_path(),
             record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void record_uncaught_exceptions_to(const std::string& path, const std::string& torchelastic) {
  if (path.empty() && torchelastic.empty()) return;
  error_path() = path;
  torchelastic_path() = torchelastic;
  std::terminate_handler previous = std::set_terminate(record_then_terminate);
  if (previous != record_then_terminate) previous_handler() = previous;
}

}  // namespace accelerant::detail
