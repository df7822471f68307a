#include "client/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace moed::wire {

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw std::runtime_error("key file " + path + ": " + why);
}

Proof hmac(const Key& key, std::string_view label, std::initializer_list<std::pair<const void*, std::size_t>> parts) {
  std::vector<std::uint8_t> message(label.begin(), label.end());
  for (const auto& [p, n] : parts) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    message.insert(message.end(), b, b + n);
  }
  Proof out{};
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), key.data(), int(key.size()), message.data(), message.size(), out.data(), &length) ||
      length != out.size())
    throw std::runtime_error("HMAC-SHA-256 failed (OpenSSL)");
  return out;
}

}  // namespace

Key read_key_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) refuse(path, std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) refuse(path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(path, "not a regular file");
  if ((st.st_mode & 0077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    refuse(path, std::string("mode ") + mode + " lets others read or write the key; chmod 600 it");
  }
  if (st.st_size < off_t(kMinKeyBytes) || st.st_size > off_t(kMaxKeyBytes))
    refuse(path, "holds " + std::to_string(st.st_size) + " bytes; a key is " + std::to_string(kMinKeyBytes) +
                     " to " + std::to_string(kMaxKeyBytes) + " bytes (e.g. head -c 32 /dev/urandom)");
  Key key(std::size_t(st.st_size));
  std::size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = ::read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) refuse(path, n < 0 ? std::strerror(errno) : "shorter than its size");
    got += std::size_t(n);
  }
  return key;
}

Nonce make_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) throw std::runtime_error("RAND_bytes failed (OpenSSL)");
  return n;
}

Proof client_proof(const Key& key, const Nonce& daemon_nonce, const Nonce& client_nonce, const Hello& hello) {
  return hmac(key, "moed-client-1", {{daemon_nonce.data(), daemon_nonce.size()},
                                     {client_nonce.data(), client_nonce.size()},
                                     {&hello.slots, sizeof hello.slots},
                                     {&hello.max_rows, sizeof hello.max_rows}});
}

Proof daemon_proof(const Key& key, const Nonce& daemon_nonce, const Nonce& client_nonce) {
  return hmac(key, "moed-daemon-1", {{client_nonce.data(), client_nonce.size()},
                                     {daemon_nonce.data(), daemon_nonce.size()}});
}

Proof joiner_proof(const Key& key, const Nonce& daemon_nonce, const Nonce& joiner_nonce, std::string_view hello) {
  return hmac(key, "moed-join-1", {{daemon_nonce.data(), daemon_nonce.size()},
                                   {joiner_nonce.data(), joiner_nonce.size()},
                                   {hello.data(), hello.size()}});
}

bool same_proof(const Proof& a, const Proof& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace moed::wire
