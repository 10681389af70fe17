#include "track/tracker_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "accelerant/error.h"

namespace accelerant::detail {

AppendFile::~AppendFile() {
  try {
    close();
  } catch (...) {  // a destructor cannot report; close() explicitly to see the error
  }
}

long long AppendFile::open(const std::string& path, bool keep) {
  close();
  fd_ =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (keep ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) {
    throw Error("cannot create the tracker file " + path + ": " + std::strerror(errno) +
                ". Check that project_dir is writable (AcceleratorOptions::project_dir).");
  }
  path_ = path;
  last_flush_ = std::chrono::steady_clock::now();
  const off_t size = ::lseek(fd_, 0, SEEK_END);
  return size > 0 ? static_cast<long long>(size) : 0;
}

void AppendFile::flush() {
  last_flush_ = std::chrono::steady_clock::now();
  if (fd_ < 0 || pending_.empty()) return;
  size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error("cannot write the tracker file " + path_ + ": " + std::strerror(errno) +
                  ". The disk may be full.");
    }
    done += static_cast<size_t>(n);
  }
  pending_.clear();
  ::fsync(fd_);
}

void AppendFile::flush_if_due(std::chrono::steady_clock::duration interval) {
  if (std::chrono::steady_clock::now() - last_flush_ >= interval) flush();
}

void AppendFile::close() {
  if (fd_ < 0) return;
  flush();
  ::close(fd_);
  fd_ = -1;
}

void drop_torn_last_line(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;  // missing (a new run); AppendFile::open reports any other failure
  const off_t end = ::lseek(fd, 0, SEEK_END);
  off_t keep = -1;  // the size to cut to; -1 while unknown
  char block[4096];
  for (off_t at = end; at > 0 && keep < 0;) {
    const off_t start = at > static_cast<off_t>(sizeof block) ? at - sizeof block : 0;
    if (::pread(fd, block, at - start, start) != at - start) break;  // unreadable: leave it
    for (off_t i = at - start; i > 0 && keep < 0; --i) {
      if (block[i - 1] == '\n') keep = start + i;
    }
    at = start;
    if (at == 0 && keep < 0) keep = 0;  // not one whole line
  }
  const bool cut = keep >= 0 && keep < end && ::ftruncate(fd, keep) != 0;
  const int cut_errno = errno;
  ::close(fd);
  if (cut) {
    throw Error("cannot cut the torn last line off the tracker file " + path + ": " +
                std::strerror(cut_errno) + ". Check that the file is writable.");
  }
}

std::string format_scalar(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // std::to_chars without a format is the shortest text that reads back as the same double, in
  // fixed or exponent form, whichever is shorter: 2000 as "2000", not "%g"'s "2e+03".
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  return std::string(text, end);
}

}  // namespace accelerant::detail
