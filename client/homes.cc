#include "client/homes.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <limits>

namespace moed::client {

namespace {

// How long one home may take to connect while others are tried: a host that
// is gone must not hold a failover up for the whole connect timeout.
constexpr int kConnectPerHomeMs = 3000;

}  // namespace

Homes::Homes(const std::vector<std::string>& addresses, const wire::Key& key, const wire::Hello& hello,
             Deadline deadline, Spread spread, std::chrono::milliseconds silence, Link* previous)
    : spread_(spread), silence_(silence) {
  std::unique_ptr<Error> last;
  for (const std::string& address : addresses) {
    Deadline one = Deadline::after(kConnectPerHomeMs);
    if (deadline.set && (!one.set || deadline.at < one.at)) one = deadline;
    try {
      if (!is_network_address(address))
        throw Error("moed client: \"" + address + "\": several homes must all be ucx:// addresses");
      links_.push_back(std::make_unique<NetworkLink>(address.substr(6), key, hello, one, nullptr));
    } catch (const Lost& e) {
      left_out_.push_back(address);
      last = std::make_unique<Lost>(e);
    } catch (const Error& e) {
      if (e.status() == wire::Status::forbidden || !is_network_address(address)) throw;  // not a failure to wait out
      left_out_.push_back(address);
      last = std::make_unique<Error>(e);
    }
  }
  if (links_.empty()) {
    if (auto* lost = dynamic_cast<Lost*>(last.get())) throw Lost(*lost);
    throw Error(*last);
  }
  // One set of slots for all: the fewest slots and rows any home granted.
  wire::Layout common = links_.front()->welcome().layout;
  for (const auto& l : links_) {
    const wire::Layout& g = l->welcome().layout;
    if (g.hidden != common.hidden || l->welcome().layers != links_.front()->welcome().layers)
      throw Error("moed client: " + links_.front()->where() + " and " + l->where() +
                  " serve different models (hidden size or layers): they are not homes of one cluster");
    common.slots = std::min(common.slots, g.slots);
    common.max_rows = std::min(common.max_rows, g.max_rows);
  }
  common = wire::make_layout(common.hidden, common.max_rows, common.slots, true);
  std::shared_ptr<LocalSlots> slots;
  if (auto* before = dynamic_cast<Homes*>(previous);
      before && before->links_.front()->local_slots()->bytes() == common.region_bytes())
    slots = before->links_.front()->local_slots();
  else
    slots = std::make_shared<LocalSlots>(common.region_bytes());
  for (auto& l : links_) l->share(slots, common);
  welcome_ = links_.front()->welcome();
  rows_in_flight_.assign(links_.size(), 0);
  link_of_slot_.assign(common.slots, 0);
  rows_of_slot_.assign(common.slots, 0);
}

std::size_t Homes::pick() {
  if (spread_ == Spread::round_robin) return next_++ % links_.size();
  // Least loaded: the fewest of this client's rows in flight, ties in turn.
  std::size_t best = next_ % links_.size();
  for (std::size_t k = 1; k < links_.size(); ++k) {
    const std::size_t i = (next_ + k) % links_.size();
    if (rows_in_flight_[i] < rows_in_flight_[best]) best = i;
  }
  next_ = best + 1;
  return best;
}

void Homes::submit(const wire::Submit& m) {
  const std::size_t home = pick();
  if (rows_in_flight_[home] == 0) links_[home]->restart_silence();  // silence counts from its first rows
  links_[home]->submit(m);
  if (m.slot < link_of_slot_.size()) {
    link_of_slot_[m.slot] = home;
    rows_of_slot_[m.slot] = m.rows;
    rows_in_flight_[home] += m.rows;
  }
}

wire::Frame Homes::next_frame(Deadline deadline) {
  for (;;) {
    for (std::size_t i = 0; i < links_.size(); ++i) {
      if (!links_[i]->ready()) continue;
      wire::Frame f = links_[i]->pop();
      // An answer for a slot: its rows are no longer in flight there.
      std::string error;
      std::optional<std::uint32_t> slot;
      if (f.type == wire::Type::done) {
        if (auto d = wire::decode_done(f.payload, error)) slot = d->slot;
      } else if (f.type == wire::Type::error) {
        if (auto e = wire::decode_error(f.payload, error); e && e->slot != wire::kNoSlot) slot = e->slot;
      }
      if (slot && *slot < link_of_slot_.size() && link_of_slot_[*slot] == i) {
        rows_in_flight_[i] -= std::min<std::uint64_t>(rows_in_flight_[i], rows_of_slot_[*slot]);
        rows_of_slot_[*slot] = 0;
      }
      return f;
    }
    if (deadline.passed()) throw Error("moed client: timed out waiting for the homes " + links_.front()->where() + ", ...");
    // Homes holding rows are watched: one silent past silence_ is pinged,
    // then lost (its ready() throws Lost at the next turn, and the Client fails over).
    bool watching = false;
    for (std::size_t i = 0; i < links_.size(); ++i)
      if (silence_.count() > 0 && rows_in_flight_[i] > 0) links_[i]->watch_silence(silence_), watching = true;
    std::vector<pollfd> fds;
    bool sleep = true;
    for (auto& l : links_) {
      if (!l->arm()) sleep = false;
      fds.push_back({l->fd(), POLLIN, 0});
    }
    if (!sleep) continue;
    int wait_ms = deadline.set ? wait_ms_until(deadline) : -1;
    if (watching) {  // wake to check the silences at a tenth of their length
      const int tick = int(std::max<std::int64_t>(10, silence_.count() / 10));
      wait_ms = wait_ms < 0 ? tick : std::min(wait_ms, tick);
    }
    while (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace moed::client
