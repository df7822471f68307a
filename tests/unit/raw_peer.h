// A raw UCX peer of the network front door that speaks the protocol by hand,
// frame by frame: what tests of the handshake's abuse need (a login replayed,
// a handshake left stalled), which the client library never does.
#pragma once

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "client/auth.h"
#include "client/protocol.h"
#include "client/ucx_am.h"

namespace moed::test {

class RawPeer {
 public:
  // `address`: "ucx://HOST:PORT".
  explicit RawPeer(const std::string& address)
      : worker_("raw-peer", "", [](ucp_ep_h, const wire::Frame&, std::size_t) { return netio::Placement{}; }) {
    ep_ = worker_.connect(netio::resolve(address.substr(6)));
  }
  // The next frame, or nullopt when the connection is lost or `timeout_ms`
  // passes first (< 0: no limit; timed_out() then says which).
  std::optional<wire::Frame> next(int timeout_ms = -1) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      worker_.progress();
      for (netio::Event& e : worker_.take_events()) {
        if (e.kind == netio::Event::Kind::lost) lost_ = true;
        if (e.kind == netio::Event::Kind::frame) frames_.push_back(std::move(e.frame));
      }
      if (!frames_.empty()) {
        wire::Frame f = std::move(frames_.front());
        frames_.pop_front();
        return f;
      }
      if (lost_) return std::nullopt;
      if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) {
        timed_out_ = true;
        return std::nullopt;
      }
      worker_.wait(100);
    }
  }
  bool timed_out() const { return timed_out_; }
  void send(std::vector<std::byte> frame) { worker_.send(ep_, std::move(frame)); }

 private:
  netio::AmWorker worker_;
  ucp_ep_h ep_ = nullptr;
  std::deque<wire::Frame> frames_;
  bool lost_ = false, timed_out_ = false;
};

}  // namespace moed::test
