#include "base/file_io.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace accelerant::detail {

bool write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    written = static_cast<bool>(
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())).flush());
  }
  if (written && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.c_str());
  return false;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

}  // namespace accelerant::detail
