#include "client/network_link.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "client/connection.h"

namespace moed::client {

LocalSlots::LocalSlots(std::uint64_t bytes) : bytes_(bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("moed client: cannot allocate " + std::to_string(bytes) + " bytes of slots: " + std::strerror(errno));
  data_ = static_cast<std::byte*>(p);
}

LocalSlots::~LocalSlots() { ::munmap(data_, bytes_); }

NetworkLink::NetworkLink(const std::string& host_port, const wire::Key& key, const wire::Hello& hello,
                         Deadline deadline, Link* previous)
    : where_("ucx://" + host_port) {
  netio::SocketAddress address;
  try {
    address = netio::resolve(host_port);
    worker_ = std::make_unique<netio::AmWorker>(
        "moed-client", "", [this](ucp_ep_h, const wire::Frame& f, std::size_t bytes) { return place(f, bytes); });
    ep_ = worker_->connect(address);
  } catch (const netio::UcxError& e) {
    throw Lost("moed client: cannot connect to " + where_ + ": " + e.what(), 0);
  } catch (const std::runtime_error& e) {
    throw Error("moed client: " + where_ + ": " + e.what());
  }
  std::string error;
  const wire::Frame c = expect(deadline, "its challenge");
  const auto challenge = wire::decode_challenge(c.payload, error);
  if (!challenge) throw Error("moed client: bad challenge from " + where_ + ": " + error);
  wire::Login login;
  login.hello = hello;
  login.client_nonce = wire::make_nonce();
  login.proof = wire::client_proof(key, challenge->nonce, login.client_nonce, hello);
  worker_->send(ep_, wire::encode(login));
  const wire::Frame a = expect(deadline, "its answer to our proof of the key");
  const auto accepted = wire::decode_accepted(a.payload, error);
  if (!accepted) throw Error("moed client: bad answer from " + where_ + ": " + error);
  if (!wire::same_proof(accepted->proof, wire::daemon_proof(key, challenge->nonce, login.client_nonce)))
    throw Error("moed client: " + where_ + " could not prove it holds the key: not the cluster, or another key",
                wire::Status::forbidden);
  const wire::Frame w = expect(deadline, "its welcome");
  auto welcome = wire::decode_welcome(w.payload, error);
  if (!welcome) throw Error("moed client: bad welcome from " + where_ + ": " + error);
  welcome_ = *welcome;
  welcome_.layout = wire::make_layout(welcome->layout.hidden, welcome->layout.max_rows, welcome->layout.slots, true);
  auto* lender = dynamic_cast<NetworkLink*>(previous);
  if (lender && lender->slots_->bytes() == welcome_.layout.region_bytes())
    slots_ = lender->slots_;
  else
    slots_ = std::make_shared<LocalSlots>(welcome_.layout.region_bytes());
}

NetworkLink::~NetworkLink() = default;  // the worker closes the endpoint (forced) and ends what is in flight

wire::Frame NetworkLink::expect(Deadline deadline, const char* what) {
  if (!pump(deadline)) throw Error("moed client: timed out waiting for " + where_ + " to send " + what);
  wire::Frame f = pop();
  if (f.type == wire::Type::error) {
    std::string error;
    const auto e = wire::decode_error(f.payload, error);
    if (!e) throw Error("moed client: " + error);
    throw Error("moed client: the daemon at " + where_ + " refused: " + e->message, e->status);
  }
  return f;
}

netio::Placement NetworkLink::place(const wire::Frame& f, std::size_t bytes) {
  std::string error;
  const auto done = f.type == wire::Type::done ? wire::decode_done(f.payload, error) : std::nullopt;
  const wire::Layout& l = welcome_.layout;
  if (!done || !slots_ || done->slot >= l.slots || bytes > l.slot_bytes - l.rows_offset)
    return {nullptr, {}, "data the client has no room for"};
  return {slot(done->slot) + l.rows_offset, slots_, {}};
}

bool NetworkLink::ready() {
  worker_->progress();
  for (netio::Event& e : worker_->take_events()) {
    if (e.kind == netio::Event::Kind::lost && !lost_) lost_ = e.error;
    if (e.kind != netio::Event::Kind::frame) continue;
    last_heard_ = std::chrono::steady_clock::now(), pinged_.reset();
    if (e.frame.type == wire::Type::pong) continue;  // the answer to watch_silence's ping
    if (e.frame.type == wire::Type::ping) {  // the daemon checks that we are alive
      worker_->send(ep_, wire::encode_pong());
      continue;
    }
    if (!e.data_ok) {
      lost_ = e.error.empty() ? "a done whose outputs did not arrive whole" : e.error;
      continue;
    }
    frames_.push_back(std::move(e.frame));
  }
  if (!frames_.empty()) return true;
  if (lost_) throw Lost("moed client: lost the connection to " + where_ + ": " + *lost_, 0);
  return false;
}

void NetworkLink::restart_silence() { last_heard_ = std::chrono::steady_clock::now(), pinged_.reset(); }

void NetworkLink::watch_silence(std::chrono::milliseconds silence) {
  if (lost_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!pinged_) {
    if (now - last_heard_ < silence) return;
    worker_->send(ep_, wire::encode_ping());
    pinged_ = now;
  } else if (now - *pinged_ >= silence) {
    lost_ = "it holds rows of this client and answered no ping for " + std::to_string(silence.count()) +
            " ms (Options::home_silence_ms)";
  }
}

wire::Frame NetworkLink::pop() {
  wire::Frame f = std::move(frames_.front());
  frames_.pop_front();
  return f;
}

bool NetworkLink::pump(Deadline deadline) {
  for (;;) {
    if (ready()) return true;
    if (deadline.passed()) return false;
    worker_->wait(deadline.set ? wait_ms_until(deadline) : -1);
  }
}

void NetworkLink::share(std::shared_ptr<LocalSlots> slots, const wire::Layout& layout) {
  slots_ = std::move(slots);
  welcome_.layout = layout;
}

void NetworkLink::submit(const wire::Submit& m) {
  if (lost_) throw Lost("moed client: lost the connection to " + where_ + ": " + *lost_, 0);
  const wire::Layout& l = welcome_.layout;
  if (m.slot >= l.slots || m.rows == 0 || m.rows > l.max_rows)
    throw Error("moed client: slot " + std::to_string(m.slot) + " with " + std::to_string(m.rows) +
                " rows does not fit the grant");
  // Ids and positions go just before the rows, so that one block carries all three.
  std::byte* s = slot(m.slot);
  std::byte* packed = s + l.packed_offset(m.rows);
  std::memcpy(packed, s + l.ids_offset, std::size_t(m.rows) * sizeof(std::uint64_t));
  std::memcpy(packed + std::size_t(m.rows) * sizeof(std::uint64_t), s + l.positions_offset,
              std::size_t(m.rows) * sizeof(std::uint32_t));
  worker_->send(ep_, wire::encode(m), packed, l.packed_bytes(m.rows, m.dtype), slots_);
}

wire::Frame NetworkLink::next_frame(Deadline deadline) {
  if (!pump(deadline)) throw Error("moed client: timed out waiting for the daemon at " + where_);
  return pop();
}

bool is_network_address(const std::string& address) { return address.rfind("ucx://", 0) == 0; }

std::unique_ptr<Link> open_link(const std::string& address, const wire::Key* key, const wire::Hello& hello,
                                Deadline deadline, Link* previous) {
  if (is_network_address(address)) {
    if (!key) throw Error("moed client: " + address + " is a network address: it needs the cluster's key_file");
    return std::make_unique<NetworkLink>(address.substr(6), *key, hello, deadline, previous);
  }
  if (address.rfind("unix://", 0) == 0) return std::make_unique<Connection>(address.substr(7), hello, deadline);
  if (address.find("://") != std::string::npos)
    throw Error("moed client: \"" + address + "\": the address must be ucx://HOST:PORT, unix:///PATH or a path");
  return std::make_unique<Connection>(address, hello, deadline);
}

}  // namespace moed::client
