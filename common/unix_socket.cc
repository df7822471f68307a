#include "common/unix_socket.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace moed {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string mode_text(mode_t mode) { return fmt::format("{:04o}", mode & 07777); }

void make_private_dir(const std::string& dir, const SocketNames& n) {
  if (::mkdir(dir.c_str(), 0700) != 0) {
    if (errno == ENOENT) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(dir).parent_path(), ec);
      if (ec) MOED_THROW(Usage, "{}: cannot create the {} dir {}: {}", n.key, n.what, dir, ec.message());
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
        MOED_THROW(Usage, "{}: cannot create the {} dir {}: {}", n.key, n.what, dir, errno_text(errno));
    } else if (errno != EEXIST) {
      MOED_THROW(Usage, "{}: cannot create the {} dir {}: {}", n.key, n.what, dir, errno_text(errno));
    }
  }
  // lstat, not stat: a symlink planted in a shared dir (/tmp) must not redirect us.
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    MOED_THROW(Runtime, "cannot inspect the {} dir {}: {}", n.what, dir, errno_text(errno));
  if (S_ISLNK(st.st_mode))
    MOED_THROW(Usage, "the {} dir {} is a symbolic link: use a real directory", n.what, dir);
  if (!S_ISDIR(st.st_mode)) MOED_THROW(Usage, "the {} dir {} is not a directory", n.what, dir);
  if (st.st_uid != ::geteuid())
    MOED_THROW(Usage, "the {} dir {} is owned by uid {}, not by this daemon's uid {}", n.what, dir, st.st_uid,
               ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    MOED_THROW(Usage, "the {} dir {} is writable by group or others (mode {}): use a private dir (chmod 700)",
               n.what, dir, mode_text(st.st_mode));
}

sockaddr_un socket_address(const std::string& path, const std::string& what) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    MOED_THROW(Usage, "the {} path {} is too long ({} bytes; at most {})", what, path, path.size(),
               sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// A socket file left by a daemon that died is removed; one a daemon still
// listens on, or a file that is not our socket, is refused.
void remove_stale_socket(const std::string& path, const SocketNames& n) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    MOED_THROW(Runtime, "cannot inspect the {} {}: {}", n.what, path, errno_text(errno));
  }
  if (!S_ISSOCK(st.st_mode))
    MOED_THROW(Usage, "{} exists and is not a socket: remove it or set another {}", path, n.key);
  if (st.st_uid != ::geteuid())
    MOED_THROW(Usage, "the {} {} belongs to uid {}, not to this daemon's uid {}", n.what, path, st.st_uid,
               ::geteuid());
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!probe) MOED_THROW(Runtime, "socket(): {}", errno_text(errno));
  const sockaddr_un addr = socket_address(path, n.what);
  // A non-blocking connect to a Unix socket succeeds or fails at once; EAGAIN
  // means a full backlog, so someone listens.
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 || errno == EAGAIN)
    MOED_THROW(Runtime, "another moed is already listening on the {} {}", n.what, path);
  if (errno != ECONNREFUSED) MOED_THROW(Runtime, "cannot probe the {} {}: {}", n.what, path, errno_text(errno));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    MOED_THROW(Runtime, "cannot remove the stale {} {}: {}", n.what, path, errno_text(errno));
  spdlog::info("{}: removed the stale socket {} of a previous daemon", n.what, path);
}

}  // namespace

ListeningSocket::ListeningSocket(const std::string& dir, const std::string& path, const SocketNames& n)
    : path_(path) {
  make_private_dir(dir, n);
  const sockaddr_un addr = socket_address(path, n.what);
  remove_stale_socket(path, n);
  fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) MOED_THROW(Runtime, "socket(): {}", errno_text(errno));
  if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    MOED_THROW(Runtime, "cannot bind the {} {}: {}", n.what, path, errno_text(errno));
  // Between bind and chmod the file has the umask's mode; the 0700 dir keeps
  // everyone else out meanwhile.
  const bool ok = ::chmod(path.c_str(), 0600) == 0 && ::listen(fd_.get(), SOMAXCONN) == 0;
  const int err = errno;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) dev_ = st.st_dev, ino_ = st.st_ino;
  if (!ok) {
    if (dev_ || ino_) ::unlink(path.c_str());
    MOED_THROW(Runtime, "cannot set up the {} {}: {}", n.what, path, errno_text(err));
  }
}

ListeningSocket::~ListeningSocket() {
  // Only if it is still ours: a newer daemon may have replaced it.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
}

UniqueFd ListeningSocket::accept(int& error) const {
  for (;;) {
    UniqueFd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    error = 0;
    if (fd) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) error = errno;
    return fd;
  }
}

PeerCredentials peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    MOED_THROW(Runtime, "cannot read the peer's credentials: {}", errno_text(errno));
  return {cred.pid, cred.uid};
}

bool peer_may_connect(uid_t uid) { return uid == ::geteuid() || uid == 0; }

UniqueFd connect_unix_socket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    MOED_THROW(Runtime, "cannot connect to {}: the path is too long for a Unix socket", path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) MOED_THROW(Runtime, "socket(): {}", errno_text(errno));
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    const char* hint = err == ENOENT || err == ECONNREFUSED ? " (is moed running, with this socket?)"
                       : err == EACCES                      ? " (the socket is private to the daemon's user)"
                                                            : "";
    MOED_THROW(Runtime, "cannot connect to {}: {}{}", path, errno_text(err), hint);
  }
  return fd;
}

}  // namespace moed
