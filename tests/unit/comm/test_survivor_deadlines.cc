// The survivors' agreement's deadlines (comm/survivor_agreement.h) on a
// clock of the test's own, over an in-memory network that delivers at once
// between the ranks it connects and drops everything to or from a rank cut
// off. The scenario is the one a host whose link went down produced: 6
// ranks, ranks 4 and 5 (one host) cut off, and the 4 others noticing rank 5
// alone at their exchange's deadline (rank 4's data had arrived). Rank 0
// leads and must settle the silent rank 4 itself, a round after it began;
// the followers' deadlines must not pass before its proposal does, whatever
// order the ranks see the clock in. With one deadline for every role, the
// followers suspected their live leader at the moment it proposed, and
// competing leaders outbid each other past the agreement's limit.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "comm/peer_messenger.h"
#include "comm/survivor_agreement.h"

namespace moed::comm {
namespace {

using Clock = SurvivorAgreement::Clock;
constexpr std::chrono::milliseconds kRound(1000);
constexpr std::chrono::milliseconds kTick(kRound / 20);

// Every rank's inbox; messages to or from a rank cut off are dropped.
struct LocalNetwork {
  std::vector<std::deque<PeerMessage>> inbox;
  std::set<int> cut;
  Clock::time_point now{};
};

class LocalMessenger final : public PeerMessenger {
 public:
  LocalMessenger(LocalNetwork& network, int rank) : network_(network), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(network_.inbox.size()); }
  void post(int dest, std::span<const std::byte> bytes) override {
    if (network_.cut.count(rank_) || network_.cut.count(dest)) return;
    network_.inbox[std::size_t(dest)].push_back({rank_, std::vector<std::byte>(bytes.begin(), bytes.end())});
  }
  std::optional<PeerMessage> poll() override {
    std::deque<PeerMessage>& mine = network_.inbox[std::size_t(rank_)];
    if (mine.empty()) return std::nullopt;
    PeerMessage m = std::move(mine.front());
    mine.pop_front();
    return m;
  }
  std::vector<int> take_lost_peers() override { return {}; }  // no endpoint reports a cut-off rank

 private:
  LocalNetwork& network_;
  int rank_;
};

struct Outcome {
  std::chrono::milliseconds decided_after{-1};  // when the last live rank decided
  std::vector<View> views;
};

// `ranks` ranks, `cut` cut off from the start; the live ranks suspect
// `noticed` at time 0, then poll every tick, each tick in `order` (ranks
// cut off are never polled), until every live rank has decided or fenced.
Outcome run(int ranks, const std::set<int>& cut, int noticed, const std::vector<int>& order) {
  LocalNetwork network;
  network.inbox.resize(std::size_t(ranks));
  network.cut = cut;
  View world;
  for (int r = 0; r < ranks; ++r) world.members.push_back(r);
  std::vector<std::unique_ptr<LocalMessenger>> messengers;
  std::vector<std::unique_ptr<SurvivorAgreement>> agreements;
  for (int r = 0; r < ranks; ++r) {
    messengers.push_back(std::make_unique<LocalMessenger>(network, r));
    agreements.push_back(std::make_unique<SurvivorAgreement>(*messengers.back(), world, kRound, false,
                                                             [&network] { return network.now; }));
  }
  const Clock::time_point start = network.now;
  for (int r : order) agreements[std::size_t(r)]->suspect(noticed);
  Outcome outcome;
  for (int tick = 0; tick < 200; ++tick) {
    network.now = start + tick * kTick;
    // Within a tick, messages take no time: poll until every inbox is empty.
    bool busy = true;
    while (busy) {
      for (int r : order) agreements[std::size_t(r)]->poll();
      busy = false;
      for (int r : order) busy = busy || !network.inbox[std::size_t(r)].empty();
    }
    bool all_decided = true;
    for (int r : order)
      all_decided = all_decided && (agreements[std::size_t(r)]->fenced() || !agreements[std::size_t(r)]->agreeing());
    if (all_decided) {
      outcome.decided_after = std::chrono::duration_cast<std::chrono::milliseconds>(network.now - start);
      for (int r : order) outcome.views.push_back(agreements[std::size_t(r)]->view());
      return outcome;
    }
  }
  return outcome;
}

void expect_view(const View& view, const View& expected) {
  EXPECT_EQ(view.epoch, expected.epoch);
  EXPECT_EQ(view.members, expected.members) << "epoch " << view.epoch;
}

class SurvivorDeadlines : public ::testing::TestWithParam<bool> {};

TEST_P(SurvivorDeadlines, ALeaderSettlingASilentRankIsNotSuspectedByItsFollowers) {
  const std::vector<int> order = GetParam() ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{3, 2, 1, 0};
  const Outcome outcome = run(6, {4, 5}, 5, order);
  ASSERT_GE(outcome.decided_after.count(), 0) << "no decision within 10 rounds";
  const View survivors{1, {0, 1, 2, 3}};
  for (const View& view : outcome.views) expect_view(view, survivors);
  // The leader's one round, and the tick in which its deadline is seen to pass.
  EXPECT_LE(outcome.decided_after, kRound + kTick) << "the leader's round alone should settle rank 4";
}

TEST_P(SurvivorDeadlines, ALeaderCutOffIsSuspectedAfterTwoRoundsAndTheNextLeads) {
  // Ranks 0 and 5 cut off, the others noticing rank 5 alone: they wait two
  // rounds for rank 0, then rank 1 leads and settles rank 0 in one more.
  const std::vector<int> order = GetParam() ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{4, 3, 2, 1};
  const Outcome outcome = run(6, {0, 5}, 5, order);
  ASSERT_GE(outcome.decided_after.count(), 0) << "no decision within 10 rounds";
  const View survivors{1, {1, 2, 3, 4}};
  for (const View& view : outcome.views) expect_view(view, survivors);
  EXPECT_GT(outcome.decided_after, 2 * kRound) << "a follower suspected its leader before two rounds";
  EXPECT_LE(outcome.decided_after, 3 * kRound + 2 * kTick) << "within the daemon's limit of 4 rounds";
}

INSTANTIATE_TEST_SUITE_P(PollOrder, SurvivorDeadlines, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "LeaderFirst" : "LeaderLast";
                         });

}  // namespace
}  // namespace moed::comm
