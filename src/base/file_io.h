// Whole-file reads and crash-safe writes, shared by the launcher (results, error files), the
// Accelerator's save() and the config file.
#pragma once
#include <string>

namespace accelerant::detail {

/// Writes `bytes` to `path` through `path`.tmp and a rename, so that a reader never sees half a
/// file and a failure leaves the previous file. Returns false (and removes the temporary file)
/// when writing or renaming fails.
bool write_file_atomically(const std::string& path, const std::string& bytes);

/// The file's bytes; empty when it cannot be read or is not a regular file (a FIFO is refused at
/// once, not waited on).
std::string read_file(const std::string& path);

/// A /proc file's bytes (up to 64 KiB); empty when it cannot be read. Never throws: a process can
/// exit between the open and the read, which fails with ESRCH, and libstdc++'s filebuf throws
/// std::ios_failure on such a read error whatever the stream's exception mask says.
std::string read_proc_file(const std::string& path);

}  // namespace accelerant::detail
