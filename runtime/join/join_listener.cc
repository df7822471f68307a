#include "runtime/join/join_listener.h"

#include <arpa/inet.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/tcp_socket.h"

namespace moed::runtime::join {

JoinListener::JoinListener(ListenAddress address, wire::Key key, int launched_ranks, int world_ranks, SlotFor offer,
                           std::chrono::milliseconds timeout)
    : address_(std::move(address)),
      key_(std::move(key)),
      launched_ranks_(launched_ranks),
      world_ranks_(world_ranks),
      offer_(std::move(offer)),
      timeout_(timeout) {
  listen_fd_ = listen_tcp(address_, "[comm].join_listen");
  thread_ = std::thread([this] { run(); });
}

JoinListener::~JoinListener() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  answered_.notify_all();
  wake_.wake();
  thread_.join();
}

std::vector<JoinArrival> JoinListener::take_arrivals() {
  std::lock_guard lock(mu_);
  std::vector<JoinArrival> out;
  if (arrival_) out.push_back(std::move(*arrival_)), arrival_.reset();
  return out;
}

void JoinListener::answer(int world_rank, std::variant<Welcome, std::string> welcome) {
  {
    std::lock_guard lock(mu_);
    if (world_rank != waiting_for_) return;  // it went away meanwhile
    answer_ = std::move(welcome);
  }
  answered_.notify_all();
}

void JoinListener::run() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_.fd(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
      spdlog::error("join listener on {}: poll: {}; no more joiners are heard", address_.describe(), std::strerror(errno));
      return;
    }
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    sockaddr_storage from{};
    socklen_t size = sizeof from;
    UniqueFd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&from), &size, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) continue;
    char text[INET6_ADDRSTRLEN] = "?";
    if (from.ss_family == AF_INET) ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in&>(from).sin_addr, text, sizeof text);
    if (from.ss_family == AF_INET6) ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6&>(from).sin6_addr, text, sizeof text);
    try {
      converse(std::move(fd), text);
    } catch (const std::exception& e) {
      spdlog::warn("join listener: a joiner from {}: {}; the job goes on without it", text, e.what());
    }
  }
}

void JoinListener::converse(UniqueFd fd, const std::string& peer) {
  const std::string who = fmt::format("a joiner from {}", peer);
  const auto deadline = TcpClock::now() + timeout_;
  const Challenge challenge{wire::make_nonce()};
  write_frame(fd.get(), encode(challenge), deadline, who);
  const Hello hello = decode_hello(read_frame(fd.get(), kMaxFrameBytes, deadline, who), who);
  const auto refuse = [&](const std::string& why) {
    spdlog::warn("join listener: refused {} (host {}): {}", who, hello.host, why);
    write_frame(fd.get(), encode_refusal(why), deadline, who);
  };
  if (!wire::same_proof(hello.proof, wire::joiner_proof(key_, challenge.nonce, hello.nonce, hello.signed_text())))
    return refuse("its proof of the cluster's key is wrong ([ingress].key_file differs)");
  const std::variant<int, std::string> offered = offer_(hello);
  if (const auto* why = std::get_if<std::string>(&offered)) return refuse(*why);
  const int world_rank = std::get<int>(offered);
  write_frame(fd.get(),
              encode(Offer{world_rank, launched_ranks_, world_ranks_,
                                       wire::daemon_proof(key_, challenge.nonce, hello.nonce)}),
              deadline, who);
  std::vector<std::byte> address =
      decode_address(read_frame(fd.get(), kMaxFrameBytes, deadline, who), who);
  spdlog::info("join listener: {} on host {} takes world rank {}; the members reach it at their next boundary", who,
               hello.host, world_rank);
  std::unique_lock lock(mu_);
  arrival_ = JoinArrival{world_rank, hello.host, std::move(address)};
  waiting_for_ = world_rank;
  answer_.reset();
  // The boundary may wait for a migration under way: as long as the joiner does.
  const bool answered = answered_.wait_until(lock, std::chrono::steady_clock::now() + 4 * timeout_,
                                             [&] { return stopping_ || answer_.has_value(); });
  waiting_for_ = -1;
  if (!answered || stopping_) {
    const bool taken = !arrival_;
    arrival_.reset();
    lock.unlock();
    write_frame(fd.get(), encode_refusal(stopping_ ? "the job is ending" : "the job did not reach it in time"),
                TcpClock::now() + timeout_, who);
    MOED_THROW(Runtime, "world rank {} was {} answered within {} ms{}", world_rank, taken ? "reached but not" : "not",
               4 * timeout_.count(), taken ? " (it may still be admitted; it will not be heard from)" : "");
  }
  std::variant<Welcome, std::string> welcome = std::move(*answer_);
  answer_.reset();
  lock.unlock();
  if (const auto* why = std::get_if<std::string>(&welcome)) return refuse(*why);
  write_frame(fd.get(), encode(std::get<Welcome>(welcome)), TcpClock::now() + timeout_, who);
}

}  // namespace moed::runtime::join
