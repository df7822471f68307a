#include "client/client.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "client/auth.h"
#include "client/homes.h"
#include "client/link.h"

namespace moed::client {

namespace {

enum class SlotState { free, held, in_flight, done, failed };

// Copies a slot's first `rows` request ids, positions and rows (fp32 wide,
// so bf16 rows too) from one shared-memory layout to another.
void copy_slot(const std::byte* from, const wire::Layout& a, std::byte* to, const wire::Layout& b,
               std::uint32_t rows) {
  if (from == to && a.slot_bytes == b.slot_bytes) return;  // a network link lent its slots: already there
  std::memcpy(to + b.ids_offset, from + a.ids_offset, std::size_t(rows) * sizeof(std::uint64_t));
  std::memcpy(to + b.positions_offset, from + a.positions_offset, std::size_t(rows) * sizeof(std::uint32_t));
  std::memcpy(to + b.rows_offset, from + a.rows_offset, std::size_t(rows) * a.hidden * sizeof(float));
}

std::string grant_text(const wire::Layout& l) {
  return std::to_string(l.slots) + " slots of " + std::to_string(l.max_rows) + " rows of " + std::to_string(l.hidden);
}

}  // namespace

struct Client::Impl {
  std::string path;                    // for messages: the address, or the homes' addresses
  std::vector<std::string> addresses;  // one, or the homes
  Options options;
  std::optional<wire::Key> key;  // read once, for network addresses
  std::unique_ptr<Link> conn;
  std::uint64_t next_tag = 1;
  std::uint64_t reconnects = 0;
  bool stopping = false;  // the daemon answered shutting_down: the connection is about to end
  // When the connection was first lost, until an answer comes: a daemon that
  // keeps coming back and going again does not stretch reconnect_ms.
  std::optional<Clock::time_point> lost_since;
  struct Slot {
    SlotState state = SlotState::free;
    std::uint64_t tag = 0;
    // The last submit, to make it again on a new connection.
    std::uint32_t layer = 0, rows = 0;
    wire::DType dtype = wire::DType::f32;
    std::vector<std::byte> inputs;  // its rows as submitted (the outputs overwrite them in place)
    std::string failure;
    std::optional<wire::Status> failure_status;
  };
  std::vector<Slot> slots;

  bool reconnecting() const { return options.reconnect_ms > 0; }
  wire::Hello hello() const { return {options.slots, options.max_rows}; }
  std::byte* rows_of(std::size_t slot) const {
    return conn->slot(std::uint32_t(slot)) + conn->layout().rows_offset;
  }

  void fail(Slot& s, std::string message, std::optional<wire::Status> status) {
    s.state = SlotState::failed;
    s.failure = std::move(message);
    s.failure_status = status;
  }

  // Files one answer under its slot.
  void take(const wire::Frame& f) {
    std::string error;
    if (f.type == wire::Type::done) {
      auto d = wire::decode_done(f.payload, error);
      if (!d) throw Error("moed client: " + error);
      if (d->slot < slots.size() && slots[d->slot].tag == d->tag) slots[d->slot].state = SlotState::done;
      lost_since.reset();
      return;
    }
    if (f.type == wire::Type::error) {
      auto e = wire::decode_error(f.payload, error);
      if (!e) throw Error("moed client: " + error);
      if (e->slot == wire::kNoSlot)
        throw Error("moed client: the daemon at " + path + " refused: " + e->message, e->status);
      if (e->slot < slots.size() && slots[e->slot].tag == e->tag) {
        // A daemon that stops is restarted (or reconnect_ms runs out): the
        // submit stays in flight and is made again on the next connection.
        if (e->status == wire::Status::shutting_down && reconnecting()) {
          stopping = true;
          return;
        }
        fail(slots[e->slot], "moed client: layer request refused: " + e->message, e->status);
        lost_since.reset();
      }
      return;
    }
    throw Error("moed client: unexpected frame from the daemon");
  }

  // The next answer, mending the connection first when it is lost.
  void take_next(Deadline& deadline, int timeout_ms) {
    try {
      if (stopping)
        throw Lost("moed client: the daemon at " + path + " is shutting down", 0, wire::Status::shutting_down);
      take(conn->next_frame(deadline));
    } catch (const Lost& lost) {
      recover(lost);
      deadline = Deadline::after(timeout_ms);
    }
  }

  void send_submit(std::size_t slot) {
    const Slot& s = slots[slot];
    try {
      conn->submit(wire::Submit{s.tag, std::uint32_t(slot), s.layer, s.rows, s.dtype});
    } catch (const Lost& lost) {
      recover(lost);
    }
  }

  std::unique_ptr<Link> open(Deadline deadline, Link* previous) {
    if (addresses.size() > 1) {
      if (!key) throw Error("moed client: " + path + ": several homes must all be ucx:// addresses");
      return std::make_unique<Homes>(addresses, *key, hello(), deadline, options.spread,
                                     std::chrono::milliseconds(std::max(0, options.home_silence_ms)), previous);
    }
    return open_link(path, key ? &*key : nullptr, hello(), deadline, previous);
  }
  // Connects within reconnect_ms of `since`, backing off from 10 ms to 500
  // ms between tries; nullptr and `failure` set when no daemon answered.
  std::unique_ptr<Link> connect_again(Clock::time_point since, const Lost& cause, std::string& failure);
  void recover(const Lost& cause);
  void drain();
  void carry_over(std::unique_ptr<Link> fresh);
  void give_up(const std::string& message, std::optional<wire::Status> status);

  void check_slot(int slot) const {
    if (slot < 0 || std::size_t(slot) >= slots.size())
      throw Error("moed client: slot " + std::to_string(slot) + " does not exist (" +
                  std::to_string(conn->layout().slots) + " slots)");
  }
  // A slot of the memory mapped now (a reconnect may grant fewer).
  void check_mapped(int slot) const {
    check_slot(slot);
    if (std::uint32_t(slot) >= conn->layout().slots)
      throw Error("moed client: slot " + std::to_string(slot) + " is gone: the restarted daemon granted " +
                  grant_text(conn->layout()));
  }
};

// The answers the old daemon sent before the connection ended (done slots
// keep their outputs); a daemon that is stopping closes soon after its last.
void Client::Impl::drain() {
  const Deadline grace = Deadline::after(1000);
  try {
    for (;;) take(conn->next_frame(grace));
  } catch (const Error&) {
  }
}

std::unique_ptr<Link> Client::Impl::connect_again(Clock::time_point since, const Lost& cause, std::string& failure) {
  const auto until = since + std::chrono::milliseconds(options.reconnect_ms);
  auto backoff = std::chrono::milliseconds(10);
  std::string last = cause.what();
  int last_errno = cause.err(), tries = 0;
  for (;;) {
    ++tries;
    try {
      return open(Deadline{until, true}, conn.get());
    } catch (const Lost& e) {
      last = e.what(), last_errno = e.err();
    } catch (const Error& e) {
      last = e.what(), last_errno = 0;
      if (e.status() == wire::Status::forbidden) break;  // a restart does not change who may connect
    }
    const auto now = Clock::now();
    if (now >= until) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, until - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  const auto tried = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
  failure = "tried " + std::to_string(tries) + " times over " + std::to_string(tried) + " ms (reconnect_ms " +
            std::to_string(options.reconnect_ms) + "); last: " + last +
            (last_errno ? " (errno " + std::to_string(last_errno) + ")" : "");
  return nullptr;
}

void Client::Impl::recover(const Lost& cause) {
  if (!reconnecting()) throw Error(cause.what(), cause.status());
  drain();
  stopping = false;
  if (!lost_since) lost_since = Clock::now();
  std::string failure;
  if (auto fresh = connect_again(*lost_since, cause, failure)) {
    carry_over(std::move(fresh));
    return;
  }
  give_up("moed client: lost the connection to " + path + " (" + cause.what() + ") and could not connect again: " +
              failure,
          cause.status());
}

// Every submit in flight fails; its rows go back into its slot, so that it
// can be submitted again as it is. The next call that needs the daemon tries
// again for reconnect_ms.
void Client::Impl::give_up(const std::string& message, std::optional<wire::Status> status) {
  lost_since.reset();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    if (s.state != SlotState::in_flight) continue;
    if (i < conn->layout().slots) std::memcpy(rows_of(i), s.inputs.data(), s.inputs.size());
    fail(s, message, status);
  }
}

// Moves every slot's contents into the new connection's memory and submits
// again what had no answer. Nothing of the client changes until every
// submit went out: a connection lost meanwhile is simply tried again.
void Client::Impl::carry_over(std::unique_ptr<Link> fresh) {
  const wire::Layout &a = conn->layout(), &b = fresh->layout();
  const bool same_model = a.hidden == b.hidden && conn->welcome().layers == fresh->welcome().layers;
  const std::uint32_t common_rows = std::min(a.max_rows, b.max_rows);
  std::vector<std::string> dropped(slots.size());
  std::vector<std::uint64_t> tags(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    const bool kept = same_model && i < a.slots && i < b.slots;
    if (kept) copy_slot(conn->slot(std::uint32_t(i)), a, fresh->slot(std::uint32_t(i)), b, common_rows);
    if (s.state != SlotState::in_flight && s.state != SlotState::done) continue;
    if (!kept || s.rows > b.max_rows) {
      dropped[i] = "moed client: the daemon at " + path + " came back granting " + grant_text(b) + " (was " +
                   grant_text(a) + "): slot " + std::to_string(i) + "'s " + std::to_string(s.rows) +
                   " rows were dropped";
      continue;
    }
    if (s.state == SlotState::in_flight) {
      std::memcpy(fresh->slot(std::uint32_t(i)) + b.rows_offset, s.inputs.data(), s.inputs.size());
      tags[i] = next_tag++;
      fresh->submit(wire::Submit{tags[i], std::uint32_t(i), s.layer, s.rows, s.dtype});
    }
  }
  fresh->take_address_of(*conn);
  conn = std::move(fresh);
  if (std::all_of(tags.begin(), tags.end(), [](std::uint64_t t) { return t == 0; })) lost_since.reset();  // none awaited
  slots.resize(std::max<std::size_t>(slots.size(), b.slots));
  for (std::size_t i = 0; i < dropped.size(); ++i) {
    if (!dropped[i].empty())
      fail(slots[i], dropped[i], std::nullopt);
    else if (slots[i].state == SlotState::in_flight)
      slots[i].tag = tags[i];
  }
  ++reconnects;
}

Client::Client(const std::string& address, Options options) : Client(std::vector<std::string>{address}, options) {}

Client::Client(const std::vector<std::string>& addresses, Options options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (addresses.empty()) throw Error("moed client: no address to connect to");
  m.addresses = addresses;
  m.options = options;
  for (const std::string& a : addresses) m.path += (m.path.empty() ? "" : ", ") + a;
  if (std::any_of(addresses.begin(), addresses.end(), is_network_address)) {
    if (options.key_file.empty())
      throw Error("moed client: " + m.path + ": a network address needs Options::key_file, the cluster's key");
    try {
      m.key = wire::read_key_file(options.key_file);
    } catch (const std::runtime_error& e) {
      throw Error(std::string("moed client: ") + e.what());
    }
  }
  // A daemon that is restarting (or not up yet) is waited for, as a lost
  // connection is: a model process may start before the experts.
  const auto started = Clock::now();
  try {
    m.conn = m.open(Deadline::after(options.timeout_ms), nullptr);
  } catch (const Lost& e) {
    std::string failure;
    if (m.reconnecting()) m.conn = m.connect_again(started, e, failure);
    if (!m.conn) throw Error(m.reconnecting() ? "moed client: cannot connect to " + m.path + ": " + failure : e.what(),
                             e.status());
  }
  m.slots.resize(m.conn->layout().slots);
}

Client::~Client() = default;

int Client::rank() const { return int(impl_->conn->welcome().rank); }
int Client::ranks() const { return int(impl_->conn->welcome().ranks); }
int Client::hidden() const { return int(impl_->conn->layout().hidden); }
int Client::layers() const { return int(impl_->conn->welcome().layers); }
int Client::slots() const { return int(impl_->conn->layout().slots); }
int Client::max_rows() const { return int(impl_->conn->layout().max_rows); }
std::uint64_t Client::reconnects() const { return impl_->reconnects; }
void Client::set_reconnect_ms(int ms) { impl_->options.reconnect_ms = std::max(ms, 0); }

void Client::set_home_silence_ms(int ms) {
  impl_->options.home_silence_ms = std::max(ms, 0);
  impl_->conn->set_home_silence(std::chrono::milliseconds(impl_->options.home_silence_ms));
}

int Client::acquire() {
  const std::size_t mapped = impl_->conn->layout().slots;
  for (std::size_t s = 0; s < mapped; ++s)
    if (impl_->slots[s].state == SlotState::free) {
      impl_->slots[s].state = SlotState::held;
      return int(s);
    }
  throw Error("moed client: all " + std::to_string(mapped) + " slots are taken (wait or release one)");
}

void* Client::rows(int slot) {
  impl_->check_mapped(slot);
  return impl_->rows_of(std::size_t(slot));
}

std::uint64_t* Client::request_ids(int slot) {
  impl_->check_mapped(slot);
  return reinterpret_cast<std::uint64_t*>(impl_->conn->slot(std::uint32_t(slot)) + impl_->conn->layout().ids_offset);
}

std::uint32_t* Client::positions(int slot) {
  impl_->check_mapped(slot);
  return reinterpret_cast<std::uint32_t*>(impl_->conn->slot(std::uint32_t(slot)) +
                                          impl_->conn->layout().positions_offset);
}

void Client::submit(int slot, int layer, std::uint32_t rows, wire::DType dtype) {
  Impl& m = *impl_;
  m.check_mapped(slot);
  Impl::Slot& s = m.slots[std::size_t(slot)];
  if (s.state == SlotState::in_flight)
    throw Error("moed client: slot " + std::to_string(slot) + " is already in flight");
  s.layer = std::uint32_t(layer), s.rows = rows, s.dtype = dtype;
  if (m.reconnecting()) {
    const wire::Layout& l = m.conn->layout();
    const std::size_t bytes = std::size_t(std::min(rows, l.max_rows)) * l.hidden *
                              (dtype == wire::DType::bf16 ? sizeof(std::uint16_t) : sizeof(float));
    const std::byte* from = m.rows_of(std::size_t(slot));
    s.inputs.assign(from, from + bytes);
  }
  s.tag = m.next_tag++;
  s.state = SlotState::in_flight;
  m.send_submit(std::size_t(slot));
}

void Client::wait(int slot, int timeout_ms) {
  Impl& m = *impl_;
  m.check_slot(slot);
  Impl::Slot& s = m.slots[std::size_t(slot)];
  if (s.state != SlotState::in_flight && s.state != SlotState::done && s.state != SlotState::failed)
    throw Error("moed client: slot " + std::to_string(slot) + " was not submitted");
  const int ms = timeout_ms >= 0 ? timeout_ms : m.options.timeout_ms;
  Deadline deadline = Deadline::after(ms);
  while (s.state == SlotState::in_flight) m.take_next(deadline, ms);
  if (s.state == SlotState::failed) {
    s.state = SlotState::held;
    throw Error(s.failure, s.failure_status);
  }
  s.state = SlotState::held;
}

void Client::release(int slot) {
  impl_->check_slot(slot);
  Impl::Slot& s = impl_->slots[std::size_t(slot)];
  if (s.state == SlotState::in_flight)
    throw Error("moed client: slot " + std::to_string(slot) + " is in flight: wait for it first");
  s.state = SlotState::free;
}

void Client::forward(int layer, const float* hidden, std::size_t n, const std::uint64_t* request_ids,
                     const std::uint32_t* positions, float* out) {
  const std::size_t H = std::size_t(this->hidden()), per = std::size_t(max_rows());
  for (std::size_t first = 0; first < n; first += per) {
    const std::size_t rows = std::min(per, n - first);
    const int slot = acquire();
    try {
      std::memcpy(this->rows(slot), hidden + first * H, rows * H * sizeof(float));
      std::memcpy(this->request_ids(slot), request_ids + first, rows * sizeof(std::uint64_t));
      std::memcpy(this->positions(slot), positions + first, rows * sizeof(std::uint32_t));
      submit(slot, layer, std::uint32_t(rows));
      wait(slot);
      std::memcpy(out + first * H, this->rows(slot), rows * H * sizeof(float));
    } catch (...) {
      if (impl_->slots[std::size_t(slot)].state != SlotState::in_flight) release(slot);
      throw;
    }
    release(slot);
  }
}

}  // namespace moed::client
