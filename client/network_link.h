// A client's link to a rank's network front door ("ucx://HOST:PORT"): a UCX
// endpoint, the challenge-response that proves both sides hold the
// cluster's key (auth.h), and slots in this process's own memory. A submit
// sends its slot's ids, positions and rows as one active message; the done
// brings the outputs straight back into the slot. Internal to the library.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "client/auth.h"
#include "client/link.h"
#include "client/ucx_am.h"

namespace moed::client {

// The slots of a network link: page-aligned memory of this process.
class LocalSlots {
 public:
  explicit LocalSlots(std::uint64_t bytes);
  ~LocalSlots();
  LocalSlots(const LocalSlots&) = delete;
  LocalSlots& operator=(const LocalSlots&) = delete;
  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

class NetworkLink final : public Link {
 public:
  // Connects to "HOST:PORT" (the part after ucx://), proves the key and
  // takes the welcome. Throws Lost when the daemon cannot be reached or the
  // connection breaks, Error when it refuses (a wrong key: forbidden) or
  // cannot prove the key itself. `previous` lends its slots when the grant
  // is the same size.
  NetworkLink(const std::string& host_port, const wire::Key& key, const wire::Hello& hello, Deadline deadline,
              Link* previous);
  ~NetworkLink() override;

  const wire::Welcome& welcome() const override { return welcome_; }
  std::byte* slot(std::uint32_t s) const override { return slots_->data() + std::uint64_t(s) * welcome_.layout.slot_bytes; }
  void submit(const wire::Submit& m) override;
  wire::Frame next_frame(Deadline deadline) override;
  void take_address_of(Link& old) override {}  // slots lent by `previous` are already at the old address

  // Several homes (homes.h) share one set of slots: this link's grant
  // holds `layout` (at most its slots and rows), which it uses from now on.
  void share(std::shared_ptr<LocalSlots> slots, const wire::Layout& layout);
  const std::shared_ptr<LocalSlots>& local_slots() const { return slots_; }
  const std::string& where() const { return where_; }

  // Without blocking: progresses, then says whether a frame is queued;
  // throws Lost once the link is lost and nothing is queued.
  bool ready();
  wire::Frame pop();
  // For a wait on several links: false when it must not sleep (progress).
  bool arm() { return worker_->arm(); }
  int fd() const { return worker_->fd(); }

  // The liveness check of a home that holds this client's rows (homes.h):
  // silence counts from restart_silence() or the last frame the daemon
  // sent. Once it reaches `silence` the daemon is pinged, and a daemon that
  // answers nothing for as long again is taken as lost (ready() throws
  // Lost): its host or link may be gone without any connection breaking.
  void restart_silence();
  void watch_silence(std::chrono::milliseconds silence);

 private:
  // Progresses until a frame is queued, the link is lost (throws Lost) or the deadline passes (false).
  bool pump(Deadline deadline);
  wire::Frame expect(Deadline deadline, const char* what);
  netio::Placement place(const wire::Frame& f, std::size_t bytes);

  std::string where_;  // "ucx://HOST:PORT"
  std::unique_ptr<netio::AmWorker> worker_;
  ucp_ep_h ep_ = nullptr;
  wire::Welcome welcome_;
  std::shared_ptr<LocalSlots> slots_;
  std::deque<wire::Frame> frames_;
  std::optional<std::string> lost_;
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> pinged_;
};

}  // namespace moed::client
