// Membership (comm/membership.h) under a simulated network: messages
// delivered in random order, ranks lost before and during the agreement (the
// leader among them), a rank paused past the deadlines that then comes back,
// and deadlines that fire early. Every run must end with one view on every
// live rank it keeps, the same decision for each epoch on every rank that
// made it, and every rank it left out fenced.
#include "comm/membership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "comm/membership_wire.h"
#include "common/error.h"

namespace moed::comm {
namespace {

using Kind = MembershipMessage::Kind;

struct Scenario {
  int ranks = 4;
  int lost = 1;              // ranks lost: the first at the start, the others during the agreement
  bool lose_leader = false;  // the first loss during the agreement is the lowest live rank
  bool pause = false;        // one more rank stops at the start and comes back later
  bool early_deadlines = false;
  unsigned seed = 1;
};

class Network {
 public:
  explicit Network(const Scenario& s) : s_(s), rng_(s.seed), down_(std::size_t(s.ranks), false) {
    std::vector<int> all(std::size_t(s.ranks));
    for (int r = 0; r < s.ranks; ++r) all[std::size_t(r)] = r;
    for (int r = 0; r < s.ranks; ++r) ranks_.emplace_back(r, View{0, all});
  }

  void run() {
    std::vector<int> order(std::size_t(s_.ranks));
    for (int r = 0; r < s_.ranks; ++r) order[std::size_t(r)] = r;
    std::shuffle(order.begin(), order.end(), rng_);
    const int first = order[0];
    lose(first);
    if (s_.pause) {
      paused_ = order[1];
      down_[std::size_t(paused_)] = true;
    }
    for (std::size_t i = 2; i < order.size() && int(to_lose_.size()) + 1 < s_.lost; ++i) to_lose_.push_back(order[i]);
    // Some of the live ranks notice the first loss at once, the rest later.
    for (int r : order)
      if (!down_[std::size_t(r)] && rng_() % 2) send(ranks_[std::size_t(r)].suspect(first));
    for (int step = 0; step < 200000; ++step) {
      check();
      if (!to_lose_.empty() && rng_() % 64 == 0) {
        // The next planned loss; or, losing leaders, the lowest live rank
        // (which leads) in its place.
        const int planned = to_lose_.back();
        to_lose_.pop_back();
        lose(s_.lose_leader ? lowest_live() : planned);
        continue;
      }
      if (paused_ >= 0 && rng_() % 512 == 0) resume();
      // Early deadlines for a while; then they pass only when nothing is in
      // flight (eventually, deadlines longer than any message takes).
      const bool early = s_.early_deadlines && step < 20000 && rng_() % 50 == 0;
      if (!flight_.empty() && !early) {
        deliver();
        continue;
      }
      if (flight_.empty() && settled()) {
        if (paused_ >= 0) {
          resume();
          continue;
        }
        if (to_lose_.empty()) return;
      }
      quiet();
    }
    FAIL() << "no settled state after 200000 events (seed " << s_.seed << ")";
  }

  // The final state: one view, exactly the live ranks not fenced.
  void expect_final() {
    std::set<int> kept;
    const View* view = nullptr;
    for (int r = 0; r < s_.ranks; ++r) {
      if (lost_.count(r)) continue;
      const Membership& m = ranks_[std::size_t(r)];
      if (m.fenced()) continue;
      kept.insert(r);
      if (view == nullptr) view = &m.view();
      EXPECT_EQ(m.view(), *view) << "rank " << r << " (seed " << s_.seed << ")";
      EXPECT_FALSE(m.agreeing()) << "rank " << r;
    }
    ASSERT_NE(view, nullptr) << "every live rank fenced (seed " << s_.seed << ")";
    EXPECT_EQ(std::set<int>(view->members.begin(), view->members.end()), kept) << "seed " << s_.seed;
    for (int r : lost_) EXPECT_FALSE(kept.count(r)) << "lost rank " << r << " kept (seed " << s_.seed << ")";
    if (s_.early_deadlines) return;
    // Deadlines only when nothing is in flight: no healthy rank is dropped.
    for (int r = 0; r < s_.ranks; ++r) {
      if (lost_.count(r) || r == paused_once_) continue;
      EXPECT_TRUE(kept.count(r)) << "rank " << r << " (seed " << s_.seed << ")";
    }
  }

 private:
  void send(const std::vector<MembershipMessage>& messages) {
    for (const MembershipMessage& m : messages) {
      ASSERT_EQ(m.from >= 0 && m.from < s_.ranks && m.to >= 0 && m.to < s_.ranks && m.from != m.to, true)
          << to_string(m);
      flight_.push_back(m);
    }
  }
  void deliver() {
    const std::size_t at = rng_() % flight_.size();
    const MembershipMessage m = flight_[at];
    flight_.erase(flight_.begin() + std::ptrdiff_t(at));
    if (lost_.count(m.to)) return;  // dropped
    if (m.to == paused_) {
      held_.push_back(m);
      return;
    }
    send(ranks_[std::size_t(m.to)].receive(m));
  }
  void lose(int rank) {
    lost_.insert(rank);
    down_[std::size_t(rank)] = true;
  }
  void resume() {
    const int r = paused_;
    down_[std::size_t(r)] = false;
    paused_once_ = r;
    paused_ = -1;
    for (const MembershipMessage& m : held_) flight_.push_back(m);
    held_.clear();
    detect_dropping_peers(r);
  }
  // A rank's exchanges fail against the peers that dropped it (they closed
  // their endpoints to it): it suspects the first such peer it meets.
  void detect_dropping_peers(int r) {
    Membership& m = ranks_[std::size_t(r)];
    for (int other : m.view().members) {
      if (other == r || !live(other)) continue;
      const View& theirs = ranks_[std::size_t(other)].view();
      if (theirs.epoch > m.view().epoch && !std::binary_search(theirs.members.begin(), theirs.members.end(), r)) {
        send(m.suspect(other));
        return;
      }
    }
  }
  int lowest_live() const {
    for (int r = 0; r < s_.ranks; ++r)
      if (!down_[std::size_t(r)]) return r;
    return 0;
  }
  bool live(int r) const { return !down_[std::size_t(r)]; }
  // Nothing left to do: no live rank agreeing or holding a lost rank in its view.
  bool settled() const {
    for (int r = 0; r < s_.ranks; ++r) {
      if (!live(r) || ranks_[std::size_t(r)].fenced()) continue;
      const Membership& m = ranks_[std::size_t(r)];
      if (m.agreeing()) return false;
      for (int member : m.view().members)
        if (!live(member) && member != paused_) return false;
    }
    return true;
  }
  // Nothing in flight: ranks notice lost members (endpoint errors), then the
  // leaders' deadlines pass, then (nothing sent) the others'.
  void quiet() {
    const std::size_t before = flight_.size();
    for (int r = 0; r < s_.ranks; ++r) {
      if (!live(r)) continue;
      Membership& m = ranks_[std::size_t(r)];
      for (int member : std::vector<int>(m.view().members))
        if (!live(member) && !m.suspected().count(member)) send(m.suspect(member));
      if (!m.fenced() && !m.agreeing()) detect_dropping_peers(r);
    }
    if (flight_.size() != before) return;
    for (int r = 0; r < s_.ranks; ++r)
      if (live(r) && ranks_[std::size_t(r)].leader() == r) send(ranks_[std::size_t(r)].timeout());
    if (flight_.size() != before) return;
    for (int r = 0; r < s_.ranks; ++r)
      if (live(r)) send(ranks_[std::size_t(r)].timeout());
  }
  // Every rank that reached an epoch holds the one decision for it.
  void check() {
    for (int r = 0; r < s_.ranks; ++r) {
      const View& v = ranks_[std::size_t(r)].view();
      const auto [at, fresh] = decided_.emplace(v.epoch, v.members);
      ASSERT_EQ(at->second, v.members) << "rank " << r << " decided otherwise for epoch " << v.epoch << " (seed "
                                       << s_.seed << ")";
      (void)fresh;
    }
  }

  Scenario s_;
  std::mt19937 rng_;
  std::vector<Membership> ranks_;
  std::vector<bool> down_;
  std::set<int> lost_;
  std::vector<int> to_lose_;
  int paused_ = -1, paused_once_ = -1;
  std::vector<MembershipMessage> flight_, held_;
  std::map<std::uint64_t, std::vector<int>> decided_;
};

void run_many(Scenario s, unsigned runs) {
  for (unsigned seed = 1; seed <= runs; ++seed) {
    s.seed = seed;
    Network net(s);
    net.run();
    if (::testing::Test::HasFatalFailure()) return;
    net.expect_final();
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Membership, OneLossIsDecidedAlikeByEverySurvivor) { run_many({.ranks = 4, .lost = 1}, 1000); }

TEST(Membership, LossesDuringTheAgreementIncludingTheLeader) {
  run_many({.ranks = 5, .lost = 2}, 1000);
  run_many({.ranks = 7, .lost = 3, .lose_leader = true}, 1000);
}

TEST(Membership, APausedRankComesBackFencedOrKept) {
  run_many({.ranks = 5, .lost = 1, .pause = true}, 1000);
}

TEST(Membership, EarlyDeadlinesAndCompetingLeadersStillAgree) {
  run_many({.ranks = 5, .lost = 2, .early_deadlines = true}, 1000);
  run_many({.ranks = 6, .lost = 1, .lose_leader = true, .pause = true, .early_deadlines = true}, 1000);
}

// Delivers every message in flight (in order) to ranks 0..n-1 of `ranks`,
// dropping those to the ranks `down`; returns how many were delivered.
int deliver(std::vector<Membership>& ranks, std::vector<MembershipMessage> flight, const std::set<int>& down = {}) {
  int delivered = 0;
  while (!flight.empty()) {
    const MembershipMessage m = flight.front();
    flight.erase(flight.begin());
    if (down.count(m.to)) continue;
    ++delivered;
    for (const MembershipMessage& out : ranks[std::size_t(m.to)].receive(m)) flight.push_back(out);
  }
  return delivered;
}

// A message of `kind` from `from` to `to` about `epoch`.
MembershipMessage message(Kind kind, int from, int to, std::uint64_t epoch) {
  MembershipMessage m;
  m.kind = kind;
  m.from = from;
  m.to = to;
  m.epoch = epoch;
  return m;
}

TEST(Membership, ALeaderDecidesInOneRoundWhenNothingElseHappens) {
  // Ranks 0-3, rank 3 lost and noticed by rank 1 only: rank 1 tells the
  // others; rank 0 leads, every survivor promises and accepts {0, 1, 2}.
  std::vector<Membership> ranks;
  for (int r = 0; r < 4; ++r) ranks.emplace_back(r, View{0, {0, 1, 2, 3}});
  std::vector<MembershipMessage> flight = ranks[1].suspect(3);
  ASSERT_EQ(flight.size(), 2u);  // to 0 and 2, not to the suspected rank
  const int delivered = deliver(ranks, flight, /*down=*/{3});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[std::size_t(r)].view(), (View{1, {0, 1, 2}})) << "rank " << r;
    EXPECT_FALSE(ranks[std::size_t(r)].fenced());
  }
  EXPECT_LE(delivered, 16);
}

TEST(Membership, AProposalKeepsAMajorityOfTheEpochOrTheLeaderWaits) {
  // 6 ranks, 0 and 5 cut off. Rank 3's deadlines passed for 0 and 5, and
  // too early for the live 1 and 2: it leads, and rank 4's promise comes
  // first. {3, 4} alone is no majority, so no proposal yet: once 1 and 2
  // promise (clearing their suspicion), it proposes the four live ranks. A
  // proposal of {3, 4} would have been accepted by 1 and 2 too, fencing them.
  std::vector<Membership> ranks;
  for (int r = 0; r < 6; ++r) ranks.emplace_back(r, View{0, {0, 1, 2, 3, 4, 5}});
  std::vector<MembershipMessage> prepares;
  for (int suspected : {0, 5, 1, 2})
    for (const MembershipMessage& m : ranks[3].suspect(suspected))
      if (m.kind == Kind::prepare) prepares.push_back(m);  // its suspicions, relayed, are still on their way
  std::stable_partition(prepares.begin(), prepares.end(), [](const MembershipMessage& m) { return m.to == 4; });
  ASSERT_EQ(prepares.front().to, 4);
  const std::set<int> cut{0, 5};
  std::vector<MembershipMessage> promise_of_4 = ranks[4].receive(prepares.front());
  ASSERT_EQ(promise_of_4.size(), 1u);
  EXPECT_TRUE(ranks[3].receive(promise_of_4[0]).empty()) << "{3, 4} proposed: a minority of 6";
  prepares.erase(prepares.begin());
  deliver(ranks, prepares, cut);
  for (int r : {1, 2, 3, 4}) {
    EXPECT_EQ(ranks[std::size_t(r)].view(), (View{1, {1, 2, 3, 4}})) << "rank " << r;
    EXPECT_FALSE(ranks[std::size_t(r)].fenced()) << "rank " << r;
  }
}

TEST(Membership, ALeaderWhoseAnswerersAreSuspectedAgainAsksAgainAtItsDeadline) {
  // Rank 0 leads with promises from 0-3 (rank 4 silent, 5 lost); then
  // suspicions of 1 and 2, relayed from ranks whose deadlines passed early,
  // arrive. At its deadline {0, 3} is no majority of 6: it leads again, and
  // 1 and 2, answering, are kept.
  std::vector<Membership> ranks;
  for (int r = 0; r < 6; ++r) ranks.emplace_back(r, View{0, {0, 1, 2, 3, 4, 5}});
  const std::set<int> cut{4, 5};
  std::vector<MembershipMessage> flight = ranks[0].suspect(5);
  deliver(ranks, flight, cut);
  ASSERT_TRUE(ranks[0].agreeing()) << "rank 4's promise is missing";
  for (int suspected : {1, 2}) {
    MembershipMessage relayed = message(Kind::suspect, 3, 0, 1);
    relayed.suspected = suspected;
    ranks[0].receive(relayed);
  }
  ASSERT_TRUE(ranks[0].suspected().count(1) && ranks[0].suspected().count(2));
  std::vector<MembershipMessage> again = ranks[0].timeout();
  ASSERT_FALSE(again.empty());
  for (const MembershipMessage& m : again)
    EXPECT_TRUE(m.kind == Kind::prepare || m.kind == Kind::suspect) << to_string(m);
  deliver(ranks, again, cut);
  for (int r : {0, 1, 2, 3}) EXPECT_EQ(ranks[std::size_t(r)].view(), (View{1, {0, 1, 2, 3}})) << "rank " << r;
}

TEST(Membership, ARankThatMissedTheDecisionLearnsItAndIsFenced) {
  Membership dropped(2, View{0, {0, 1, 2}});
  Membership survivor(0, View{0, {0, 1, 2}});
  MembershipMessage decide = message(Kind::decide, 1, 0, 1);
  decide.members = {0, 1};
  EXPECT_TRUE(survivor.receive(decide).empty());
  // The dropped rank wakes and asks; the survivor answers with its view.
  std::vector<MembershipMessage> asked = dropped.suspect(1);
  ASSERT_FALSE(asked.empty());
  std::vector<MembershipMessage> answer;
  for (const MembershipMessage& m : asked)
    if (m.to == 0)
      for (const MembershipMessage& reply : survivor.receive(m)) answer.push_back(reply);
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_EQ(answer[0].kind, Kind::decide);
  dropped.receive(answer[0]);
  EXPECT_TRUE(dropped.fenced());
  EXPECT_EQ(dropped.view(), (View{1, {0, 1}}));
}

TEST(Membership, AViewThatIsNotAscendingOrLacksTheRankIsRefused) {
  EXPECT_THROW(Membership(1, View{0, {2, 1}}), Error);
  EXPECT_THROW(Membership(3, View{0, {0, 1, 2}}), Error);
  EXPECT_THROW(Membership(2, View{0, {0, 1, 2}}, /*spare=*/true), Error);  // a spare is outside the view
}

TEST(Membership, TheLeaderAdmitsASpareWhichEveryMemberAndTheSpareAdopt) {
  // Ranks 0, 2, 3 serve (epoch 1, rank 1 lost before); rank 4 is a spare.
  std::vector<Membership> ranks;
  for (int r = 0; r < 5; ++r)
    ranks.emplace_back(r, View{1, {0, 2, 3}}, /*spare=*/r == 1 || r == 4);
  EXPECT_TRUE(ranks[2].admit({4}).empty()) << "only the leader admits";
  EXPECT_TRUE(ranks[0].admit({2}).empty()) << "a member is not admitted again";
  std::vector<MembershipMessage> flight = ranks[0].admit({4});
  ASSERT_EQ(flight.size(), 2u);  // prepare to 2 and 3
  EXPECT_TRUE(ranks[0].agreeing());
  EXPECT_TRUE(ranks[0].admit({4}).empty()) << "one agreement at a time";
  deliver(ranks, flight);
  for (int r : {0, 2, 3, 4}) {
    EXPECT_EQ(ranks[std::size_t(r)].view(), (View{2, {0, 2, 3, 4}})) << "rank " << r;
    EXPECT_FALSE(ranks[std::size_t(r)].spare()) << "rank " << r;
    EXPECT_FALSE(ranks[std::size_t(r)].fenced()) << "rank " << r;
    EXPECT_FALSE(ranks[std::size_t(r)].agreeing()) << "rank " << r;
  }
  EXPECT_TRUE(ranks[1].spare()) << "a spare not admitted stays one, never fenced";
  EXPECT_FALSE(ranks[1].fenced());
  EXPECT_EQ(ranks[1].view(), (View{1, {0, 2, 3}}));
}

TEST(Membership, AnAdmissionDuringALossDecidesBothOrTheLoss) {
  // Rank 2 is lost while the leader admits spare 4: the leader waits for
  // rank 2's promise until its deadline, then proposes the others and the spare.
  std::vector<Membership> ranks;
  for (int r = 0; r < 5; ++r) ranks.emplace_back(r, View{0, {0, 1, 2, 3}}, /*spare=*/r == 4);
  deliver(ranks, ranks[0].admit({4}), /*down=*/{2});
  EXPECT_TRUE(ranks[0].agreeing()) << "rank 2's promise is missing";
  deliver(ranks, ranks[0].timeout(), /*down=*/{2});
  for (int r : {0, 1, 3, 4}) EXPECT_EQ(ranks[std::size_t(r)].view(), (View{1, {0, 1, 3, 4}})) << "rank " << r;
}

TEST(Membership, ASpareTakesPartInNothingButItsAdmission) {
  Membership spare(4, View{1, {0, 1}}, /*spare=*/true);
  EXPECT_TRUE(spare.suspect(0).empty());
  EXPECT_TRUE(spare.timeout().empty());
  MembershipMessage prepare = message(Kind::prepare, 0, 4, 2);
  prepare.ballot = {1, 0};
  EXPECT_TRUE(spare.receive(prepare).empty());
  EXPECT_FALSE(spare.agreeing());
  MembershipMessage decide = prepare;
  decide.kind = Kind::decide;
  decide.members = {0, 1, 4};
  spare.receive(decide);
  EXPECT_FALSE(spare.spare());
  EXPECT_EQ(spare.view(), (View{2, {0, 1, 4}}));
}


MembershipMessage sample(Kind kind) {
  MembershipMessage m;
  m.kind = kind;
  m.from = 3;
  m.to = 1;
  m.epoch = 0x0102030405060708ull;
  m.ballot = {77, 3};
  m.accepted_ballot = {5, 0};
  m.members = {0, 1, 3, 6};
  m.suspected = kind == Kind::suspect ? 2 : -1;
  return m;
}

bool same(const MembershipMessage& a, const MembershipMessage& b) {
  return a.kind == b.kind && a.from == b.from && a.to == b.to && a.epoch == b.epoch && a.ballot == b.ballot &&
         a.accepted_ballot == b.accepted_ballot && a.members == b.members && a.suspected == b.suspected;
}

TEST(MembershipWire, EveryKindRoundTrips) {
  for (Kind kind : {Kind::suspect, Kind::prepare, Kind::promise, Kind::accept, Kind::accepted, Kind::refuse,
                    Kind::decide}) {
    const MembershipMessage m = sample(kind);
    EXPECT_TRUE(same(decode_membership_message(encode(m), 8), m)) << to_string(m);
  }
}

// Every cut and every single-byte change is refused as Input or decodes to a
// message that encodes to the same bytes: never a crash or a wild read.
TEST(MembershipWire, CutOrCorruptBytesAreRefusedOrExact) {
  const std::string bytes = encode(sample(Kind::accept));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    try {
      decode_membership_message(bytes.substr(0, n), 8);
      ADD_FAILURE() << "a message cut to " << n << " bytes decoded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    }
  }
  int refused = 0;
  for (std::size_t at = 0; at < bytes.size(); ++at)
    for (int bit = 0; bit < 8; ++bit) {
      std::string changed = bytes;
      changed[at] = static_cast<char>(changed[at] ^ (1 << bit));
      try {
        EXPECT_EQ(encode(decode_membership_message(changed, 8)), changed) << "byte " << at << " bit " << bit;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
        ++refused;
      }
    }
  EXPECT_GT(refused, 0);
}

TEST(MembershipWire, ErrorsNameWhatWasWrong) {
  const auto refused = [](std::string bytes, int ranks) {
    try {
      decode_membership_message(bytes, ranks);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("decoded");
  };
  std::string bytes = encode(sample(Kind::promise));
  EXPECT_NE(refused(bytes, 6).find("member 6 is not a rank of 6"), std::string::npos) << refused(bytes, 6);
  EXPECT_NE(refused(bytes + "x", 8).find("4 members need 16 bytes"), std::string::npos);
  std::string version = bytes;
  version[0] = 9;
  EXPECT_NE(refused(version, 8).find("version 9"), std::string::npos);
  std::string kind = bytes;
  kind[1] = 42;
  EXPECT_NE(refused(kind, 8).find("unknown kind 42"), std::string::npos);
  MembershipMessage unsorted = sample(Kind::decide);
  unsorted.members = {0, 3, 1};
  EXPECT_NE(refused(encode(unsorted), 8).find("ascending"), std::string::npos);
  MembershipMessage self = sample(Kind::decide);
  self.to = self.from;
  EXPECT_NE(refused(encode(self), 8).find("to itself"), std::string::npos);
  MembershipMessage no_suspect = sample(Kind::suspect);
  no_suspect.suspected = -1;
  EXPECT_NE(refused(encode(no_suspect), 8).find("suspected rank -1"), std::string::npos);
}

}  // namespace
}  // namespace moed::comm
