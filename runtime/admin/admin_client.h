// The client side of the admin socket: a connection that sends request lines
// and reads answer lines, each within a deadline, and moectl's whole run
// (request, rendering, following a migration to its end) on top of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "runtime/admin/moectl_format.h"
#include "runtime/admin/protocol.h"
#include "common/unique_fd.h"

namespace moed::runtime::admin {

// No daemon could be reached or it stopped answering: a missing socket, a
// refused connection, a timeout, a connection lost (moectl's exit code 3).
class ConnectError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The daemon closed the connection (or reset it): it stopped, unlike a
// timeout, where it may be busy.
class ConnectionLost : public ConnectError {
 public:
  using ConnectError::ConnectError;
};

class AdminClient {
 public:
  using Millis = std::chrono::milliseconds;

  // Connects to the socket at `path`, waiting up to `timeout` while the
  // daemon's backlog is full. Throws ConnectError.
  static AdminClient connect(const std::string& path, Millis timeout);

  // Sends `line` and a newline. Throws ConnectError.
  void send_line(std::string_view line, Millis timeout);
  // The next line (without its newline). Throws ConnectError on timeout, on
  // EOF and past kMaxAnswerLine bytes.
  std::string read_line(Millis timeout);
  // Sends `request` and reads its answer: the first line whose id is the
  // request's or null (a refusal sent before any request has a null id).
  // `raw`, when given, receives the answer's line as the daemon sent it.
  // Throws ConnectError, and ConnectError too for an answer that is not a JSON object.
  json call(const json& request, Millis timeout, std::string* raw = nullptr);

  const std::string& path() const { return path_; }

  static constexpr std::size_t kMaxAnswerLine = 64 * 1024 * 1024;

 private:
  AdminClient(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  // Waits for `events` on the socket until `deadline`; false on timeout.
  bool wait(short events, std::chrono::steady_clock::time_point deadline);

  UniqueFd fd_;
  std::string path_;
  std::string buffer_;
  std::size_t scan_ = 0;  // buffer_[..scan_) holds no newline
};

struct RunOptions {
  bool tty = false;  // stdout is a terminal: draw a progress bar
  std::chrono::milliseconds poll_interval{250};
  int bar_width = 30;
};

// moectl's run once its command line is parsed: returns the exit code
// (kExitOk, kExitError, kExitConnect). Answers go to `out`, errors to `err`.
int run_moectl(const Invocation& invocation, std::ostream& out, std::ostream& err,
               const RunOptions& options = {});

}  // namespace moed::runtime::admin
