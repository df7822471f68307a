// A client with several home ranks (Client({"ucx://h1:p", "ucx://h2:p"})):
// one network link to each, one set of slots for all of them, and each
// submit sent to the home Options::spread picks. A row's output does not
// depend on the rank that serves it, so the bits are the same whichever
// home answers. Internal to the library.
//
// Homes that cannot be reached when it is made are left out, as long as one
// can be; when a home is lost, the Client makes a new Homes (the lost one
// left out if it is still down) and submits again what was in flight: that
// is the failover.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "client/link.h"
#include "client/network_link.h"

namespace moed::client {

class Homes final : public Link {
 public:
  // Throws the last home's failure (Lost or Error) when none can be reached.
  // `silence`: Options::home_silence_ms (0: off).
  Homes(const std::vector<std::string>& addresses, const wire::Key& key, const wire::Hello& hello, Deadline deadline,
        Spread spread, std::chrono::milliseconds silence, Link* previous);

  const wire::Welcome& welcome() const override { return welcome_; }
  std::byte* slot(std::uint32_t s) const override { return links_.front()->slot(s); }
  void submit(const wire::Submit& m) override;
  wire::Frame next_frame(Deadline deadline) override;
  void take_address_of(Link&) override {}  // the slots lent by `previous` are at the old address already
  void set_home_silence(std::chrono::milliseconds silence) override { silence_ = silence; }

  // The homes reached, and the addresses left out (unreachable when made).
  std::size_t reached() const { return links_.size(); }
  const std::vector<std::string>& left_out() const { return left_out_; }

 private:
  std::size_t pick() ;

  Spread spread_;
  std::chrono::milliseconds silence_;
  std::vector<std::unique_ptr<NetworkLink>> links_;
  std::vector<std::string> left_out_;
  std::vector<std::uint64_t> rows_in_flight_;  // per link, this client's
  std::vector<std::size_t> link_of_slot_;
  std::vector<std::uint32_t> rows_of_slot_;
  std::size_t next_ = 0;  // round robin
  wire::Welcome welcome_;
};

}  // namespace moed::client
