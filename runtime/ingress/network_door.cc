#include "runtime/ingress/network_door.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "client/ucx_am.h"
#include "common/error.h"

namespace moed::runtime::ingress {

using Clock = std::chrono::steady_clock;

namespace {

constexpr int kMaxPollWaitMs = 1000;  // the longest sleep: handshake deadlines are checked each turn
constexpr auto kListenRetry = std::chrono::seconds(10);  // for a port still held by the daemon before a restart

// The peer's address without its port: handshakes are bounded per address.
std::string host_of(const netio::SocketAddress& a) {
  const std::string text = a.text();
  return text.substr(0, text.rfind(':'));
}

// Where clients reach a listener bound to `bound`: itself, or for a wildcard
// address every IPv4 interface that is up, loopback last.
std::vector<std::string> reachable_hosts(const netio::SocketAddress& bound) {
  const std::string text = bound.text();
  const std::string host = text.substr(0, text.rfind(':'));
  if (host != "0.0.0.0") return {host};
  std::vector<std::string> out, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      char name[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, name, sizeof name);
      ((i->ifa_flags & IFF_LOOPBACK) ? loopback : out).emplace_back(name);
    }
    ::freeifaddrs(list);
  }
  out.insert(out.end(), loopback.begin(), loopback.end());
  if (out.empty()) out.push_back(host);
  return out;
}

}  // namespace

// A network client: its endpoint, its handshake and its slots in this
// rank's memory (a staged layout: ids and positions packed before the rows).
class NetworkSession final : public Session, public std::enable_shared_from_this<NetworkSession> {
 public:
  NetworkSession(NetworkDoor::Impl& door, ucp_ep_h ep, const netio::SocketAddress& peer, std::uint64_t serial,
                 Clock::time_point deadline)
      : door_(door), ep_(ep), peer_(peer), serial_(serial), nonce_(wire::make_nonce()),
        deadline_(deadline) {}
  ~NetworkSession() override {
    if (region()) ::munmap(region(), layout().region_bytes());
  }

  ucp_ep_h ep() const { return ep_; }
  const netio::SocketAddress& peer() const { return peer_; }
  const wire::Nonce& nonce() const { return nonce_; }
  Clock::time_point deadline() const { return deadline_; }
  bool logged_in() const { return region() != nullptr; }

  void map_region(const wire::Layout& layout) {
    void* p = ::mmap(nullptr, layout.region_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      MOED_THROW(Runtime, "cannot allocate {} bytes for a network client: {}", layout.region_bytes(), std::strerror(errno));
    set_region(static_cast<std::byte*>(p), layout);
  }

  const std::uint64_t* request_ids(const wire::Submit& m) const override {
    return reinterpret_cast<const std::uint64_t*>(slot(m.slot) + layout().packed_offset(m.rows));
  }
  const std::uint32_t* positions(const wire::Submit& m) const override {
    return reinterpret_cast<const std::uint32_t*>(slot(m.slot) + layout().packed_offset(m.rows) +
                                                  std::size_t(m.rows) * sizeof(std::uint64_t));
  }
  void answer_done(const wire::Submit& m) override;
  void answer_error(std::uint64_t tag, std::uint32_t slot, wire::Status status, const std::string& message) override;
  bool dead() const override { return dead_; }
  void mark_dead() { dead_ = true; }
  std::string describe() const override { return fmt::format("client {} (ucx {})", serial_, peer_.text()); }

  // The status of a submit refused while its data was placed, by tag.
  std::map<std::uint64_t, wire::Status> refusals;
  // When the client was last heard from, and when it was pinged since (the
  // network thread's).
  Clock::time_point last_heard = Clock::now();
  std::optional<Clock::time_point> pinged;

 private:
  NetworkDoor::Impl& door_;
  ucp_ep_h ep_;
  netio::SocketAddress peer_;
  std::uint64_t serial_;
  wire::Nonce nonce_;
  Clock::time_point deadline_;
  std::atomic<bool> dead_{false};
};

struct NetworkDoor::Impl {
  NetworkOptions options;
  Desk& desk;
  std::unique_ptr<netio::AmWorker> worker;
  std::vector<std::string> addresses;
  std::unordered_map<ucp_ep_h, std::shared_ptr<NetworkSession>> sessions;  // the thread's
  std::uint64_t next_serial = 1;
  std::thread thread;
  std::atomic<bool> stopping{false};

  // Answers posted by other threads, sent by ours.
  struct Outgoing {
    std::shared_ptr<NetworkSession> session;
    std::vector<std::byte> frame;
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
  };
  std::mutex outbox_mutex;
  std::vector<Outgoing> outbox;

  mutable std::mutex counts_mutex;
  NetworkCounters counts;

  Impl(NetworkOptions o, Desk& d) : options(std::move(o)), desk(d) {}

  void post(Outgoing out) {
    {
      std::lock_guard lock(outbox_mutex);
      outbox.push_back(std::move(out));
    }
    worker->signal();
  }
  template <class F>
  void count(F&& f) {
    std::lock_guard lock(counts_mutex);
    f(counts);
  }

  void run();
  void on_connection(const netio::Event& e);
  void on_frame(NetworkSession& s, netio::Event& e);
  void on_login(NetworkSession& s, const wire::Frame& f);
  netio::Placement place(ucp_ep_h ep, const wire::Frame& f, std::size_t bytes);
  void send_now(NetworkSession& s, const std::vector<std::byte>& frame) { worker->send(s.ep(), frame); }
  // Ends a session: `flush` lets its last answer go out first.
  void end(NetworkSession& s, const char* why, bool flush);
  void refuse(NetworkSession& s, wire::Status status, const std::string& message) {
    desk.count_refusal();
    send_now(s, wire::encode(wire::ErrorReply{0, wire::kNoSlot, status, message}));
    end(s, message.c_str(), true);
  }
  void send_outbox();
  void expire_handshakes();
  void ping_quiet_clients();
  int next_wait_ms() const;
};

void NetworkSession::answer_done(const wire::Submit& m) {
  if (dead_) return;
  door_.post({shared_from_this(), wire::encode(wire::Done{m.tag, m.slot, m.rows}), slot(m.slot) + layout().rows_offset,
              std::size_t(layout().row_bytes(m.rows, m.dtype))});
}

void NetworkSession::answer_error(std::uint64_t tag, std::uint32_t slot, wire::Status status,
                                  const std::string& message) {
  if (dead_) return;
  door_.post({shared_from_this(), wire::encode(wire::ErrorReply{tag, slot, status, message})});
}

void NetworkDoor::Impl::end(NetworkSession& s, const char* why, bool flush) {
  if (!sessions.count(s.ep())) return;  // ended already (UCX may report a loss twice)
  auto keep = s.shared_from_this();
  s.mark_dead();
  worker->close(s.ep(), flush);
  sessions.erase(s.ep());
  if (s.logged_in()) desk.drop(s, why);
  spdlog::debug("front door: {} gone: {}", s.describe(), why);
}

void NetworkDoor::Impl::on_connection(const netio::Event& e) {
  std::size_t pending = 0, from_peer = 0;
  const std::string host = host_of(e.peer);
  for (const auto& [ep, s] : sessions)
    if (!s->logged_in()) ++pending, from_peer += host_of(s->peer()) == host;
  if (pending >= std::size_t(options.max_handshakes) || from_peer >= std::size_t(options.max_handshakes_per_peer)) {
    worker->reject(e);
    count([](NetworkCounters& c) { ++c.handshakes_refused; });
    desk.count_refusal();
    spdlog::debug("front door: refused a connection from {}: {} handshakes in progress ({} from it)", e.peer.text(),
                  pending, from_peer);
    return;
  }
  ucp_ep_h ep = nullptr;
  try {
    ep = worker->accept(e.request);
  } catch (const netio::UcxError& error) {
    spdlog::warn("front door: cannot accept a connection from {}: {}", e.peer.text(), error.what());
    return;
  }
  auto s = std::make_shared<NetworkSession>(*this, ep, e.peer, next_serial++, Clock::now() + options.handshake_timeout);
  sessions[ep] = s;
  count([](NetworkCounters& c) { ++c.connections; });
  send_now(*s, wire::encode(wire::Challenge{s->nonce()}));
}

void NetworkDoor::Impl::on_login(NetworkSession& s, const wire::Frame& f) {
  std::string error;
  const auto login = f.type == wire::Type::login ? wire::decode_login(f.payload, error) : std::nullopt;
  if (!login || !wire::same_proof(login->proof, wire::client_proof(options.key, s.nonce(), login->client_nonce,
                                                                   login->hello))) {
    count([](NetworkCounters& c) { ++c.auth_failures; });
    spdlog::warn("front door: {} did not prove it holds the cluster's key{}", s.describe(),
                 login ? "" : " (no login)");
    return refuse(s, wire::Status::forbidden,
                  login ? "the proof of the key is wrong: this client does not hold the cluster's key ([ingress].key_file)"
                        : "the first message must be a login with the proof of the cluster's key");
  }
  std::string refusal;
  const auto layout = desk.grant(login->hello, true, refusal);
  if (!layout) return refuse(s, wire::Status::bad_request, refusal);
  s.map_region(*layout);
  count([](NetworkCounters& c) { ++c.logged_in; });
  send_now(s, wire::encode(wire::Accepted{wire::daemon_proof(options.key, s.nonce(), login->client_nonce)}));
  if (!desk.admit(s.shared_from_this()))
    return refuse(s, wire::Status::too_many_clients,
                  "this rank serves its [ingress].max_clients clients already; try again later");
  send_now(s, wire::encode(desk.welcome(*layout)));
  spdlog::debug("front door: {} logged in: {} slots of {} rows", s.describe(), layout->slots, layout->max_rows);
}

netio::Placement NetworkDoor::Impl::place(ucp_ep_h ep, const wire::Frame& f, std::size_t bytes) {
  auto it = sessions.find(ep);
  if (it == sessions.end() || !it->second->logged_in() || f.type != wire::Type::submit)
    return {nullptr, {}, "rows before a login, or with a message other than a submit"};
  NetworkSession& s = *it->second;
  std::string error;
  const auto m = wire::decode_submit(f.payload, error);
  if (!m) return {nullptr, {}, error};
  const wire::Layout& l = s.layout();
  std::optional<Refused> refused;
  if (m->rows == 0 || m->rows > l.max_rows || bytes != l.packed_bytes(m->rows, m->dtype))
    refused = Refused{wire::Status::bad_request,
                      fmt::format("a submit of {} rows carries {} bytes; {} rows of {} values take {} (1 to {} rows)",
                                  m->rows, bytes, m->rows, l.hidden,
                                  m->rows && m->rows <= l.max_rows ? l.packed_bytes(m->rows, m->dtype) : 0,
                                  l.max_rows)};
  else
    refused = desk.reserve(s, *m);
  if (refused) {
    s.refusals[m->tag] = refused->first;
    return {nullptr, {}, refused->second};
  }
  return {s.slot(m->slot) + l.packed_offset(m->rows), s.shared_from_this(), {}};
}

void NetworkDoor::Impl::on_frame(NetworkSession& s, netio::Event& e) {
  s.last_heard = Clock::now(), s.pinged.reset();
  if (!s.logged_in()) return on_login(s, e.frame);
  if (e.frame.type == wire::Type::pong) return;
  // A client with rows here checks that this rank is alive (client/homes.h).
  if (e.frame.type == wire::Type::ping) return send_now(s, wire::encode_pong());
  std::string error;
  const auto m = e.frame.type == wire::Type::submit ? wire::decode_submit(e.frame.payload, error) : std::nullopt;
  if (!m) {
    return refuse(s, wire::Status::bad_request,
                  !e.error.empty() ? e.error : error.empty() ? "expected a submit" : error);
  }
  if (e.data_ok && e.data_bytes > 0) return desk.enqueue(s, *m);
  const auto refused = s.refusals.extract(m->tag);
  if (!refused.empty()) {
    desk.count_refusal();
    send_now(s, wire::encode(wire::ErrorReply{m->tag, m->slot, refused.mapped(), e.error}));
    return;
  }
  if (e.data_bytes == 0) return refuse(s, wire::Status::bad_request, "a submit without its rows");
  // Reserved, but the rows did not arrive whole: the connection is failing.
  desk.unreserve(s, *m);
  end(s, "its rows did not arrive whole", false);
}

void NetworkDoor::Impl::send_outbox() {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(outbox_mutex);
    out.swap(outbox);
  }
  for (Outgoing& o : out)
    if (sessions.count(o.session->ep()))
      worker->send(o.session->ep(), std::move(o.frame), o.data, o.bytes, o.session);
}

void NetworkDoor::Impl::expire_handshakes() {
  const auto now = Clock::now();
  std::vector<NetworkSession*> late;
  for (const auto& [ep, s] : sessions)
    if (!s->logged_in() && now >= s->deadline()) late.push_back(s.get());
  for (NetworkSession* s : late) {
    count([](NetworkCounters& c) { ++c.handshake_timeouts; });
    refuse(*s, wire::Status::bad_request, "no login within [ingress].handshake_timeout_ms");
  }
}

void NetworkDoor::Impl::ping_quiet_clients() {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<NetworkSession>> silent;
  for (const auto& [ep, s] : sessions) {
    if (!s->logged_in()) continue;
    if (s->pinged && now - *s->pinged >= options.silence_timeout)
      silent.push_back(s);
    else if (!s->pinged && now - s->last_heard >= options.ping_interval)
      send_now(*s, wire::encode_ping()), s->pinged = now;
  }
  for (const auto& s : silent) {
    count([](NetworkCounters& c) { ++c.silences; });
    spdlog::info("front door: {} answered no ping for [ingress].silence_timeout_ms ({} ms): let go", s->describe(),
                 options.silence_timeout.count());
    end(*s, "it answered no ping", false);
  }
}

int NetworkDoor::Impl::next_wait_ms() const {
  auto until = Clock::now() + std::chrono::milliseconds(kMaxPollWaitMs);
  for (const auto& [ep, s] : sessions)
    if (!s->logged_in()) until = std::min(until, s->deadline());
  return int(std::max<long long>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count() + 1));
}

void NetworkDoor::Impl::run() {
  while (!stopping) {
    worker->progress();
    for (netio::Event& e : worker->take_events()) {
      if (e.kind == netio::Event::Kind::connection) {
        on_connection(e);
        continue;
      }
      auto it = sessions.find(e.ep);
      if (it == sessions.end()) continue;
      const std::shared_ptr<NetworkSession> s = it->second;
      if (e.kind == netio::Event::Kind::lost)
        end(*s, "its connection ended", false);
      else
        on_frame(*s, e);
    }
    send_outbox();
    expire_handshakes();
    ping_quiet_clients();
    {
      std::lock_guard lock(counts_mutex);
      counts.endpoints = worker->endpoints();
      counts.outstanding = worker->outstanding();
    }
    if (!worker->progress()) worker->wait(next_wait_ms());
  }
  // New clients are refused at once (a client failing over does not wait on
  // us); what was posted last (shutting_down answers) goes out; then every
  // connection ends, flushed, for at most a second.
  worker->stop_listening();
  send_outbox();
  for (const auto& [ep, s] : std::unordered_map(sessions)) end(*s, "the daemon is stopping", true);
  const auto until = Clock::now() + std::chrono::seconds(1);
  while (worker->outstanding() > 0 && Clock::now() < until) {
    worker->progress();
    worker->take_events();
  }
}

std::vector<std::string> rank_listen_addresses(const std::string& listen, int rank) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= listen.size()) {
    std::size_t end = listen.find(',', start);
    if (end == std::string::npos) end = listen.size();
    std::string entry = listen.substr(start, end - start);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    start = end + 1;
    if (entry.empty()) MOED_THROW(Usage, "[ingress].listen = \"{}\": an empty address", listen);
    const std::size_t colon = entry.rfind(':');
    const std::string port = colon == std::string::npos ? "" : entry.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
      MOED_THROW(Usage, "[ingress].listen: \"{}\" is not HOST:PORT (e.g. 10.0.0.1:7400, *:7400)", entry);
    const int base = std::stoi(port);
    const int mine = base == 0 ? 0 : base + rank;
    if (mine > 65535)
      MOED_THROW(Usage, "[ingress].listen: \"{}\": rank {} would listen on port {}, past 65535", entry, rank, mine);
    out.push_back(entry.substr(0, colon + 1) + std::to_string(mine));
  }
  return out;
}

NetworkDoor::NetworkDoor(NetworkOptions options, Desk& desk, const std::string& rank_name)
    : impl_(std::make_unique<Impl>(std::move(options), desk)) {
  Impl& m = *impl_;
  try {
    m.worker = std::make_unique<netio::AmWorker>(
        "moed-" + rank_name, m.options.transports,
        [&m](ucp_ep_h ep, const wire::Frame& f, std::size_t bytes) { return m.place(ep, f, bytes); });
  } catch (const std::exception& e) {
    MOED_THROW(Runtime, "front door: cannot start UCX for [ingress].listen: {}", e.what());
  }
  for (const std::string& text : m.options.listen) {
    netio::SocketAddress address;
    try {
      address = netio::resolve(text);
    } catch (const std::exception& e) {
      MOED_THROW(Usage, "[ingress].listen: {}", e.what());
    }
    // A port still held (the daemon before a restart, still exiting) is
    // tried again for a while; anything else fails at once.
    const auto give_up = Clock::now() + kListenRetry;
    for (;;) {
      try {
        const int port = m.worker->listen(address);
        for (const std::string& host : reachable_hosts(address))
          m.addresses.push_back(host + ":" + std::to_string(port));
        break;
      } catch (const netio::UcxError& e) {
        if (e.status() == UCS_ERR_BUSY && Clock::now() < give_up) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
        MOED_THROW(Runtime, "[ingress].listen: cannot listen on {}: {}{}", address.text(), e.what(),
                   e.status() == UCS_ERR_BUSY ? " (the address is in use, also after 10 s)" : "");
      }
    }
  }
  m.thread = std::thread([&m] { m.run(); });
}

NetworkDoor::~NetworkDoor() {
  impl_->stopping = true;
  impl_->worker->signal();
  impl_->thread.join();
}

const std::vector<std::string>& NetworkDoor::addresses() const { return impl_->addresses; }

NetworkCounters NetworkDoor::counters() const {
  std::lock_guard lock(impl_->counts_mutex);
  return impl_->counts;
}

}  // namespace moed::runtime::ingress
