// What a process started after the job (`moed --join HOST:PORT`) and world
// rank 0's join listener say to each other, over TCP in frames
// (common/tcp_socket.h), each a JSON object:
//
//   1. listener -> joiner  Challenge: the listener's nonce.
//   2. joiner -> listener  Hello: the joiner's command (mode and the hash of
//      its effective config, which must be the job's), its host, the compact
//      products it can run, its nonce, and its proof of the cluster's key
//      over both nonces and all it said (client/auth.h).
//   3. listener -> joiner  Offer: the world rank it takes (a join slot), the
//      job's launched and world ranks, and the listener's own proof; or a
//      refusal naming why.
//   4. joiner -> listener  its UCX worker address.
//   5. listener -> joiner  Welcome, once every member has reached that
//      address (at a step boundary): every world rank's worker address and
//      host as rank 0 knows them (empty for none), the islands, the ranks
//      that served at start, the current view, and the products the job
//      multiplies compact experts with; or a refusal.
//
// Pure: encoding, and decoding that names what is wrong in a message
// (Runtime errors: what came over the wire is not the operator's input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/auth.h"
#include "comm/membership.h"
#include "common/error.h"

namespace moed::runtime::join {

inline constexpr int kVersion = 1;
inline constexpr std::size_t kMaxFrameBytes = std::size_t(4) << 20;

struct Challenge {
  wire::Nonce nonce{};
  bool operator==(const Challenge&) const = default;
};

struct Hello {
  std::string command;  // "serve with configuration <hash>": the job's own
  std::string host;
  int products_ability = 0;  // what the joiner's CPU runs (the job's agreement's scale)
  wire::Nonce nonce{};
  wire::Proof proof{};       // joiner_proof over the challenge, nonce and signed_text()
  // The part of the hello the proof covers.
  std::string signed_text() const;
  bool operator==(const Hello&) const = default;
};

struct Offer {
  int world_rank = -1;
  int launched_ranks = 0, world_ranks = 0;  // world_ranks = launched + [comm].join_slots
  wire::Proof proof{};                      // daemon_proof: the listener holds the key too
  bool operator==(const Offer&) const = default;
};

struct Welcome {
  std::vector<std::vector<std::byte>> addresses;  // by world rank; empty: none known (absent or lost)
  std::vector<std::string> hosts;                 // by world rank; empty: none
  std::vector<int> islands;                       // by world rank
  int serving_ranks = 0;                          // those that served at start: 0 .. serving_ranks - 1
  comm::View view;                                      // the members now
  std::string products;                           // the job's compact products ("f32", "bf16", "amx")
  bool operator==(const Welcome&) const = default;
};

std::string encode(const Challenge& m);
std::string encode(const Hello& m);
std::string encode(const Offer& m);
std::string encode_address(const std::vector<std::byte>& address);
std::string encode(const Welcome& m);
// A refusal in place of an Offer or a Welcome.
std::string encode_refusal(const std::string& why);

// Each throws a Runtime error naming `from` and the fault; a refusal
// becomes a JoinRefused carrying the listener's words.
Challenge decode_challenge(const std::string& text, const std::string& from);
Hello decode_hello(const std::string& text, const std::string& from);
Offer decode_offer(const std::string& text, const std::string& from);
std::vector<std::byte> decode_address(const std::string& text, const std::string& from);
Welcome decode_welcome(const std::string& text, const std::string& from);

class JoinRefused : public Error {
 public:
  JoinRefused(const std::string& why, const char* file, int line) : Error(ErrorKind::Usage, why, file, line) {}
};

}  // namespace moed::runtime::join
