// The network door's challenge-response: proofs that bind the key, both
// nonces and the side that made them, and key files that only their owner
// can read.
#include "client/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

namespace moed::wire {
namespace {

// Expects `f` to throw a std::runtime_error whose message holds `part`.
void expect_refusal(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << part << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

Key key_of(std::uint8_t fill) { return Key(32, fill); }
Nonce nonce_of(std::uint8_t fill) {
  Nonce n{};
  n.fill(fill);
  return n;
}

TEST(Auth, AProofDependsOnTheKeyBothNoncesAndTheHello) {
  const Hello hello{4, 256};
  const Proof p = client_proof(key_of(1), nonce_of(2), nonce_of(3), hello);
  EXPECT_TRUE(same_proof(p, client_proof(key_of(1), nonce_of(2), nonce_of(3), hello)));
  EXPECT_FALSE(same_proof(p, client_proof(key_of(9), nonce_of(2), nonce_of(3), hello)));
  EXPECT_FALSE(same_proof(p, client_proof(key_of(1), nonce_of(9), nonce_of(3), hello)));  // a replay to another challenge
  EXPECT_FALSE(same_proof(p, client_proof(key_of(1), nonce_of(2), nonce_of(9), hello)));
  EXPECT_FALSE(same_proof(p, client_proof(key_of(1), nonce_of(2), nonce_of(3), Hello{8, 256})));
}

TEST(Auth, TheDaemonsProofIsNotTheClients) {
  // Same key and nonces: one side's proof reflected back is not the other's.
  const Proof daemon = daemon_proof(key_of(1), nonce_of(2), nonce_of(3));
  EXPECT_FALSE(same_proof(daemon, client_proof(key_of(1), nonce_of(2), nonce_of(3), Hello{0, 0})));
  EXPECT_TRUE(same_proof(daemon, daemon_proof(key_of(1), nonce_of(2), nonce_of(3))));
  EXPECT_FALSE(same_proof(daemon, daemon_proof(key_of(1), nonce_of(3), nonce_of(2))));
}

TEST(Auth, KnownAnswer) {
  // HMAC-SHA-256 of key 32 x 0x01 over "moed-daemon-1" | 32 x 0x03 | 32 x 0x02,
  // computed independently (python3: hmac.new(b'\x01'*32, b'moed-daemon-1' + b'\x03'*32 + b'\x02'*32, 'sha256')).
  const Proof p = daemon_proof(key_of(1), nonce_of(2), nonce_of(3));
  std::string hex;
  for (std::uint8_t b : p) hex += "0123456789abcdef"[b >> 4], hex += "0123456789abcdef"[b & 15];
  EXPECT_EQ(hex, "8cf843daa454e23adf0b9ce265192016e43dab249424843720ce4f0793d6166c");
}

TEST(Auth, NoncesAreFresh) { EXPECT_NE(make_nonce(), make_nonce()); }

TEST(Auth, KeyFilesMustBeTheOwnersAlone) {
  char dir[] = "/tmp/moed_auth_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/key";
  std::ofstream(path) << std::string(32, 'k');
  ::chmod(path.c_str(), 0644);
  expect_refusal([&] { read_key_file(path); }, "mode 0644");
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_key_file(path), Key(32, 'k'));
  ::chmod(path.c_str(), 0400);
  EXPECT_EQ(read_key_file(path).size(), 32u);
  ::chmod(path.c_str(), 0600);
  std::ofstream(path) << "short";
  expect_refusal([&] { read_key_file(path); }, "holds 5 bytes");
  expect_refusal([&] { read_key_file(std::string(dir) + "/none"); }, "No such file");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moed::wire
