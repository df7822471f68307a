#include "client/client.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace moed::client {

namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int err) { return std::strerror(err); }

enum class SlotState { free, held, in_flight, done, failed };

}  // namespace

struct Client::Impl {
  std::string path;
  Options options;
  int fd = -1;
  wire::Welcome welcome;
  std::byte* region = nullptr;
  std::uint64_t next_tag = 1;
  wire::FrameReader reader;
  struct Slot {
    SlotState state = SlotState::free;
    std::uint64_t tag = 0;
    wire::ErrorReply failure;
  };
  std::vector<Slot> slots;

  ~Impl() {
    if (region) ::munmap(region, welcome.layout.region_bytes());
    if (fd >= 0) ::close(fd);
  }

  void send_all(const std::vector<std::byte>& frame) {
    std::size_t off = 0;
    while (off < frame.size()) {
      const ssize_t n = ::send(fd, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error("moed client: lost the connection to " + path + ": " + errno_text(errno));
      off += std::size_t(n);
    }
  }

  // Reads once (up to the deadline); passes any shared-memory fd that came
  // with the bytes to `fd_out`.
  void read_some(Clock::time_point deadline, bool has_deadline, int* fd_out = nullptr) {
    pollfd p{fd, POLLIN, 0};
    for (;;) {
      int wait_ms = -1;
      if (has_deadline) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        wait_ms = int(std::clamp<long long>(left, 0, 1 << 30));  // past the deadline: one last look
      }
      const int r = ::poll(&p, 1, wait_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error("moed client: poll(): " + errno_text(errno));
      if (r > 0) break;
      if (has_deadline && Clock::now() >= deadline)
        throw Error("moed client: timed out waiting for the daemon at " + path);
    }
    std::byte buffer[8192];
    iovec iov{buffer, sizeof buffer};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n;
    do n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw Error("moed client: lost the connection to " + path + ": " + errno_text(errno));
    if (n == 0) throw Error("moed client: the daemon at " + path + " closed the connection");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int received;
        std::memcpy(&received, CMSG_DATA(c), sizeof received);
        if (fd_out && *fd_out < 0)
          *fd_out = received;
        else
          ::close(received);
      }
    reader.feed({buffer, std::size_t(n)});
  }

  wire::Frame next_frame(Clock::time_point deadline, bool has_deadline, int* fd_out = nullptr) {
    for (;;) {
      std::string error;
      if (auto f = reader.next(error)) return *f;
      if (!error.empty()) throw Error("moed client: " + path + ": " + error);
      read_some(deadline, has_deadline, fd_out);
    }
  }

  // Files one answer under its slot.
  void take(const wire::Frame& f) {
    std::string error;
    if (f.type == wire::Type::done) {
      auto d = wire::decode_done(f.payload, error);
      if (!d) throw Error("moed client: " + error);
      if (d->slot < slots.size() && slots[d->slot].tag == d->tag) slots[d->slot].state = SlotState::done;
      return;
    }
    if (f.type == wire::Type::error) {
      auto e = wire::decode_error(f.payload, error);
      if (!e) throw Error("moed client: " + error);
      if (e->slot == wire::kNoSlot)
        throw Error("moed client: the daemon at " + path + " refused: " + e->message, e->status);
      if (e->slot < slots.size() && slots[e->slot].tag == e->tag) {
        slots[e->slot].state = SlotState::failed;
        slots[e->slot].failure = *e;
      }
      return;
    }
    throw Error("moed client: unexpected frame from the daemon");
  }

  void check_slot(int slot) const {
    if (slot < 0 || std::size_t(slot) >= slots.size())
      throw Error("moed client: slot " + std::to_string(slot) + " does not exist (" + std::to_string(slots.size()) +
                  " slots)");
  }
  std::byte* slot_base(int slot) { return region + std::uint64_t(slot) * welcome.layout.slot_bytes; }
};

Client::Client(const std::string& socket_path, Options options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = socket_path;
  m.options = options;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) throw Error("moed client: socket path too long: " + socket_path);
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  m.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (m.fd < 0) throw Error("moed client: socket(): " + errno_text(errno));
  if (::connect(m.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    throw Error("moed client: cannot connect to " + socket_path + ": " + errno_text(err) +
                (err == ENOENT || err == ECONNREFUSED ? " (is moed running with [workload].kind = \"ingress\"?)"
                 : err == EACCES                      ? " (the socket is private to the daemon's user)"
                                                      : ""));
  }
  const bool has_deadline = options.timeout_ms >= 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(options.timeout_ms, 0));
  int memfd = -1;
  try {
    m.send_all(wire::encode(wire::Hello{options.slots, options.max_rows}));
  } catch (const Error&) {
    // A daemon that refuses us (uid, too many clients) answers and hangs up at
    // once, maybe before our hello went out: its answer says why.
    m.take(m.next_frame(Clock::now() + std::chrono::milliseconds(200), true, &memfd));
    throw;
  }
  const wire::Frame f = m.next_frame(deadline, has_deadline, &memfd);
  struct CloseFd {
    int& fd;
    ~CloseFd() {
      if (fd >= 0) ::close(fd);
    }
  } close_memfd{memfd};
  if (f.type == wire::Type::error) m.take(f);  // throws the refusal
  std::string error;
  auto welcome = f.type == wire::Type::welcome ? wire::decode_welcome(f.payload, error) : std::nullopt;
  if (!welcome) throw Error("moed client: bad welcome from " + socket_path + ": " + error);
  if (memfd < 0) throw Error("moed client: the daemon at " + socket_path + " sent no shared memory");
  m.welcome = *welcome;
  void* p = ::mmap(nullptr, m.welcome.layout.region_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) throw Error("moed client: cannot map the shared memory: " + errno_text(errno));
  m.region = static_cast<std::byte*>(p);
  m.slots.resize(m.welcome.layout.slots);
}

Client::~Client() = default;

int Client::rank() const { return int(impl_->welcome.rank); }
int Client::ranks() const { return int(impl_->welcome.ranks); }
int Client::hidden() const { return int(impl_->welcome.layout.hidden); }
int Client::layers() const { return int(impl_->welcome.layers); }
int Client::slots() const { return int(impl_->welcome.layout.slots); }
int Client::max_rows() const { return int(impl_->welcome.layout.max_rows); }

int Client::acquire() {
  for (std::size_t s = 0; s < impl_->slots.size(); ++s)
    if (impl_->slots[s].state == SlotState::free) {
      impl_->slots[s].state = SlotState::held;
      return int(s);
    }
  throw Error("moed client: all " + std::to_string(impl_->slots.size()) + " slots are taken (wait or release one)");
}

void* Client::rows(int slot) {
  impl_->check_slot(slot);
  return impl_->slot_base(slot) + impl_->welcome.layout.rows_offset;
}

std::uint64_t* Client::request_ids(int slot) {
  impl_->check_slot(slot);
  return reinterpret_cast<std::uint64_t*>(impl_->slot_base(slot) + impl_->welcome.layout.ids_offset);
}

std::uint32_t* Client::positions(int slot) {
  impl_->check_slot(slot);
  return reinterpret_cast<std::uint32_t*>(impl_->slot_base(slot) + impl_->welcome.layout.positions_offset);
}

void Client::submit(int slot, int layer, std::uint32_t rows, wire::DType dtype) {
  Impl& m = *impl_;
  m.check_slot(slot);
  Impl::Slot& s = m.slots[std::size_t(slot)];
  if (s.state == SlotState::in_flight)
    throw Error("moed client: slot " + std::to_string(slot) + " is already in flight");
  s.tag = m.next_tag++;
  s.state = SlotState::in_flight;
  m.send_all(wire::encode(wire::Submit{s.tag, std::uint32_t(slot), std::uint32_t(layer), rows, dtype}));
}

void Client::wait(int slot, int timeout_ms) {
  Impl& m = *impl_;
  m.check_slot(slot);
  Impl::Slot& s = m.slots[std::size_t(slot)];
  if (s.state != SlotState::in_flight && s.state != SlotState::done && s.state != SlotState::failed)
    throw Error("moed client: slot " + std::to_string(slot) + " was not submitted");
  const int ms = timeout_ms >= 0 ? timeout_ms : m.options.timeout_ms;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(ms, 0));
  while (s.state == SlotState::in_flight) m.take(m.next_frame(deadline, ms >= 0));
  if (s.state == SlotState::failed) {
    s.state = SlotState::held;
    throw Error("moed client: layer request refused: " + s.failure.message, s.failure.status);
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
