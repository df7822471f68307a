// TCP frames under deadlines (common/tcp_socket.h): a frame crosses intact,
// a frame longer than the reader takes is refused before it is read, a
// silent peer ends the wait at the deadline, and a closed one is named.
#include "common/tcp_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "tests/unit/test_support.h"

namespace moed {
namespace {

using namespace std::chrono_literals;

struct Pair {
  UniqueFd client, server;
  Pair() {
    ListenAddress address{"127.0.0.1", 0};
    UniqueFd listener = listen_tcp(address, "test");
    EXPECT_NE(address.port, 0);
    client = connect_tcp(address, TcpClock::now() + 1s, "test");
    for (int tries = 0; !server && tries < 1000; ++tries) {
      server = UniqueFd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!server) std::this_thread::sleep_for(1ms);
    }
  }
};

TEST(TcpSocket, AFrameCrossesIntact) {
  Pair p;
  const std::string big(300000, 'x');  // more than a socket buffer: written as the reader reads
  auto sent = std::async(std::launch::async, [&] {
    write_frame(p.client.get(), "hello", TcpClock::now() + 2s, "test");
    write_frame(p.client.get(), big, TcpClock::now() + 2s, "test");
    write_frame(p.client.get(), "", TcpClock::now() + 2s, "test");
  });
  EXPECT_EQ(read_frame(p.server.get(), 1 << 20, TcpClock::now() + 2s, "test"), "hello");
  EXPECT_EQ(read_frame(p.server.get(), 1 << 20, TcpClock::now() + 2s, "test"), big);
  EXPECT_EQ(read_frame(p.server.get(), 1 << 20, TcpClock::now() + 2s, "test"), "");
  sent.get();
}

TEST(TcpSocket, TooLongASilentAndAClosedPeerAreNamed) {
  Pair p;
  write_frame(p.client.get(), std::string(100, 'y'), TcpClock::now() + 1s, "test");
  test::expect_error([&] { read_frame(p.server.get(), 99, TcpClock::now() + 1s, "the joiner"); }, ErrorKind::Runtime,
                     {"the joiner", "a frame of 100 bytes announced, at most 99"});
  Pair q;
  test::expect_error([&] { read_frame(q.server.get(), 99, TcpClock::now() + 50ms, "the joiner"); }, ErrorKind::Runtime,
                     {"nothing came before the deadline"});
  q.client.reset();
  test::expect_error([&] { read_frame(q.server.get(), 99, TcpClock::now() + 1s, "the joiner"); }, ErrorKind::Runtime,
                     {"closed the connection"});
}

TEST(TcpSocket, AnAddressInUseIsAUsageErrorNamingTheKey) {
  ListenAddress address{"127.0.0.1", 0};
  UniqueFd first = listen_tcp(address, "[comm].join_listen");
  test::expect_error([&] { listen_tcp(address, "[comm].join_listen"); }, ErrorKind::Usage,
                     {"[comm].join_listen", "the port is in use"});
}

}  // namespace
}  // namespace moed
