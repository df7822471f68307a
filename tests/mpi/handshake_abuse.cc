// Abuses a rank's network front door from another host, as a hostile or
// broken peer would, and says what the daemon answered; exit 0 when the
// daemon answered as it must, 1 otherwise.
//
//   handshake_abuse --address ucx://HOST:PORT --stall N --limit-s S
//       opens N connections at once that read their challenge and never log
//       in (a stalled handshake; past [ingress].max_handshakes_per_peer a
//       flood, whose connection requests the daemon rejects), then waits for
//       the daemon to drop each stalled one. Prints how many were challenged
//       and how many refused at once; fails if a connection gets no answer,
//       or a stalled one is still open, after S seconds.
//   handshake_abuse --address ucx://HOST:PORT --replay --key-file K
//       logs in with key K, then sends the same login on a new connection:
//       its proof answers the first connection's challenge, not the second's,
//       so the daemon must refuse it (forbidden).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "tests/unit/raw_peer.h"

namespace {

using moed::test::RawPeer;
namespace wire = moed::wire;

std::optional<wire::Nonce> challenge_of(RawPeer& p, int timeout_ms) {
  std::string error;
  const auto f = p.next(timeout_ms);
  if (!f || f->type != wire::Type::challenge) return std::nullopt;
  const auto c = wire::decode_challenge(f->payload, error);
  return c ? std::optional(c->nonce) : std::nullopt;
}

int stall(const std::string& address, int count, int limit_ms) {
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i < count; ++i) peers.push_back(std::make_unique<RawPeer>(address));
  int challenged = 0, refused = 0;
  std::vector<RawPeer*> stalled;
  for (auto& p : peers) {
    std::string error;
    const auto f = p->next(limit_ms);
    if (f && f->type == wire::Type::challenge) {
      ++challenged;
      stalled.push_back(p.get());
    } else if (!f && !p->timed_out()) {
      ++refused;  // the connection request rejected: closed before any frame
    } else {
      std::cerr << "handshake_abuse: a connection got " << (f ? "a frame other than a challenge" : "no answer")
                << " within " << limit_ms << " ms\n";
      return 1;
    }
  }
  std::cout << "stalled " << challenged << " handshakes; " << refused << " refused at once" << std::endl;
  for (RawPeer* p : stalled) {
    while (p->next(limit_ms)) {}  // anything but a close: read on
    if (p->timed_out()) {
      std::cerr << "handshake_abuse: a stalled handshake is still open after " << limit_ms << " ms\n";
      return 1;
    }
  }
  std::cout << "the daemon dropped every stalled handshake" << std::endl;
  return 0;
}

int replay(const std::string& address, const std::string& key_file, int limit_ms) {
  const wire::Key key = wire::read_key_file(key_file);
  wire::Login login;
  login.hello = {1, 1};
  login.client_nonce = wire::make_nonce();
  std::vector<std::byte> recorded;
  {
    RawPeer first(address);
    const auto nonce = challenge_of(first, limit_ms);
    if (!nonce) return std::cerr << "handshake_abuse: no challenge on the first connection\n", 1;
    login.proof = wire::client_proof(key, *nonce, login.client_nonce, login.hello);
    recorded = wire::encode(login);
    first.send(recorded);
    const auto accepted = first.next(limit_ms);
    if (!accepted || accepted->type != wire::Type::accepted)
      return std::cerr << "handshake_abuse: the honest login was not accepted (is the key the cluster's?)\n", 1;
  }
  RawPeer again(address);
  if (!challenge_of(again, limit_ms)) return std::cerr << "handshake_abuse: no challenge on the second connection\n", 1;
  again.send(recorded);
  const auto answer = again.next(limit_ms);
  std::string error;
  const auto refusal = answer && answer->type == wire::Type::error ? wire::decode_error(answer->payload, error)
                                                                   : std::nullopt;
  if (!refusal || refusal->status != wire::Status::forbidden) {
    std::cerr << "handshake_abuse: the replayed login was not refused as forbidden\n";
    return 1;
  }
  std::cout << "the replayed login was refused: " << refusal->message << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"handshake_abuse: abuses a rank's network front door and checks the answers"};
  std::string address, key_file;
  int count = 0, limit_s = 60;
  bool replayed = false;
  app.add_option("--address", address, "the rank's ucx://HOST:PORT")->required();
  auto* stall_opt = app.add_option("--stall", count, "connections that never log in")->check(CLI::Range(1, 1000));
  auto* replay_opt = app.add_flag("--replay", replayed, "replay an honest login on a new connection");
  app.add_option("--key-file", key_file, "the cluster's key (--replay)");
  app.add_option("--limit-s", limit_s, "how long to wait for each of the daemon's answers")->check(CLI::Range(1, 600));
  stall_opt->excludes(replay_opt);
  CLI11_PARSE(app, argc, argv);
  if (address.rfind("ucx://", 0) != 0) return std::cerr << "handshake_abuse: --address must be ucx://HOST:PORT\n", 2;
  try {
    if (replayed) {
      if (key_file.empty()) return std::cerr << "handshake_abuse: --replay needs --key-file\n", 2;
      return replay(address, key_file, limit_s * 1000);
    }
    if (count == 0) return std::cerr << "handshake_abuse: give --stall N or --replay\n", 2;
    return stall(address, count, limit_s * 1000);
  } catch (const std::exception& e) {
    std::cerr << "handshake_abuse: " << e.what() << "\n";
    return 1;
  }
}
