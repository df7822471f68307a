// Small messages between two ranks, outside the exchanges' collective order:
// what the survivors of a loss agree over (comm/survivor_agreement.h). An
// exchange needs every rank to open it; a peer message needs only its
// sender, so it still flows when a rank is gone or a step was cut short.
//
// Posting never waits and never fails for a lost peer: a message to a peer
// already lost is dropped, and the loss is reported by take_lost_peers()
// (an endpoint error, where the backend can see one). Messages from one
// sender may arrive out of order; the agreement does not rely on order.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace moed::comm {

// A message longer than this is refused at post() and dropped, with a
// warning, on arrival: the agreement's are a few hundred bytes.
inline constexpr std::size_t kPeerMessageMaxBytes = 16 * 1024;

struct PeerMessage {
  int from = -1;
  std::vector<std::byte> bytes;
};

class PeerMessenger {
 public:
  virtual ~PeerMessenger() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends a copy of `bytes` (at most kPeerMessageMaxBytes) to `dest`.
  virtual void post(int dest, std::span<const std::byte> bytes) = 0;
  // Makes progress once; a message that has landed and was not taken, if any.
  virtual std::optional<PeerMessage> poll() = 0;
  // Peers found lost since the last call (each reported once), ascending.
  virtual std::vector<int> take_lost_peers() = 0;
};

}  // namespace moed::comm
