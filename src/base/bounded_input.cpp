#include "base/bounded_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/text.h"

namespace accelerant::detail {

std::string nesting_problem(std::string_view text, Syntax syntax, int max_depth) {
  int depth = 0;
  char quote = 0;  // the quote of the string we are in, 0 outside strings
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (comment) {
      comment = c != '\n';
      continue;
    }
    if (quote) {
      if (c == '\\' && quote == '"') {
        ++i;  // the escaped character, whatever it is
      } else if (c == quote) {
        quote = 0;  // YAML's '' inside '...' closes and reopens: the same in effect
      }
      continue;
    }
    if (c == '"') {
      quote = c;
    } else if (syntax == Syntax::kYaml && c == '\'') {
      // In YAML an apostrophe starts a string only where a value can start (not in "it's").
      const char before = i ? text[i - 1] : ' ';
      if (std::strchr(" \t\n\r[{,:-", before)) quote = c;
    } else if (syntax == Syntax::kYaml && c == '#') {
      const char before = i ? text[i - 1] : ' ';
      comment = before == ' ' || before == '\t' || before == '\n' || before == '\r';
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return str("it nests lists and mappings more than ", max_depth, " deep (at byte ", i, ")");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return "";
}

std::optional<nlohmann::json> parse_bounded_json(std::string_view text, std::string* problem,
                                                 int max_depth) {
  *problem = nesting_problem(text, Syntax::kJson, max_depth);
  if (!problem->empty()) return std::nullopt;
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    *problem = str("it is not valid JSON (", e.what(), ")");
    return std::nullopt;
  }
}

}  // namespace accelerant::detail

namespace accelerant {

namespace {

// Opens `path` for reading without waiting on a FIFO, and checks it is a regular file. Returns
// the descriptor (>= 0) and fills st, or -1 with `problem` and `error` set.
int open_regular(const std::string& path, Symlinks symlinks, struct stat& st, std::string& problem,
                 int& error) {
  // O_NONBLOCK: opening a FIFO for reading blocks until a writer comes, before fstat could refuse
  // it (a named pipe as manifest.json or a config hung every reader). Cleared once it is known to
  // be a regular file.
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  if (symlinks == Symlinks::kRefuse) flags |= O_NOFOLLOW;
  const int fd = ::open(path.c_str(), flags);
  error = 0;
  if (fd < 0) {
    error = errno;
    if (error == ENOENT) {
      problem = "it does not exist";
    } else if (error == ELOOP && symlinks == Symlinks::kRefuse) {
      error = 0;
      problem = "it is a symbolic link";
    } else {
      problem = detail::str("it cannot be opened (", std::strerror(error), ")");
    }
    return -1;
  }
  if (::fstat(fd, &st) != 0) {
    error = errno;
    problem = detail::str("it cannot be examined (", std::strerror(error), ")");
  } else if (S_ISDIR(st.st_mode)) {
    error = EISDIR;
    problem = "it is a directory, not a file";
  } else if (!S_ISREG(st.st_mode)) {
    problem = "it is not a regular file (a device, pipe or socket)";
  } else {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
  }
  ::close(fd);
  return -1;
}

}  // namespace

BoundedRead read_bounded_file(const std::string& path, uint64_t max_bytes, Symlinks symlinks) {
  BoundedRead result;
  auto fail = [&](int error, std::string problem) {
    result.error = error;
    result.problem = std::move(problem);
    result.bytes.clear();
    return result;
  };
  struct stat st {};
  std::string problem;
  int error = 0;
  const int fd = open_regular(path, symlinks, st, problem, error);
  if (fd < 0) return fail(error, problem);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return fail(0,
                detail::str("it has ", st.st_size, " bytes, more than the limit of ", max_bytes));
  }
  result.bytes.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  for (;;) {
    if (done == result.bytes.size()) {
      // The file may have grown since fstat: read on in small steps, within the cap.
      if (done >= max_bytes + 1) break;
      result.bytes.resize(std::min<uint64_t>(done + 65536, max_bytes + 1));
    }
    const ssize_t n = ::read(fd, &result.bytes[done], result.bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int read_error = errno;
      return fail(read_error, detail::str("it cannot be read (", std::strerror(read_error), ")"));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (done > max_bytes) {
    return fail(
        0, detail::str("it has more than ", max_bytes, " bytes, the limit (it grew while read)"));
  }
  result.bytes.resize(done);
  return result;
}

BoundedRead read_file_tail(const std::string& path, uint64_t max_bytes, Symlinks symlinks) {
  BoundedRead result;
  struct stat st {};
  const int fd = open_regular(path, symlinks, st, result.problem, result.error);
  if (fd < 0) return result;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t start = size > max_bytes ? size - max_bytes : 0;
  result.bytes.resize(static_cast<size_t>(size - start));
  size_t done = 0;
  while (done < result.bytes.size()) {
    const ssize_t n = ::pread(fd, &result.bytes[done], result.bytes.size() - done,
                              static_cast<off_t>(start + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      result.error = errno;
      result.problem = detail::str("it cannot be read (", std::strerror(result.error), ")");
      result.bytes.clear();
      break;
    }
    if (n == 0) break;  // it shrank
    done += static_cast<size_t>(n);
  }
  if (result.problem.empty()) result.bytes.resize(done);
  ::close(fd);
  return result;
}

std::string said_of(const std::string& subject, const std::string& problem) {
  if (problem.compare(0, 3, "it ") == 0) return subject + problem.substr(2);
  return subject + ": " + problem;
}

}  // namespace accelerant
