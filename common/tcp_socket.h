// TCP for the few plain-socket services besides the front door: a
// listening socket on a ListenAddress (the metrics endpoint, the join
// listener), a connection to one with a deadline, and length-prefixed
// frames (4 bytes little-endian, then the payload) read and written under
// a deadline, so that a silent or slow peer never holds a thread forever.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "common/listen_address.h"
#include "common/unique_fd.h"

namespace moed {

using TcpClock = std::chrono::steady_clock;

// A non-blocking listening socket on `address` (SO_REUSEADDR, never
// SO_REUSEPORT); its port is filled in when it was 0. A Usage error naming
// `key` when the address cannot be bound (in use, not this host's).
UniqueFd listen_tcp(ListenAddress& address, const std::string& key);

// A non-blocking connection to `address`, made before `deadline`; a Runtime
// error naming `what` otherwise (refused, unreachable, timed out).
UniqueFd connect_tcp(const ListenAddress& address, TcpClock::time_point deadline, const std::string& what);

// One frame of at most `max_bytes`; a Runtime error naming `what` when the
// deadline passes, the peer closes, or it announces a longer frame.
void write_frame(int fd, std::string_view payload, TcpClock::time_point deadline, const std::string& what);
std::string read_frame(int fd, std::size_t max_bytes, TcpClock::time_point deadline, const std::string& what);

}  // namespace moed
