// Who may use the network front door: a client proves it holds the
// cluster's key by a challenge-response over HMAC-SHA-256 (OpenSSL's), so
// that the key never crosses the wire and an answer recorded on the wire is
// worth nothing on another connection (the daemon's nonce is fresh for
// each). The daemon proves it holds the key too, so a client cannot be
// drawn to an impostor. Both proofs name their side, so that one side's
// proof cannot be reflected back as the other's.
//
// What this does not do: rows and outputs travel unencrypted and without a
// per-message MAC, so whoever can read or write the link between a proven
// client and its rank can read or change them. Run it on a trusted fabric.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "client/protocol.h"

namespace moed::wire {

using Key = std::vector<std::uint8_t>;

inline constexpr std::size_t kMinKeyBytes = 32;
inline constexpr std::size_t kMaxKeyBytes = 4096;

// The key in a file: its bytes, as they are. Throws std::runtime_error
// naming the file unless it is a regular file that only its owner may read
// or write (mode 0600 or 0400) holding kMinKeyBytes to kMaxKeyBytes bytes.
Key read_key_file(const std::string& path);

// 32 bytes from OpenSSL's RAND_bytes (throws std::runtime_error if it fails).
Nonce make_nonce();

// The client's proof: HMAC(key, "moed-client-1" | daemon nonce | client nonce | slots | max_rows).
Proof client_proof(const Key& key, const Nonce& daemon_nonce, const Nonce& client_nonce, const Hello& hello);
// The daemon's proof: HMAC(key, "moed-daemon-1" | client nonce | daemon nonce).
Proof daemon_proof(const Key& key, const Nonce& daemon_nonce, const Nonce& client_nonce);
// A process joining a running job (`moed --join`): HMAC(key, "moed-join-1" |
// daemon nonce | joiner nonce | what it says of itself), so that what it
// claims (its command, its host) cannot be changed on the wire either.
Proof joiner_proof(const Key& key, const Nonce& daemon_nonce, const Nonce& joiner_nonce, std::string_view hello);
// In time that does not depend on where they differ.
bool same_proof(const Proof& a, const Proof& b);

}  // namespace moed::wire
