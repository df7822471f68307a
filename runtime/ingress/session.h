// A front-door client as the queue sees it, whichever door it came through
// (the Unix socket on this host, or the network), and the Desk: what a door
// does with its sessions, implemented by the front door's queue. Internal to
// runtime/ingress.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/protocol.h"

namespace moed::runtime::ingress {

class Session {
 public:
  virtual ~Session() = default;

  const wire::Layout& layout() const { return layout_; }
  std::byte* slot(std::uint32_t s) const { return region_ + std::uint64_t(s) * layout_.slot_bytes; }
  // Where a submit's request ids and positions are: the slot's own arrays
  // (shared memory), or packed before its rows (network, staged layout).
  virtual const std::uint64_t* request_ids(const wire::Submit& m) const {
    return reinterpret_cast<const std::uint64_t*>(slot(m.slot) + layout_.ids_offset);
  }
  virtual const std::uint32_t* positions(const wire::Submit& m) const {
    return reinterpret_cast<const std::uint32_t*>(slot(m.slot) + layout_.positions_offset);
  }

  // Any thread. The outputs are in the slot's rows already.
  virtual void answer_done(const wire::Submit& m) = 0;
  virtual void answer_error(std::uint64_t tag, std::uint32_t slot, wire::Status status, const std::string& message) = 0;
  virtual bool dead() const = 0;
  virtual std::string describe() const = 0;  // "client 3 (pid 812)", "client 4 (ucx 10.0.0.5:40022)"

  // Guarded by the queue's mutex.
  std::vector<bool>& in_flight() { return in_flight_; }

 protected:
  void set_region(std::byte* region, const wire::Layout& layout) {
    region_ = region;
    layout_ = layout;
    in_flight_.assign(layout.slots, false);
  }
  std::byte* region() const { return region_; }

 private:
  std::byte* region_ = nullptr;
  wire::Layout layout_;
  std::vector<bool> in_flight_;
};

// A refusal of one submit or connection: its status and the text it carries.
using Refused = std::pair<wire::Status, std::string>;

class Desk {
 public:
  virtual ~Desk() = default;
  // What a hello is granted: slots and rows within the limits (a staged
  // layout for network clients), or the refusal.
  virtual std::optional<wire::Layout> grant(const wire::Hello& hello, bool staged, std::string& refusal) const = 0;
  virtual wire::Welcome welcome(const wire::Layout& layout) const = 0;
  // A welcomed session joins the queue (counted as connected); false when
  // the rank serves [ingress].max_clients already.
  virtual bool admit(std::shared_ptr<Session> s) = 0;
  // Checks a submit's fields and reserves its slot (in flight from here on).
  virtual std::optional<Refused> reserve(Session& s, const wire::Submit& m) = 0;
  // Queues a reserved submit whose rows are in its slot.
  virtual void enqueue(Session& s, const wire::Submit& m) = 0;
  // Lets go of a reserved submit whose rows never arrived.
  virtual void unreserve(Session& s, const wire::Submit& m) = 0;
  // The session leaves: its queued submits go with it.
  virtual void drop(Session& s, const char* why) = 0;
  virtual void count_refusal() = 0;
};

}  // namespace moed::runtime::ingress
