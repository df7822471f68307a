// The survivors' agreement over real UCX endpoints, ranks as threads of the
// test (comm/survivor_agreement.h over the UCX transport's PeerMessenger):
// - peer messages of every size arrive whole beside exchanges, more of them
//   than the receives kept posted, and a message too long is refused;
// - a rank that goes silent (stopped) is dropped by the other three, which
//   decide the same view, and when it comes back it learns it was fenced;
// - over tcp, a rank whose process dies (its worker destroyed unclosed) is
//   found by the survivors' endpoints alone, with no deadline involved;
// - a message that does not decode, or lies about its sender, is dropped;
// - the survivors go on over the same transport: an exchange that waits for
//   the dead rank ends in PeersUnreachable naming it, the agreement decides,
//   and continue_with() gives dense ranks whose exchanges, windows and
//   control collectives work,
//   with the messages of the exchange cut short never matched by a later one.
// No wait depends on the machine's speed: every loop waits for a state,
// under a generous limit that only a hang reaches.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/control_channel.h"
#include "comm/membership_wire.h"
#include "comm/peer_messenger.h"
#include "comm/survivor_agreement.h"
#include "comm/transport.h"
#include "comm/transport_control_link.h"
#include "common/error.h"
#include "tests/unit/comm/run_ranks.h"
#include "tests/unit/comm/ucx_environment.h"

namespace moed::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kHangLimit = std::chrono::seconds(60);
// A round's deadline no healthy test thread should reach.
constexpr auto kRound = std::chrono::seconds(5);

std::unique_ptr<Transport> ucx_transport(Bootstrap& bootstrap, bool detect_lost_peers) {
  CommConfig config;
  config.backend = Backend::ucx;
  config.timeout_ms = 20000;
  config.detect_lost_peers = detect_lost_peers;
  return create_transport(config, bootstrap);
}

View whole_world(int ranks) {
  View view;
  for (int r = 0; r < ranks; ++r) view.members.push_back(r);
  return view;
}

// Polls until `done` holds; fails the test past kHangLimit.
template <class Done, class Poll>
void wait_for(const char* what, Done&& done, Poll&& poll) {
  const auto give_up = Clock::now() + kHangLimit;
  while (!done()) {
    poll();
    if (Clock::now() > give_up) MOED_THROW(Runtime, "test: {} did not happen within {} s", what, kHangLimit.count());
  }
}

// What a serving rank does: poll between steps, and once an agreement is
// under way, run it; until `epoch` is decided.
const View& serve_until_epoch(SurvivorAgreement& agreement, std::uint64_t epoch) {
  wait_for(
      "the decision", [&] { return agreement.view().epoch >= epoch || agreement.fenced(); },
      [&] {
        if (agreement.poll()) agreement.agree(kHangLimit);
      });
  return agreement.view();
}

std::byte message_byte(int from, int to, int index, std::size_t i) {
  return std::byte((from * 31 + to * 7 + index * 13 + int(i % 251)) & 0xFF);
}

std::size_t message_bytes(int index) {
  switch (index % 4) {
    case 0: return 0;
    case 1: return 1;
    case 2: return 300 + std::size_t(index);
    default: return kPeerMessageMaxBytes;
  }
}

TEST(PeerMessages, ArriveWholeBesideExchangesAndATooLongOneIsRefused) {
  constexpr int kRanks = 3, kPerPeer = 24;  // more than the receives kept posted
  test::run_ranks(kRanks, [](Bootstrap& bootstrap) {
    std::unique_ptr<Transport> t = ucx_transport(bootstrap, false);
    PeerMessenger& messenger = *t->messenger();
    ASSERT_EQ(t->messenger(), &messenger) << "one messenger for the transport's life";
    const int me = t->rank();
    for (int index = 0; index < kPerPeer; ++index) {
      for (int peer = 0; peer < kRanks; ++peer) {
        if (peer == me) continue;
        std::vector<std::byte> bytes(message_bytes(index));
        for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = message_byte(me, peer, index, i);
        messenger.post(peer, bytes);
      }
      if (index == kPerPeer / 2) {  // an exchange in the middle: neither kind matches the other's receives
        std::vector<std::uint64_t> send(kRanks, std::uint64_t(me)), recv(kRanks);
        t->exchange_sizes(send.data(), recv.data(), "test: sizes between peer messages");
        for (int r = 0; r < kRanks; ++r) EXPECT_EQ(recv[std::size_t(r)], std::uint64_t(r));
      }
    }
    std::vector<std::byte> too_long(kPeerMessageMaxBytes + 1);
    EXPECT_THROW(messenger.post((me + 1) % kRanks, too_long), Error);

    // Messages from one sender may come in any order: match them by size and content.
    std::vector<std::vector<int>> seen(kRanks, std::vector<int>(kPerPeer, 0));
    int arrived = 0;
    wait_for(
        "every peer message", [&] { return arrived == (kRanks - 1) * kPerPeer; },
        [&] {
          std::optional<PeerMessage> m = messenger.poll();
          if (!m) return;
          ASSERT_TRUE(m->from >= 0 && m->from < kRanks && m->from != me) << m->from;
          int matched = -1;
          for (int index = 0; index < kPerPeer && matched < 0; ++index) {
            if (seen[std::size_t(m->from)][std::size_t(index)] || m->bytes.size() != message_bytes(index)) continue;
            bool same = true;
            for (std::size_t i = 0; i < m->bytes.size() && same; ++i)
              same = m->bytes[i] == message_byte(m->from, me, index, i);
            if (same) matched = index;
          }
          ASSERT_GE(matched, 0) << "rank " << me << ": a message of " << m->bytes.size() << " bytes from rank "
                                << m->from << " matches none sent";
          seen[std::size_t(m->from)][std::size_t(matched)] = 1;
          ++arrived;
        });
    EXPECT_FALSE(messenger.poll().has_value()) << "a message beyond those sent";
    EXPECT_TRUE(messenger.take_lost_peers().empty());
    std::vector<std::uint64_t> send(kRanks, 1), recv(kRanks);
    t->exchange_sizes(send.data(), recv.data(), "test: every rank has its messages");
  });
}

TEST(SurvivorAgreement, ASilentRankIsDroppedAndLearnsItWasFencedWhenItComesBack) {
  constexpr int kRanks = 4, kStopped = 3;
  std::atomic<int> decided{0};
  std::vector<View> views(kRanks);
  std::vector<std::uint64_t> dropped(kRanks);
  std::atomic<bool> stopped_rank_fenced{false};
  test::run_ranks(
      kRanks,
      [&](Bootstrap& bootstrap) {
        std::unique_ptr<Transport> t = ucx_transport(bootstrap, false);
        const int me = t->rank();
        SurvivorAgreement agreement(*t->messenger(), whole_world(kRanks), kRound);
        if (me == kStopped) {
          // Stopped: it neither answers nor progresses until the others decided.
          while (decided.load() < kRanks - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          wait_for("the stopped rank's fencing", [&] { return agreement.fenced(); }, [&] { agreement.poll(); });
          stopped_rank_fenced = true;
          views[std::size_t(me)] = agreement.view();
          return;
        }
        if (me == 2) {
          // Noise before the loss: bytes that do not decode, and a true
          // message that names another sender.
          const std::byte junk[3] = {std::byte{9}, std::byte{9}, std::byte{9}};
          t->messenger()->post(0, junk);
          MembershipMessage lie;
          lie.kind = MembershipMessage::Kind::suspect;
          lie.from = 1;
          lie.to = 0;
          lie.epoch = 1;
          lie.suspected = 2;
          const std::string bytes = encode(lie);
          t->messenger()->post(0, std::as_bytes(std::span(bytes.data(), bytes.size())));
        }
        if (me == 1) agreement.suspect(kStopped);  // its exchange with rank 3 missed the deadline
        views[std::size_t(me)] = serve_until_epoch(agreement, 1);
        ++decided;
        // Serve on until the stopped rank is fenced, answering it if asked.
        wait_for("the fencing", [&] { return stopped_rank_fenced.load(); }, [&] { agreement.poll(); });
        dropped[std::size_t(me)] = agreement.dropped_messages();
      },
      kHangLimit);
  const View survivors{1, {0, 1, 2}};
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(views[std::size_t(r)], survivors) << "rank " << r;
  EXPECT_TRUE(stopped_rank_fenced);
  EXPECT_EQ(dropped[0], 2u) << "the junk and the lie";
}

// 4 ranks over tcp whose transports report lost peers: each opens its
// transport and agreement and runs `before_loss`; then world rank 3 dies
// (its worker goes unclosed, as a killed process's), and the other three run
// `survive` and keep their endpoints open until all three are done (one
// leaving early would be a second loss). Returns each survivor's view at
// its end.
constexpr int kRanks = 4, kDead = 3;
std::vector<View> with_rank_3_dead(const std::function<void(Transport&)>& before_loss,
                                   const std::function<void(Transport&, SurvivorAgreement&)>& survive) {
  test::UcxEnvironment env({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}});
  struct Crash {};
  std::atomic<int> done{0};
  std::vector<View> views(kRanks);
  test::run_ranks(
      kRanks,
      [&](Bootstrap& bootstrap) {
        try {
          std::unique_ptr<Transport> t = ucx_transport(bootstrap, true);
          SurvivorAgreement agreement(*t->messenger(), whole_world(kRanks), kRound);
          before_loss(*t);
          if (t->world_rank(t->rank()) == kDead) throw Crash{};
          survive(*t, agreement);
          views[std::size_t(t->world_rank(t->rank()))] = agreement.view();
          ++done;
          wait_for("every survivor's end", [&] { return done.load() == kRanks - 1; }, [&] { agreement.poll(); });
        } catch (const Crash&) {
        }
      },
      kHangLimit);
  views.pop_back();
  return views;
}

TEST(SurvivorAgreement, OverTcpADeadRankIsFoundByTheEndpointsAlone) {
  const std::vector<View> views = with_rank_3_dead(
      [](Transport& t) {  // one exchange first, so that every endpoint has carried data
        std::vector<std::uint64_t> send(kRanks, 0), recv(kRanks);
        t.exchange_sizes(send.data(), recv.data(), "test: sizes before the loss");
      },
      [](Transport&, SurvivorAgreement& agreement) { serve_until_epoch(agreement, 1); });
  for (const View& view : views) EXPECT_EQ(view, (View{1, {0, 1, 2}}));
}

std::byte block_byte(std::uint64_t epoch, int from, int to, std::size_t i) {
  return std::byte((epoch * 101 + std::uint64_t(from) * 31 + std::uint64_t(to) * 7 + i) & 0xFF);
}

// One exchange of `bytes` per pair among the transport's ranks, whose
// blocks carry (epoch, sender's world rank, receiver's world rank).
void exchange_blocks(Transport& t, std::uint64_t epoch, std::size_t bytes, const std::string& what) {
  const int n = t.size(), me = t.rank();
  ExchangeLayout layout;
  layout.send_bytes.assign(std::size_t(n), bytes);
  layout.recv_bytes.assign(std::size_t(n), bytes);
  layout.send_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
  layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
  std::vector<std::byte> send(layout.send_total()), recv(layout.recv_total());
  for (int to = 0; to < n; ++to)
    for (std::size_t i = 0; i < bytes; ++i)
      send[layout.send_offsets[std::size_t(to)] + i] = block_byte(epoch, t.world_rank(me), t.world_rank(to), i);
  t.exchange(send.data(), layout, recv.data(), what);
  for (int from = 0; from < n; ++from) {
    int wrong = 0;
    for (std::size_t i = 0; i < bytes; ++i)
      wrong += recv[layout.recv_offsets[std::size_t(from)] + i] !=
               block_byte(epoch, t.world_rank(from), t.world_rank(me), i);
    EXPECT_EQ(wrong, 0) << what << ": the block from world rank " << t.world_rank(from) << " to world rank "
                        << t.world_rank(me);
  }
}

TEST(SurvivorAgreement, TheSurvivorsGoOnOverTheSameTransportAsDenseRanks) {
  // Blocks this small go eagerly: a send completes as it is posted, so the
  // exchange cut short holds none of the buffers continue_with() waits for.
  constexpr int kBehind = 1;
  constexpr std::size_t kBlock = 64;
  const std::vector<View> views = with_rank_3_dead(
      [](Transport& t) { exchange_blocks(t, 0, kBlock, "test: the exchange before the loss"); },
      [](Transport& t, SurvivorAgreement& agreement) {
        const int me = t.rank();
        // Made before the loss: it numbers the ranks as the transport does at each call.
        const std::unique_ptr<ControlLink> control = transport_control_link(t);
        if (me == kBehind) {
          // Never opens the next exchange: the blocks the others send it
          // there stay unmatched, with the sequence number the second
          // exchange of the next epoch has.
          serve_until_epoch(agreement, 1);
        } else {
          try {
            exchange_blocks(t, 0, kBlock, "test: the exchange the loss cuts short");
            ADD_FAILURE() << "rank " << me << ": an exchange with a dead rank completed";
          } catch (const PeersUnreachable& e) {
            EXPECT_EQ(e.ranks(), std::vector<int>{kDead}) << e.what();
            for (int lost : e.ranks()) agreement.suspect(lost);
          }
          agreement.agree(kHangLimit);
        }
        {
          std::vector<std::size_t> none(std::size_t(kRanks), 0);
          std::unique_ptr<Exchange> still_open =
              t.open_exchange(nullptr, none, none, "test: left open", ReceiveSizes::exact);
          EXPECT_THROW(t.continue_with(agreement.view().members, agreement.view().epoch), Error);
        }
        t.continue_with(agreement.view().members, agreement.view().epoch);
        EXPECT_EQ(t.size(), kRanks - 1);
        EXPECT_EQ(t.rank(), me) << "world ranks below the lost one keep their number";
        exchange_blocks(t, 1, kBlock, "test: the first exchange of epoch 1");
        exchange_blocks(t, 1, kBlock, "test: the second exchange of epoch 1");
        // The control collectives over the survivors, rank 0 their root.
        EXPECT_EQ(control->size(), kRanks - 1);
        int word = me == 0 ? 77 : -1;
        control->broadcast(&word, sizeof word, "test: a broadcast over the survivors");
        EXPECT_EQ(word, 77);
        EXPECT_EQ(control->all_max(me * 10, "test: the largest over the survivors"), (kRanks - 2) * 10);
        EXPECT_EQ(control->all_gather_strings(std::to_string(t.world_rank(me)), "test: every survivor's name"),
                  (std::vector<std::string>{"0", "1", "2"}));
        std::unique_ptr<RmaWindow> window = t.create_window(kBlock * std::size_t(t.size()), "test: window");
        const int n = t.size();
        std::vector<std::vector<std::byte>> blocks(std::size_t(n), std::vector<std::byte>(std::size_t{kBlock}));
        for (int to = 0; to < n; ++to) {
          for (std::size_t i = 0; i < kBlock; ++i)
            blocks[std::size_t(to)][i] = block_byte(2, t.world_rank(me), t.world_rank(to), i);
          window->put(to, std::size_t(me) * kBlock, blocks[std::size_t(to)].data(), kBlock);
        }
        window->flush("test: the survivors' puts");
        exchange_blocks(t, 1, 1, "test: every survivor's puts landed");
        for (int from = 0; from < n; ++from) {
          int wrong = 0;
          for (std::size_t i = 0; i < kBlock; ++i)
            wrong += window->local()[std::size_t(from) * kBlock + i] !=
                     block_byte(2, t.world_rank(from), t.world_rank(me), i);
          EXPECT_EQ(wrong, 0) << "the put from world rank " << t.world_rank(from);
        }
      });
  for (const View& view : views) EXPECT_EQ(view, (View{1, {0, 1, 2}}));
}

}  // namespace
}  // namespace moed::comm
