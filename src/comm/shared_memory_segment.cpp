#include "comm/shared_memory_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {
namespace {

std::string random_nonce() {
  std::random_device device;
  return str(std::hex, device(), device());
}

// Maps `bytes` of the open segment `fd` and closes `fd` (the mapping keeps the memory).
void* map_and_close(int fd, size_t bytes) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (data == MAP_FAILED) {
    throw Error(
        str("cannot map ", bytes, " bytes of the shared-memory segment: ", std::strerror(map_error),
            ". Likely cause: the address space or memory lock limits. Fix: raise them, or set ",
            "ACCELERANT_SHM_ALLREDUCE=0 to reduce through Gloo only."));
  }
  return data;
}

}  // namespace

SharedMemorySegment::~SharedMemorySegment() {
  unlink();
  if (data_ != nullptr) ::munmap(data_, size_);
}

SharedMemorySegment::SharedMemorySegment(SharedMemorySegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      linked_(std::exchange(other.linked_, false)) {}

SharedMemorySegment& SharedMemorySegment::operator=(SharedMemorySegment&& other) noexcept {
  if (this != &other) {
    this->~SharedMemorySegment();
    new (this) SharedMemorySegment(std::move(other));
  }
  return *this;
}

SharedMemorySegment SharedMemorySegment::create(size_t bytes) {
  remove_stale_segments();
  SharedMemorySegment segment;
  segment.name_ = str(kNamePrefix, ::getpid(), "-", random_nonce());
  const int fd = ::shm_open(segment.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(str("cannot create the shared-memory segment /dev/shm", segment.name_, ": ",
                    std::strerror(errno), ". Fix: make /dev/shm writable, or set ",
                    "ACCELERANT_SHM_ALLREDUCE=0 to reduce through Gloo only."));
  }
  segment.linked_ = true;
  // posix_fallocate returns the error instead of setting errno.
  const int reserve_error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (reserve_error != 0) {
    ::close(fd);
    throw Error(str("cannot reserve ", bytes,
                    " bytes in /dev/shm for the shared-memory all-reduce: ",
                    std::strerror(reserve_error), ". Likely cause: /dev/shm is full or small ",
                    "(a container's default is 64 MB). Fix: enlarge it (docker --shm-size), ",
                    "lower ACCELERANT_SHM_CHUNK_BYTES, or set ACCELERANT_SHM_ALLREDUCE=0."));
  }
  segment.data_ = map_and_close(fd, bytes);
  segment.size_ = bytes;
  return segment;
}

SharedMemorySegment SharedMemorySegment::open(const std::string& name, size_t bytes) {
  SharedMemorySegment segment;
  segment.name_ = name;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(
        str("cannot open the shared-memory segment /dev/shm", name, " that the first rank ",
            "of this machine created: ", std::strerror(errno), ". Likely cause: the ",
            "processes do not share /dev/shm (separate containers) or run as other users. Fix: run "
            "the ",
            "ranks of a machine in one container as one user, or set ACCELERANT_SHM_ALLREDUCE=0."));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) < bytes) {
    ::close(fd);
    throw Error(str("the shared-memory segment /dev/shm", name, " is smaller than the ", bytes,
                    " bytes expected. Likely cause: the ranks run different Accelerant builds. "
                    "Fix: start every rank ",
                    "from the same build."));
  }
  segment.data_ = map_and_close(fd, bytes);
  segment.size_ = bytes;
  return segment;
}

void SharedMemorySegment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

int remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string prefix = std::string(SharedMemorySegment::kNamePrefix).substr(1);
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      removed += ::shm_unlink(("/" + name).c_str()) == 0 ? 1 : 0;
    }
  }
  ::closedir(dir);
  return removed;
}

}  // namespace accelerant::detail
