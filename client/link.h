// One connection of libmoed_client to a rank's front door, whichever door
// it came through: a Unix socket with the daemon's shared memory
// (connection.h), or the network (network_link.h), where the slots are the
// client's own memory and the rows travel with each submit. Internal to the
// library (not installed); Client keeps one and, when it breaks, opens
// another.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "client/client.h"
#include "client/protocol.h"

namespace moed::client {

using Clock = std::chrono::steady_clock;

// The connection broke or could not be made (EOF, ECONNRESET, EPIPE,
// ENOENT, ECONNREFUSED, an unreachable host, ...): what a restarted daemon
// cures. `err` is the errno, 0 for an orderly close or a network failure.
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
  bool passed() const { return set && Clock::now() >= at; }
};

// Milliseconds from now to the deadline, rounded up, at least 0.
inline int wait_ms_until(const Deadline& d) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d.at - Clock::now()).count() + 1;
  return int(std::clamp<long long>(left, 0, 1 << 30));
}

class Link {
 public:
  virtual ~Link() = default;

  virtual const wire::Welcome& welcome() const = 0;
  // The layout of slot()'s memory.
  const wire::Layout& layout() const { return welcome().layout; }
  virtual std::byte* slot(std::uint32_t s) const = 0;

  // Sends a submit of the slot's first m.rows rows; throws Lost.
  virtual void submit(const wire::Submit& m) = 0;
  // The next frame (a done's outputs are in its slot by then); throws Lost,
  // or Error on a timeout or a broken stream.
  virtual wire::Frame next_frame(Deadline deadline) = 0;

  // Called on a new link with the one it replaces, once every slot was
  // carried over: keeps the old slots' address for this link's memory when
  // it can, so that pointers the caller holds stay valid. `old` lets go of
  // its memory either way.
  virtual void take_address_of(Link& old) = 0;
  // Options::home_silence_ms from now on: only a link with several homes
  // watches their silence.
  virtual void set_home_silence(std::chrono::milliseconds) {}
};

// Opens the link a client address names: "ucx://HOST:PORT" (needs `key`),
// "unix:///PATH" or a bare path. `previous`, when the link replaces one,
// lends its memory to a network link granted the same slots.
std::unique_ptr<Link> open_link(const std::string& address, const std::vector<std::uint8_t>* key,
                                const wire::Hello& hello, Deadline deadline, Link* previous = nullptr);
// True for "ucx://..." addresses.
bool is_network_address(const std::string& address);

}  // namespace moed::client
