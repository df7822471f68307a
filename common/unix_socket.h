// A private Unix stream socket in a directory of its own: the admin socket
// and the front door's socket are both made this way. The directory is ours
// and closed to group and others (mode 0700, no symbolic link), a socket
// left by a dead daemon is replaced, one a live daemon listens on is
// refused, and the socket itself has mode 0600. Peers are checked by uid
// (SO_PEERCRED) on accept.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/unique_fd.h"

namespace moed {

// `what` names the socket in messages ("admin socket"), `key` the config key
// of its directory ("[admin].dir").
struct SocketNames {
  std::string what, key;
};

// A listening socket at `path` inside `dir` (created if missing). Throws a
// moed::Error naming the path: Usage when the dir or path is unusable,
// Runtime when another daemon listens there or a system call fails. The
// destructor removes the socket file if it is still the one bound here.
class ListeningSocket {
 public:
  ListeningSocket(const std::string& dir, const std::string& path, const SocketNames& names);
  ~ListeningSocket();
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // The next pending connection (non-blocking, close-on-exec), or an empty
  // fd: `error` is then 0 when none is pending, else the errno (EMFILE and
  // the like: the caller should stop accepting for a while, since the
  // socket stays readable). Interrupted and aborted accepts are retried.
  UniqueFd accept(int& error) const;

 private:
  std::string path_;
  UniqueFd fd_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// The peer of a connected Unix socket.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
};
// Throws Runtime when the kernel does not tell.
PeerCredentials peer_credentials(int fd);
// This daemon's uid and root may use its sockets.
bool peer_may_connect(uid_t uid);

// Connects to the Unix socket at `path` (blocking, close-on-exec). Throws a
// moed::Error (Runtime) saying why it could not, with a hint for the usual
// causes (no daemon there, no permission).
UniqueFd connect_unix_socket(const std::string& path);

}  // namespace moed
