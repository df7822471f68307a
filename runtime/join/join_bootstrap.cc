#include "runtime/join/join_bootstrap.h"

#include <fmt/format.h>

#include "common/tcp_socket.h"

namespace moed::runtime::join {

JoinBootstrap::JoinBootstrap(const ListenAddress& listener, const wire::Key& key, const std::string& command,
                             const std::string& host, int products_ability, std::chrono::milliseconds timeout)
    : listener_(listener), from_(fmt::format("the join listener at {}", listener.describe())), timeout_(timeout) {
  const auto deadline = TcpClock::now() + timeout_;
  fd_ = connect_tcp(listener_, deadline, from_);
  const Challenge challenge =
      decode_challenge(read_frame(fd_.get(), kMaxFrameBytes, deadline, from_), from_);
  Hello hello{command, host, products_ability, wire::make_nonce(), {}};
  hello.proof = wire::joiner_proof(key, challenge.nonce, hello.nonce, hello.signed_text());
  write_frame(fd_.get(), encode(hello), deadline, from_);
  offer_ = decode_offer(read_frame(fd_.get(), kMaxFrameBytes, deadline, from_), from_);
  if (!wire::same_proof(offer_.proof, wire::daemon_proof(key, challenge.nonce, hello.nonce)))
    MOED_THROW(Runtime, "{} could not prove it holds the cluster's key: not joining it", from_);
}

std::vector<std::vector<std::byte>> JoinBootstrap::all_gather(std::span<const std::byte> mine, const std::string& what) {
  MOED_CHECK(!welcome_, "{}: a joiner gathers the worker addresses once", what);
  write_frame(fd_.get(), encode_address(std::vector<std::byte>(mine.begin(), mine.end())),
              TcpClock::now() + timeout_, from_);
  // The members reach this rank at their next step boundary (after a
  // migration under way): rank 0 answers within its own deadline.
  welcome_ = decode_welcome(
      read_frame(fd_.get(), kMaxFrameBytes, TcpClock::now() + 4 * timeout_, from_ + " (" + what + ")"), from_);
  if (int(welcome_->addresses.size()) != offer_.world_ranks)
    MOED_THROW(Runtime, "{}: a welcome for {} world ranks after an offer of {}", from_, welcome_->addresses.size(),
               offer_.world_ranks);
  fd_.reset();
  return welcome_->addresses;
}

const Welcome& JoinBootstrap::welcome() const {
  MOED_CHECK(welcome_.has_value(), "{}: no welcome yet", from_);
  return *welcome_;
}

}  // namespace moed::runtime::join
