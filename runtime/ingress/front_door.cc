#include "runtime/ingress/front_door.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/socket_service.h"
#include "runtime/ingress/intake.h"

namespace moed::runtime::ingress {

using Clock = std::chrono::steady_clock;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

constexpr std::size_t kReadPerTurn = 64 * 1024;  // bytes read per client per poll turn (fairness)
constexpr int kMaxPollWaitMs = 1000;             // the longest poll: hello deadlines are checked each turn

// Sends a frame whole, with an fd to pass if any, without blocking; false
// when it could not (the peer does not read, or has gone).
bool send_frame(int fd, const std::vector<std::byte>& frame, int memfd = -1) {
  iovec iov{const_cast<std::byte*>(frame.data()), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (memfd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &memfd, sizeof memfd);
  }
  ssize_t n;
  do n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n == ssize_t(frame.size());
}

}  // namespace

// A client on this host: its socket and the shared memory of its slots.
class UnixSession final : public SocketConnection, public Session, public std::enable_shared_from_this<UnixSession> {
 public:
  UnixSession(UniqueFd fd, std::uint64_t serial, PeerCredentials peer)
      : SocketConnection(std::move(fd), serial, peer), connected_(Clock::now()) {}
  ~UnixSession() override {
    if (region()) ::munmap(region(), layout().region_bytes());
  }

  Clock::time_point connected() const { return connected_; }
  bool welcomed() const { return region() != nullptr; }
  wire::FrameReader& reader() { return reader_; }

  // Creates the sealed shared memory and maps it; returns the memfd to send.
  int map_region(const wire::Layout& layout) {
    memfd_.reset(::memfd_create("moed-ingress", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!memfd_) MOED_THROW(Runtime, "memfd_create(): {}", errno_text(errno));
    if (::ftruncate(memfd_.get(), off_t(layout.region_bytes())) != 0)
      MOED_THROW(Runtime, "cannot size the shared memory ({} bytes): {}", layout.region_bytes(), errno_text(errno));
    // The client cannot shrink it under us (a shrunk memfd would fault our reads).
    if (::fcntl(memfd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      MOED_THROW(Runtime, "cannot seal the shared memory: {}", errno_text(errno));
    void* p = ::mmap(nullptr, layout.region_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, memfd_.get(), 0);
    if (p == MAP_FAILED) MOED_THROW(Runtime, "cannot map the shared memory: {}", errno_text(errno));
    set_region(static_cast<std::byte*>(p), layout);
    return memfd_.get();
  }
  // The memfd is sent once; the mapping keeps the memory.
  void forget_memfd() { memfd_.reset(); }

  // Any thread; a frame is sent whole or the client is cut off (it does not
  // read its answers, and answers are tiny).
  void send(const std::vector<std::byte>& frame, int memfd = -1) {
    std::lock_guard lock(send_mutex_);
    if (dead_) return;
    if (!send_frame(fd(), frame, memfd)) kill();
  }
  void answer_done(const wire::Submit& m) override { send(wire::encode(wire::Done{m.tag, m.slot, m.rows})); }
  void answer_error(std::uint64_t tag, std::uint32_t slot, wire::Status status, const std::string& message) override {
    send(wire::encode(wire::ErrorReply{tag, slot, status, message}));
  }
  std::string describe() const override { return fmt::format("client {} (pid {})", serial(), peer().pid); }
  // Ends the connection; the memory stays mapped until the last step using it lets go.
  void kill() {
    dead_ = true;
    // Read what the client sent and we will not handle: a Unix socket closed
    // with unread bytes resets the peer, which would lose our last answer.
    std::byte sink[4096];
    while (::recv(fd(), sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    ::shutdown(fd(), SHUT_RDWR);
  }
  bool dead() const override { return dead_; }

 private:
  UniqueFd memfd_;
  Clock::time_point connected_;
  wire::FrameReader reader_;
  std::mutex send_mutex_;
  std::atomic<bool> dead_{false};
};

void LayerBatch::clear() {
  x.clear();
  request_ids.clear();
  positions.clear();
  pieces.clear();
}

namespace {

// Every connection of the Unix door is a UnixSession: admit makes them.
UnixSession& session(SocketConnection& c) { return static_cast<UnixSession&>(c); }

}  // namespace

struct FrontDoor::Impl final : SocketService::Handler, Desk {
  int rank = 0, ranks = 1, hidden = 0, layers = 0;  // layers: MoE layers
  ModelLayers model_layers;
  Limits limits;
  std::unique_ptr<SocketService> service;
  std::unique_ptr<NetworkDoor> network;
  std::string network_file;

  // Shared with the step thread.
  mutable std::mutex mutex;
  std::condition_variable work;
  struct Queued {
    std::shared_ptr<Session> session;
    std::deque<QueuedSubmit> queue;
  };
  std::vector<Queued> clients;                  // welcomed, alive
  std::map<std::uint64_t, wire::Submit> tickets;  // queued submits by ticket
  std::uint64_t next_ticket = 1;
  std::vector<std::size_t> queued_rows;         // per layer
  std::size_t round = 0;
  FrontDoorCounters counts;

  // SocketService::Handler, on the server thread.
  void refuse(int fd, Refusal why, const PeerCredentials& peer) override;
  std::shared_ptr<SocketConnection> admit(UniqueFd fd, std::uint64_t serial, const PeerCredentials& peer) override {
    return std::make_shared<UnixSession>(std::move(fd), serial, peer);
  }
  bool serve(SocketConnection& c, short revents) override;
  void closed(SocketConnection& c) override { drop(session(c), "its connection ended"); }
  int poll_timeout_ms(const SocketConnections&) override { return kMaxPollWaitMs; }

  void read_from(UnixSession& s);
  void handle(UnixSession& s, const wire::Frame& f);
  void welcome(UnixSession& s, const wire::Hello& hello);
  void reject(std::uint64_t tag, std::uint32_t slot, Session& s, wire::Status status, const std::string& message);

  // Desk, for both doors.
  std::optional<wire::Layout> grant(const wire::Hello& hello, bool staged, std::string& refusal) const override;
  wire::Welcome welcome(const wire::Layout& layout) const override {
    return {std::uint32_t(rank), std::uint32_t(ranks), std::uint32_t(model_layers.batch_of.size()), layout};
  }
  bool admit(std::shared_ptr<Session> s) override;
  void join(std::shared_ptr<Session> s);  // counted as connected; with `mutex` held
  std::optional<Refused> reserve(Session& s, const wire::Submit& m) override;
  void enqueue(Session& s, const wire::Submit& m) override;
  void unreserve(Session& s, const wire::Submit& m) override;
  void drop(Session& s, const char* why) override;
  void count_refusal() override;
};

void FrontDoor::Impl::count_refusal() {
  std::lock_guard lock(mutex);
  ++counts.refused;
}

// An error answer to one of a client's messages.
void FrontDoor::Impl::reject(std::uint64_t tag, std::uint32_t slot, Session& s, wire::Status status,
                             const std::string& message) {
  count_refusal();
  s.answer_error(tag, slot, status, message);
}

void FrontDoor::Impl::refuse(int fd, Refusal why, const PeerCredentials& peer) {
  count_refusal();
  const auto [status, message] =
      why == Refusal::forbidden
          ? std::pair(wire::Status::forbidden,
                      fmt::format("uid {} may not use this daemon; only uid {} or root may", peer.uid, ::geteuid()))
          : std::pair(wire::Status::too_many_clients,
                      fmt::format("this rank serves at most {} clients ([ingress].max_clients); try again later",
                                  limits.max_clients));
  send_frame(fd, wire::encode(wire::ErrorReply{0, wire::kNoSlot, status, message}));
}

bool FrontDoor::Impl::serve(SocketConnection& c, short revents) {
  UnixSession& s = session(c);
  if (revents) read_from(s);
  if (!s.welcomed() && !s.dead() && Clock::now() - s.connected() > limits.hello_timeout) {
    reject(0, wire::kNoSlot, s, wire::Status::bad_request, "no hello within the time allowed");
    return false;
  }
  return !s.dead();
}

void FrontDoor::Impl::read_from(UnixSession& s) {
  std::byte buffer[8192];
  for (std::size_t got = 0; got < kReadPerTurn && !s.dead();) {
    const ssize_t n = ::recv(s.fd(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      s.kill();
      break;
    }
    got += std::size_t(n);
    s.reader().feed({buffer, std::size_t(n)});
    std::string error;
    while (auto f = s.reader().next(error)) handle(s, *f);
    if (!error.empty()) {
      reject(0, wire::kNoSlot, s, wire::Status::bad_request, error);
      s.kill();
    }
  }
}

void FrontDoor::Impl::handle(UnixSession& s, const wire::Frame& f) {
  std::string error;
  if (!s.welcomed()) {
    auto hello = f.type == wire::Type::hello ? wire::decode_hello(f.payload, error) : std::nullopt;
    if (!hello) {
      reject(0, wire::kNoSlot, s, wire::Status::bad_request,
             error.empty() ? "the first message must be a hello" : error);
      s.kill();
      return;
    }
    welcome(s, *hello);
    return;
  }
  auto submit = f.type == wire::Type::submit ? wire::decode_submit(f.payload, error) : std::nullopt;
  if (!submit) {
    reject(0, wire::kNoSlot, s, wire::Status::bad_request, error.empty() ? "expected a submit" : error);
    s.kill();
    return;
  }
  if (auto refused = reserve(s, *submit)) return reject(submit->tag, submit->slot, s, refused->first, refused->second);
  enqueue(s, *submit);
}

std::optional<wire::Layout> FrontDoor::Impl::grant(const wire::Hello& hello, bool staged, std::string& refusal) const {
  const std::uint32_t slots = std::clamp<std::uint32_t>(hello.slots, 1, limits.max_slots);
  const std::uint32_t rows = std::clamp<std::uint32_t>(
      hello.max_rows, 1, std::min<std::uint32_t>(limits.max_rows, std::uint32_t(limits.max_tokens_per_step)));
  wire::Layout layout = wire::make_layout(std::uint32_t(hidden), rows, slots, staged);
  while (layout.slots > 1 && layout.region_bytes() > limits.max_client_bytes)
    layout = wire::make_layout(std::uint32_t(hidden), rows, layout.slots - 1, staged);
  if (layout.region_bytes() <= limits.max_client_bytes) return layout;
  refusal = fmt::format("one slot of {} rows of {} floats ({} bytes) exceeds [ingress].max_client_mb", rows, hidden,
                        layout.slot_bytes);
  return std::nullopt;
}

bool FrontDoor::Impl::admit(std::shared_ptr<Session> s) {
  std::lock_guard lock(mutex);
  if (clients.size() >= std::size_t(limits.max_clients)) return false;
  join(std::move(s));
  return true;
}

void FrontDoor::Impl::join(std::shared_ptr<Session> s) {
  clients.push_back({std::move(s), {}});
  ++counts.clients;
  ++counts.accepted;
}

void FrontDoor::Impl::welcome(UnixSession& s, const wire::Hello& hello) {
  std::string refusal;
  const auto layout = grant(hello, false, refusal);
  if (!layout) {
    reject(0, wire::kNoSlot, s, wire::Status::bad_request, refusal);
    s.kill();
    return;
  }
  const int memfd = s.map_region(*layout);
  // Counted before the welcome goes: a client that has its welcome is
  // connected in the counters too. (The socket service bounds Unix clients.)
  {
    std::lock_guard lock(mutex);
    join(s.shared_from_this());
  }
  s.send(wire::encode(welcome(*layout)), memfd);
  s.forget_memfd();
  if (s.dead()) {
    drop(s, "the welcome could not be sent");
    return;
  }
  spdlog::debug("front door: {} connected: {} slots of {} rows", s.describe(), layout->slots, layout->max_rows);
}

std::optional<Refused> FrontDoor::Impl::reserve(Session& s, const wire::Submit& m) {
  const wire::Layout& l = s.layout();
  std::string problem;
  if (m.slot >= l.slots)
    problem = fmt::format("slot {} does not exist (this client has {})", m.slot, l.slots);
  else if (m.layer >= model_layers.batch_of.size())
    problem = fmt::format("layer {} is out of range: the model has {} layers (0 to {})", m.layer,
                          model_layers.batch_of.size(), model_layers.batch_of.size() - 1);
  else if (model_layers.batch_of[m.layer] < 0)
    problem = fmt::format("layer {} is a dense layer ({}): moed serves the model's MoE layers, and its dense "
                          "layers only with [model].serve_dense = true", m.layer, model_layers.dense);
  else if (m.rows == 0 || m.rows > l.max_rows)
    problem = fmt::format("{} rows: a submit holds 1 to {} rows", m.rows, l.max_rows);
  if (!problem.empty()) return Refused{wire::Status::bad_request, problem};
  std::lock_guard lock(mutex);
  if (s.in_flight()[m.slot])
    return Refused{wire::Status::busy, fmt::format("slot {} already has a submit in flight; wait for it first", m.slot)};
  s.in_flight()[m.slot] = true;
  return std::nullopt;
}

void FrontDoor::Impl::unreserve(Session& s, const wire::Submit& m) {
  std::lock_guard lock(mutex);
  if (m.slot < s.in_flight().size()) s.in_flight()[m.slot] = false;
}

void FrontDoor::Impl::enqueue(Session& s, const wire::Submit& m) {
  std::lock_guard lock(mutex);
  auto it = std::find_if(clients.begin(), clients.end(), [&](const Queued& q) { return q.session.get() == &s; });
  if (it == clients.end()) return;  // going away
  const std::uint64_t ticket = next_ticket++;
  wire::Submit& queued = tickets[ticket] = m;
  queued.layer = std::uint32_t(model_layers.batch_of[m.layer]);  // from here on, the batch
  it->queue.push_back({0, queued.layer, m.rows, ticket});
  queued_rows[queued.layer] += m.rows;
  ++counts.submits_queued;
  work.notify_one();
}

// A client leaves: its queued submits go with it; a step that took one
// keeps the session (and its memory) until it lets go.
void FrontDoor::Impl::drop(Session& s, const char* why) {
  if (auto* unix_session = dynamic_cast<UnixSession*>(&s)) unix_session->kill();
  std::lock_guard lock(mutex);
  auto it = std::find_if(clients.begin(), clients.end(), [&](const Queued& q) { return q.session.get() == &s; });
  if (it == clients.end()) return;
  for (const QueuedSubmit& q : it->queue) {
    queued_rows[q.layer] -= q.rows;
    tickets.erase(q.ticket);
  }
  clients.erase(it);
  --counts.clients;
  spdlog::debug("front door: {} gone: {}", s.describe(), why);
}

int ModelLayers::batches() const {
  return int(std::count_if(batch_of.begin(), batch_of.end(), [](int i) { return i >= 0; }));
}

FrontDoor::FrontDoor(const std::string& dir, int rank, int ranks, int hidden, ModelLayers layers_, Limits limits,
                     std::optional<NetworkOptions> network)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const int layers = layers_.batches();
  m.rank = rank, m.ranks = ranks, m.hidden = hidden, m.layers = layers;
  m.model_layers = std::move(layers_);
  m.limits = limits;
  m.queued_rows.assign(std::size_t(layers), 0);
  m.service = std::make_unique<SocketService>(dir, socket_path(dir, rank),
                                              SocketNames{"front-door socket", "[ingress].dir"}, m,
                                              limits.max_clients);
  // The network door's addresses are listed before the socket serves: once
  // a rank's socket answers, its .ucx file is there.
  if (network) {
    m.network = std::make_unique<NetworkDoor>(std::move(*network), m, fmt::format("rank-{}", rank));
    m.network_file = network_file(dir, rank);
    std::string lines;
    for (const std::string& a : m.network->addresses()) lines += "ucx://" + a + "\n";
    write_file_atomically(m.network_file, lines);
  }
  m.service->start();
}

FrontDoor::~FrontDoor() {
  Impl& m = *impl_;
  m.service->stop();
  {
    std::lock_guard lock(m.mutex);
    for (auto& c : m.clients)
      for (const QueuedSubmit& q : c.queue) {
        const wire::Submit& submit = m.tickets.at(q.ticket);
        c.session->answer_error(submit.tag, submit.slot, wire::Status::shutting_down,
                                "the daemon is shutting down; this layer was not served");
      }
    for (const auto& c : m.service->connections()) session(*c).kill();
  }
  if (m.network) {
    ::unlink(m.network_file.c_str());
    m.network.reset();  // sends the answers above, then closes
  }
}

std::string FrontDoor::network_file(const std::string& dir, int rank) {
  return fmt::format("{}/moed-ingress-{}.ucx", dir, rank);
}

std::vector<std::string> FrontDoor::network_addresses() const {
  std::vector<std::string> out;
  if (impl_->network)
    for (const std::string& a : impl_->network->addresses()) out.push_back("ucx://" + a);
  return out;
}

NetworkCounters FrontDoor::network_counters() const {
  return impl_->network ? impl_->network->counters() : NetworkCounters{};
}

const std::string& FrontDoor::path() const { return impl_->service->path(); }

std::string FrontDoor::socket_path(const std::string& dir, int rank) {
  return fmt::format("{}/moed-ingress-{}.sock", dir, rank);
}

void FrontDoor::wait_for_work(std::chrono::microseconds idle) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mutex);
  auto queued = [&] {
    return std::any_of(m.queued_rows.begin(), m.queued_rows.end(), [](std::size_t r) { return r > 0; });
  };
  if (!queued()) m.work.wait_for(lock, idle, queued);
  if (queued() && m.limits.max_wait.count() > 0)
    m.work.wait_for(lock, m.limits.max_wait, [&] {
      return std::any_of(m.queued_rows.begin(), m.queued_rows.end(),
                         [&](std::size_t r) { return r >= m.limits.max_tokens_per_step; });
    });
}

namespace {

// Copies a submit's rows out of its slot as fp32; the first bad value, if any.
std::optional<std::string> copy_rows(const Session& s, const wire::Submit& m, std::size_t hidden, float* out) {
  const std::byte* rows = s.slot(m.slot) + s.layout().rows_offset;
  const std::size_t n = std::size_t(m.rows) * hidden;
  if (m.dtype == wire::DType::bf16) {
    // Read once each, widened into our copy; the check below looks at the copy.
    const auto* raw = reinterpret_cast<const std::uint16_t*>(rows);
    for (std::size_t i = 0; i < n; ++i) out[i] = wire::bf16_to_float(raw[i]);
  } else {
    std::memcpy(out, rows, n * sizeof(float));
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i]))
      return fmt::format("row {} holds {} at column {}: every value must be finite", i / hidden,
                         std::isnan(out[i]) ? "NaN" : "Inf", i % hidden);
  return std::nullopt;
}

}  // namespace

void FrontDoor::take(std::vector<LayerBatch>& batches) {
  Impl& m = *impl_;
  batches.resize(std::size_t(m.layers));
  for (LayerBatch& b : batches) b.clear();
  struct Taken {
    std::shared_ptr<Session> session;
    wire::Submit submit;
  };
  std::vector<Taken> taken;
  {
    std::lock_guard lock(m.mutex);
    if (m.clients.empty()) return;
    std::vector<std::deque<QueuedSubmit>> queues;
    for (auto& c : m.clients) queues.push_back(std::move(c.queue));
    std::vector<std::size_t> budget(std::size_t(m.layers), m.limits.max_tokens_per_step);
    const std::vector<QueuedSubmit> picked = take_fair(queues, m.round++ % queues.size(), budget);
    for (std::size_t i = 0; i < queues.size(); ++i) m.clients[i].queue = std::move(queues[i]);
    for (const QueuedSubmit& q : picked) {
      auto t = m.tickets.find(q.ticket);
      taken.push_back({m.clients[q.client].session, t->second});
      m.tickets.erase(t);
      m.queued_rows[q.layer] -= q.rows;
    }
  }
  const std::size_t H = std::size_t(m.hidden);
  for (Taken& t : taken) {
    LayerBatch& b = batches[t.submit.layer];
    const std::size_t first = b.rows();
    b.x.resize((first + t.submit.rows) * H);
    if (auto bad = copy_rows(*t.session, t.submit, H, b.x.data() + first * H)) {
      b.x.resize(first * H);
      {
        std::lock_guard lock(m.mutex);
        t.session->in_flight()[t.submit.slot] = false;
        ++m.counts.refused;
      }
      t.session->answer_error(t.submit.tag, t.submit.slot, wire::Status::not_finite, *bad);
      continue;
    }
    const std::uint64_t* ids = t.session->request_ids(t.submit);
    const std::uint32_t* pos = t.session->positions(t.submit);
    b.request_ids.insert(b.request_ids.end(), ids, ids + t.submit.rows);
    b.positions.insert(b.positions.end(), pos, pos + t.submit.rows);
    b.pieces.push_back({std::move(t.session), t.submit, first});
  }
}

void FrontDoor::complete(std::vector<LayerBatch>& batches) {
  Impl& m = *impl_;
  const std::size_t H = std::size_t(m.hidden);
  std::uint64_t submits = 0, rows = 0;
  for (LayerBatch& b : batches) {
    for (LayerBatch::Piece& p : b.pieces) {
      Session& s = *p.session;
      // The outputs first, then the answer: the client reads them once told.
      std::byte* out = s.slot(p.submit.slot) + s.layout().rows_offset;
      const float* y = b.x.data() + p.first * H;
      const std::size_t n = std::size_t(p.submit.rows) * H;
      if (p.submit.dtype == wire::DType::bf16) {
        auto* narrow = reinterpret_cast<std::uint16_t*>(out);
        for (std::size_t i = 0; i < n; ++i) narrow[i] = wire::float_to_bf16(y[i]);
      } else {
        std::memcpy(out, y, n * sizeof(float));
      }
      ++submits, rows += p.submit.rows;
    }
  }
  {
    std::lock_guard lock(m.mutex);
    for (LayerBatch& b : batches)
      for (LayerBatch::Piece& p : b.pieces) p.session->in_flight()[p.submit.slot] = false;
    m.counts.submits_served += submits;
    m.counts.rows_served += rows;
  }
  for (LayerBatch& b : batches) {
    for (LayerBatch::Piece& p : b.pieces) p.session->answer_done(p.submit);
    b.pieces.clear();  // lets go of sessions that have gone
  }
}

FrontDoorCounters FrontDoor::counters() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->counts;
}

}  // namespace moed::runtime::ingress
