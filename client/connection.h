// One connection of libmoed_client to a front door: the socket, the daemon's
// welcome and its shared memory mapped here. Internal to the library (not
// installed); Client keeps one and, when it breaks, opens another.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/protocol.h"

namespace moed::client {

using Clock = std::chrono::steady_clock;

// The connection broke or could not be made (EOF, ECONNRESET, EPIPE,
// ENOENT, ECONNREFUSED, ...): what a restarted daemon cures. `err` is the
// errno, 0 for an orderly close.
class Lost : public Error {
 public:
  Lost(const std::string& what, int err, std::optional<wire::Status> status = std::nullopt)
      : Error(what, status), err_(err) {}
  int err() const { return err_; }

 private:
  int err_;
};

// A point in time to wait until, or none (wait as long as it takes).
struct Deadline {
  Clock::time_point at{};
  bool set = false;
  static Deadline after(int ms) {
    return ms < 0 ? Deadline{} : Deadline{Clock::now() + std::chrono::milliseconds(ms), true};
  }
};

class Connection {
 public:
  // Connects, says hello and maps the daemon's shared memory. Throws Lost
  // when the socket cannot be reached or breaks, Error when the daemon
  // refuses (status set) or answers what this client cannot use.
  Connection(const std::string& path, const wire::Hello& hello, Deadline deadline);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const wire::Welcome& welcome() const { return welcome_; }
  const wire::Layout& layout() const { return welcome_.layout; }
  std::byte* slot(std::uint32_t s) const { return region_ + std::uint64_t(s) * welcome_.layout.slot_bytes; }

  // Sends a whole frame; throws Lost.
  void send(const std::vector<std::byte>& frame);
  // The next frame; throws Lost, or Error on a timeout or a broken stream.
  wire::Frame next_frame(Deadline deadline);

  // Maps this connection's memory where `old`'s is, in its place, when both
  // are the same size: pointers the caller holds into the old region then
  // stay valid. `old` lets go of its region either way.
  void take_address_of(Connection& old);

 private:
  void read_some(Deadline deadline);

  std::string path_;
  int fd_ = -1;
  int memfd_ = -1;  // kept to map the memory again (take_address_of)
  wire::Welcome welcome_;
  std::byte* region_ = nullptr;
  wire::FrameReader reader_;
};

}  // namespace moed::client
