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
#include <vector>

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

DurableFileWriter::DurableFileWriter(std::string path, std::string what, bool replace)
    : path_(std::move(path)), target_(path_), what_(std::move(what)) {
  if (replace) path_ = parent_of(target_) + "/." + base_name(target_) + ".partial";
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("create " + what_, path_, errno, kSpaceFix);
}

DurableFileWriter::~DurableFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && path_ != target_) ::unlink(path_.c_str());  // a replacement half written
}

void DurableFileWriter::append(const void* data, size_t bytes) {
  const char* at = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, at + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(
          str("write ", what_, " (", written_ + bytes, " bytes, ", written_ + done, " written) to"),
          path_, n < 0 ? errno : ENOSPC, kSpaceFix);
    }
    done += static_cast<size_t>(n);
  }
  crc32_ = crc32_extend(crc32_, at, bytes);
  written_ += bytes;
}

void DurableFileWriter::commit() {
  // Data can fail to reach the disk only at fsync or close (NFS, full thin volumes): both count.
  if (::fsync(fd_) != 0) fail("flush " + what_ + " to disk at", path_, errno, kSpaceFix);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close " + what_ + " at", path_, errno, kSpaceFix);
  if (path_ != target_ && ::rename(path_.c_str(), target_.c_str()) != 0) {
    fail("rename " + path_ + " to", target_, errno, kSpaceFix);
  }
  committed_ = true;
  if (path_ != target_) sync_directory(parent_of(target_));
}

uint32_t write_file_durably(const std::string& path, const std::string& bytes,
                            const std::string& what) {
  DurableFileWriter file(path, what, /*replace=*/false);
  file.append(bytes.data(), bytes.size());
  file.commit();
  return file.crc32();
}

void replace_file_durably(const std::string& path, const std::string& bytes,
                          const std::string& what) {
  DurableFileWriter file(path, what, /*replace=*/true);
  file.append(bytes.data(), bytes.size());
  file.commit();
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

uint32_t crc32_extend(uint32_t crc, const void* data, size_t bytes) {
  const Bytef* at = static_cast<const Bytef*>(data);
  uLong sum = crc;
  size_t done = 0;
  while (done < bytes) {  // crc32() takes a uInt length
    const size_t chunk = std::min<size_t>(bytes - done, 1u << 30);
    sum = ::crc32(sum, at + done, static_cast<uInt>(chunk));
    done += chunk;
  }
  return static_cast<uint32_t>(sum);
}

uint32_t crc32_of(const std::string& bytes) { return crc32_extend(0, bytes.data(), bytes.size()); }

bool crc32_of_file(const std::string& path, uint32_t* crc) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::vector<char> buffer(1u << 20);
  uint32_t sum = 0;
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    sum = crc32_extend(sum, buffer.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  *crc = sum;
  return true;
}

}  // namespace accelerant::detail
