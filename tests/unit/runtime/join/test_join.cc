// `moed --join` outside MPI (runtime/join/): the messages' wire form, and a
// joiner (JoinBootstrap) talking to a listener (JoinListener) over
// loopback: proven, offered a world rank, reached and welcomed; refused
// with the listener's words for the wrong key or what the daemon refuses;
// and a silent or unanswered joiner costing the listener nothing else.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "runtime/join/join_bootstrap.h"
#include "runtime/join/join_listener.h"
#include "runtime/join/join_wire.h"
#include "common/tcp_socket.h"
#include "tests/unit/test_support.h"

namespace moed::runtime::join {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(std::byte(v));
  return out;
}

Welcome a_welcome() {
  Welcome w;
  w.addresses = {bytes({1, 2}), {}, bytes({3}), bytes({4, 5, 6})};
  w.hosts = {"a", "", "b", "b"};
  w.islands = {0, 1, 2, 2};
  w.serving_ranks = 2;
  w.view = {3, {0, 2}};
  w.products = "bf16";
  return w;
}

TEST(JoinWire, EveryMessageSurvivesItsRoundTrip) {
  Challenge c{wire::make_nonce()};
  EXPECT_EQ(decode_challenge(encode(c), "t"), c);
  Hello h{"serve with configuration 0123", "node3", 2, wire::make_nonce(), {}};
  h.proof[5] = 9;
  EXPECT_EQ(decode_hello(encode(h), "t"), h);
  Offer o{5, 4, 6, {}};
  EXPECT_EQ(decode_offer(encode(o), "t"), o);
  EXPECT_EQ(decode_address(encode_address(bytes({0, 255, 17})), "t"), bytes({0, 255, 17}));
  EXPECT_EQ(decode_welcome(encode(a_welcome()), "t"), a_welcome());
}

TEST(JoinWire, ARefusalCarriesTheListenersWords) {
  try {
    decode_offer(encode_refusal("every join slot is taken"), "the join listener at x");
    FAIL() << "no refusal";
  } catch (const JoinRefused& e) {
    EXPECT_EQ(std::string(e.what()), "the join listener at x refused: every join slot is taken");
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(JoinWire, AMalformedMessageIsNamed) {
  using test::expect_error;
  const auto R = ErrorKind::Runtime;
  expect_error([] { decode_challenge("{", "peer"); }, R, {"peer", "not JSON"});
  expect_error([] { decode_challenge(R"({"join":2,"kind":"challenge","nonce":""})", "peer"); }, R,
               {"version 2"});
  expect_error([] { decode_offer(encode(Challenge{}), "peer"); }, R,
               {"a \"challenge\" came where its offer was expected"});
  expect_error([] { decode_challenge(R"({"join":1,"kind":"challenge","nonce":"00"})", "peer"); }, R,
               {"\"nonce\" holds 1 bytes, not 32"});
  expect_error([] { decode_address(R"({"join":1,"kind":"address","address":"0g"})", "peer"); }, R,
               {"not lowercase hex"});
  expect_error([] { decode_address(encode_address({}), "peer"); }, R, {"an empty worker address"});
  expect_error([] { decode_offer(encode(Offer{2, 4, 6, {}}), "peer"); }, R,
               {"world rank 2, outside the join slots [4, 6)"});
  Welcome w = a_welcome();
  w.hosts.pop_back();
  expect_error([&] { decode_welcome(encode(w), "peer"); }, R, {"one of each per world rank"});
  w = a_welcome();
  w.view.members = {0, 1};  // world rank 1 has no address
  expect_error([&] { decode_welcome(encode(w), "peer"); }, R, {"no address for member world rank 1"});
  w = a_welcome();
  w.view.members = {2, 0};
  expect_error([&] { decode_welcome(encode(w), "peer"); }, R, {"not ascending"});
}

// A listener on a free loopback port whose daemon hook offers world ranks
// 4, 5, ... to a joiner whose command is "job", refusing any other.
struct Listening {
  wire::Key key = wire::Key(32, 7);
  int next = 4;
  std::unique_ptr<JoinListener> listener;
  explicit Listening(std::chrono::milliseconds timeout = 2000ms) {
    JoinListener::SlotFor offer = [this](const Hello& hello) -> std::variant<int, std::string> {
      if (hello.command != "job") return std::string("it runs another command");
      return next++;
    };
    listener = std::make_unique<JoinListener>(ListenAddress{"127.0.0.1", 0}, key, 4, 6, std::move(offer), timeout);
  }
  // The daemon at its boundaries: the first arrival, once it comes.
  JoinArrival arrival() {
    for (;;) {
      std::vector<JoinArrival> got = listener->take_arrivals();
      if (!got.empty()) return got.front();
      std::this_thread::sleep_for(1ms);
    }
  }
};

TEST(JoinListener, AJoinerIsProvenOfferedReachedAndWelcomed) {
  Listening l;
  auto joined = std::async(std::launch::async, [&] {
    JoinBootstrap b(l.listener->address(), l.key, "job", "node9", 1, 2000ms);
    EXPECT_EQ(b.rank(), 4);
    EXPECT_EQ(b.size(), 4);
    EXPECT_EQ(b.offer().world_ranks, 6);
    std::vector<std::vector<std::byte>> addresses = b.all_gather(bytes({9, 9}), "addresses");
    EXPECT_EQ(b.welcome().products, "bf16");
    return addresses;
  });
  const JoinArrival arrival = l.arrival();
  EXPECT_EQ(arrival.world_rank, 4);
  EXPECT_EQ(arrival.host, "node9");
  EXPECT_EQ(arrival.address, bytes({9, 9}));
  Welcome w = a_welcome();
  w.addresses = {bytes({1}), bytes({2}), bytes({3}), bytes({4}), bytes({9, 9}), {}};
  w.hosts.resize(6);
  w.islands = {0, 0, 1, 1, 1, 2};
  l.listener->answer(4, w);
  EXPECT_EQ(joined.get(), w.addresses);
}

TEST(JoinListener, TheWrongKeyAndWhatTheDaemonRefusesAreToldToTheJoiner) {
  Listening l;
  test::expect_error([&] { JoinBootstrap(l.listener->address(), wire::Key(32, 8), "job", "h", 1, 2000ms); },
                     ErrorKind::Usage, {"refused: its proof of the cluster's key is wrong"});
  test::expect_error([&] { JoinBootstrap(l.listener->address(), l.key, "another job", "h", 1, 2000ms); },
                     ErrorKind::Usage, {"refused: it runs another command"});
  EXPECT_EQ(l.next, 4) << "no world rank was given to either";
}

TEST(JoinListener, ADaemonMayRefuseAJoinerItReached) {
  Listening l;
  auto joined = std::async(std::launch::async, [&] {
    JoinBootstrap b(l.listener->address(), l.key, "job", "h", 1, 2000ms);
    b.all_gather(bytes({1}), "addresses");
  });
  l.listener->answer(l.arrival().world_rank, std::string("a member could not reach it"));
  test::expect_error([&] { joined.get(); }, ErrorKind::Usage, {"refused: a member could not reach it"});
}

// A peer that connects and says nothing holds the listener one deadline;
// a joiner never answered is refused after its wait; the next one is heard.
TEST(JoinListener, ASilentOrUnansweredJoinerCostsOnlyItsOwnTime) {
  Listening l(200ms);
  {
    UniqueFd silent = connect_tcp(l.listener->address(), TcpClock::now() + 1s, "a silent peer");
    std::this_thread::sleep_for(300ms);
  }
  test::expect_error(
      [&] {
        JoinBootstrap b(l.listener->address(), l.key, "job", "h", 1, 2000ms);
        b.all_gather(bytes({1}), "addresses");  // nobody takes or answers it
      },
      ErrorKind::Usage, {"the job did not reach it in time"});
  auto joined = std::async(std::launch::async, [&] {
    JoinBootstrap b(l.listener->address(), l.key, "job", "h", 1, 2000ms);
    return b.rank();
  });
  EXPECT_EQ(joined.get(), 5) << "the unanswered joiner's slot is not given again";
}

TEST(JoinBootstrap, NoListenerIsARuntimeErrorNamingIt) {
  UniqueFd placeholder;
  ListenAddress nowhere{"127.0.0.1", 0};
  placeholder = listen_tcp(nowhere, "test");  // a port of ours that nobody accepts on...
  placeholder.reset();                        // ...and then nobody listens on
  test::expect_error([&] { JoinBootstrap(nowhere, wire::Key(32, 1), "job", "h", 1, 500ms); }, ErrorKind::Runtime,
                     {"the join listener at 127.0.0.1:", "cannot connect"});
}

}  // namespace
}  // namespace moed::runtime::join
