// The address an HTTP endpoint listens on, parsed from a config value such
// as "127.0.0.1:9464". A bare port binds loopback only: moed is never
// reachable beyond the host unless the config names an address.
#pragma once

#include <string>
#include <string_view>

namespace moed {

struct ListenAddress {
  std::string host;  // a numeric IPv4 or IPv6 address ("127.0.0.1", "::1", "0.0.0.0")
  int port = 0;      // 0: any free port (the one bound is logged)
  bool operator==(const ListenAddress&) const = default;
  // "127.0.0.1:9464", "[::1]:9464"
  std::string describe() const;
};

// Accepts "PORT" (loopback), "HOST:PORT" with HOST a numeric IPv4 address or
// "localhost", and "[IPV6]:PORT". Throws a Usage error naming `key` and the
// value otherwise (":PORT" too: whether it meant every interface or loopback
// is ambiguous, so it must be said).
ListenAddress parse_listen_address(std::string_view text, std::string_view key);

}  // namespace moed
