// The survivors' agreement as the ranks run it: a Membership (the pure
// state machine of comm/membership.h) whose messages travel over a
// PeerMessenger (comm/peer_messenger.h) as comm/membership_wire.h encodes
// them, and whose deadlines this class keeps.
//
// A rank calls poll() between steps: it takes arrived messages and the
// peers the transport found lost, and fires a round's deadline when it has
// passed. Once an agreement is under way (this rank suspected a peer, or
// heard that another did) the rank stops serving and calls agree(), which
// returns the next epoch's view: the same on every rank that decides it. A
// rank left out of it (it was stopped or cut off past the deadlines) finds
// fenced() set and must exit without touching anything shared.
//
// Deadlines differ by role. The leader waits one round for the members it
// does not suspect, and then settles the silent ones itself. A follower
// waits two rounds for its leader before suspecting it: a leader that had
// to settle a silent member needs its whole round and then the accepts.
// Equal deadlines made the followers suspect a live leader at the very
// moment it proposed, and competing leaders could then outbid each other
// past the agreement's limit (a host cut off whose ranks were not all
// suspected at first). A lost leader that no endpoint reports therefore
// costs two rounds before a follower leads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "comm/membership.h"

namespace moed::comm {

class PeerMessenger;

class SurvivorAgreement {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = std::function<Clock::time_point()>;

  // `round`: how long the leader waits for the answers of one round before
  // it suspects the silent (the daemon passes [comm].timeout_ms); a
  // follower waits twice that for its leader.
  // `spare`: this rank is outside `current`, waiting to be admitted.
  // `now`: the deadlines' clock (a test's own; agree()'s limit is real time).
  SurvivorAgreement(PeerMessenger& messenger, View current, std::chrono::milliseconds round, bool spare = false,
                    Now now = Clock::now);

  // This rank found `rank` unreachable (a deadline of its own passed).
  void suspect(int rank);
  // Takes what has arrived without waiting, and fires a round's deadline
  // that has passed. True while an agreement is under way.
  bool poll();
  // Runs the agreement under way until it decides: the new view (or this
  // rank is fenced()). With no agreement under way, returns the current
  // view at once. Throws a Runtime error naming the members not heard
  // from when `limit` passes first: fewer than a majority of the epoch's
  // members answer, and only a restart brings the job back.
  const View& agree(std::chrono::milliseconds limit);

  // The leader, between agreements: begins one that admits `ranks`, spares
  // (Membership::admit); false when none could begin here.
  bool admit(const std::vector<int>& ranks);

  const View& view() const { return membership_.view(); }
  bool spare() const { return membership_.spare(); }
  // Whether the transport has reported `rank` lost (a spare watches its
  // job's members this way: it ends when they have all gone).
  bool lost(int rank) const { return lost_.count(rank) != 0; }
  bool agreeing() const { return membership_.agreeing(); }
  bool fenced() const { return membership_.fenced(); }
  // Messages dropped because they could not be decoded or lied about their sender.
  std::uint64_t dropped_messages() const { return dropped_; }

 private:
  void carry(const std::vector<MembershipMessage>& messages);
  // Restarts the round's clock when an agreement begins, an epoch is
  // decided, or the leader this rank waits for changes (itself included).
  void track_rounds();
  bool leading() const;
  std::chrono::milliseconds patience() const;  // how long this rank waits, in its role

  PeerMessenger& messenger_;
  Membership membership_;
  std::chrono::milliseconds round_;
  Now now_;
  Clock::time_point round_deadline_{};
  bool was_agreeing_ = false;
  int awaited_leader_ = -1;  // while agreeing: the leader this rank waits for (itself: it leads)
  std::uint64_t epoch_seen_ = 0;
  std::uint64_t dropped_ = 0;
  std::set<int> lost_;  // every rank the transport reported lost (a job's ranks: bounded)
};

}  // namespace moed::comm
