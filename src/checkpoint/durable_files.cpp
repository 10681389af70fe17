#include "checkpoint/durable_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {
namespace {

std::string system_reason(int error) {
  std::string reason = std::strerror(error);
  if (error == ENOSPC || error == EDQUOT) reason += " (the disk or quota is full)";
  if (error == EROFS) reason += " (a read-only file system)";
  if (error == EACCES || error == EPERM) reason += " (no permission)";
  if (error == EFBIG) reason += " (over the file size limit)";
  return reason;
}

[[noreturn]] void fail(const std::string& action, const std::string& path, int error,
                       const std::string& fix) {
  throw CheckpointError(
      str("could not ", action, " ", path, ": ", system_reason(error), ". Fix: ", fix), path);
}

const char* kSpaceFix =
    "free space there (or choose another directory), make sure it is writable, then save again";

}  // namespace

void write_file_durably(const std::string& path, const std::string& bytes,
                        const std::string& what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create " + what, path, errno, kSpaceFix);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      fail(str("write ", what, " (", bytes.size(), " bytes, ", done, " written) to"), path, error,
           kSpaceFix);
    }
    done += static_cast<size_t>(n);
  }
  // Data can fail to reach the disk only at fsync or close (NFS, full thin volumes): both count.
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("flush " + what + " to disk at", path, error, kSpaceFix);
  }
  if (::close(fd) != 0) fail("close " + what + " at", path, errno, kSpaceFix);
}

void replace_file_durably(const std::string& path, const std::string& bytes,
                          const std::string& what) {
  const std::string dir = parent_of(path);
  const std::string tmp = dir + "/." + base_name(path) + ".partial";
  try {
    write_file_durably(tmp, bytes, what);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    fail("rename " + tmp + " to", path, error, kSpaceFix);
  }
  sync_directory(dir);
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open the directory", dir, errno, "check that it exists and is readable");
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // Some file systems (e.g. some FUSE ones) cannot fsync directories; the data files are synced.
  if (rc != 0 && error != EINVAL && error != ENOTSUP)
    fail("flush the directory", dir, error, kSpaceFix);
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("create the directory", dir, ec.value(), kSpaceFix);
}

void remove_tree_quietly(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

void publish_directory(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) {
    sync_directory(parent_of(to));
    return;
  }
  if (errno != ENOTEMPTY && errno != EEXIST) fail("rename " + from + " to", to, errno, kSpaceFix);
  // `to` holds an older checkpoint: swap the two in one step, then remove the old one.
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
    fail("swap " + from + " into place at", to, errno,
         "use a local file system that supports renameat2 (ext4, xfs, btrfs, tmpfs), or save to a "
         "new directory");
  }
  sync_directory(parent_of(to));
  remove_tree_quietly(from);  // now the old checkpoint
  sync_directory(parent_of(to));
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

std::string parent_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

uint32_t crc32_of(const std::string& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // crc32() takes a uInt length
    const size_t chunk = std::min<size_t>(bytes.size() - done, 1u << 30);
    crc =
        ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), static_cast<uInt>(chunk));
    done += chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace accelerant::detail
