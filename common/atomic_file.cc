#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/unique_fd.h"

namespace moed {

AtomicFileWriter::AtomicFileWriter(std::string path, ErrorKind create_error)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)  // MOED_THROW names its kind in the source; this one is the caller's
    throw Error(create_error, fmt::format("{}: cannot create: {}", tmp_, std::strerror(errno)), __FILE__, __LINE__);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::append(const void* data, std::size_t bytes) {
  MOED_CHECK(fd_ >= 0, "{}: append after commit", path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) MOED_THROW(Runtime, "{}: write failed: {}", tmp_, std::strerror(errno));
    p += n;
    bytes -= std::size_t(n);
  }
}

void AtomicFileWriter::commit() {
  MOED_CHECK(fd_ >= 0, "{}: committed twice", path_);
  if (::fsync(fd_) != 0) MOED_THROW(Runtime, "{}: fsync failed: {}", tmp_, std::strerror(errno));
  if (::close(std::exchange(fd_, -1)) != 0)
    MOED_THROW(Runtime, "{}: close failed: {}", tmp_, std::strerror(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    MOED_THROW(Runtime, "cannot rename {} to {}: {}", tmp_, path_, std::strerror(errno));
  committed_ = true;
  // Make the rename itself durable; a failure here leaves a complete file, so it is ignored.
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  UniqueFd dfd(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd) ::fsync(dfd.get());
}

void write_file_atomically(const std::string& path, std::string_view content) {
  AtomicFileWriter out(path);
  out.append(content);
  out.commit();
}

}  // namespace moed
