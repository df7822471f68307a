// One connection of libmoed_client to a front door on this host: the Unix
// socket, the daemon's welcome and its shared memory mapped here. Internal
// to the library (not installed).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/link.h"
#include "client/protocol.h"

namespace moed::client {

class Connection final : public Link {
 public:
  // Connects, says hello and maps the daemon's shared memory. Throws Lost
  // when the socket cannot be reached or breaks, Error when the daemon
  // refuses (status set) or answers what this client cannot use.
  Connection(const std::string& path, const wire::Hello& hello, Deadline deadline);
  ~Connection() override;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const wire::Welcome& welcome() const override { return welcome_; }
  std::byte* slot(std::uint32_t s) const override { return region_ + std::uint64_t(s) * welcome_.layout.slot_bytes; }

  void submit(const wire::Submit& m) override { send(wire::encode(m)); }
  wire::Frame next_frame(Deadline deadline) override;

  // Maps this connection's memory where `old`'s is, in its place, when both
  // are Unix connections of the same size.
  void take_address_of(Link& old) override;

 private:
  // Sends a whole frame; throws Lost.
  void send(const std::vector<std::byte>& frame);
  void read_some(Deadline deadline);

  std::string path_;
  int fd_ = -1;
  int memfd_ = -1;  // kept to map the memory again (take_address_of)
  wire::Welcome welcome_;
  std::byte* region_ = nullptr;
  wire::FrameReader reader_;
};

}  // namespace moed::client
