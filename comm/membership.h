// Agreement on the survivors after a loss (issue 31, elastic serving).
//
// Each rank notices a lost peer on its own (an endpoint error, a missed
// deadline), at different times, and messages between the survivors may be
// delayed or reordered; the rank that leads the agreement may itself be
// lost halfway through it. Membership turns that into one decision: every
// rank that decides epoch e + 1 decides the same member set. It is
// single-decree Paxos per epoch, the members of epoch e the acceptors:
//   - the lowest member a rank does not suspect leads: it asks every member
//     it does not suspect to promise its ballot (round, rank) and to report
//     the set it accepted under an earlier ballot, if any;
//   - with promises from every member it does not suspect (past its
//     deadline: from a majority of epoch e's members, the silent ones then
//     suspected) it proposes that earlier set (the highest ballot's: it may
//     have been decided already), or else the ranks that promised and are
//     not suspected, if they are a majority (else it asks again);
//   - a majority accepting decides; the leader tells every member, so that
//     a member left out learns that it was dropped (fenced()) and exits.
// A rank that waits past its deadline (timeout()) suspects the leader it
// waits for and leads if it is then the lowest; a rank asked about an epoch
// it has decided answers with its view, so a rank that missed a decision
// catches up. Fewer than a majority of epoch e's members alive: no decision
// (the restart path). Pure: the caller carries the messages (the transport)
// and the deadlines; every input is an event, every output a message list.
//
// Growing: a spare (a rank launched with the job but outside the view)
// listens for decisions alone. The leader admits it (admit()): the next
// epoch's proposal is then the ranks that promised plus the spare, decided
// by the members as any other, and the decision is sent to the spare too,
// which becomes a member. An earlier proposal that must stand (Paxos) wins
// over the admission, which the caller may ask for again.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace moed::comm {

struct Ballot {
  std::uint64_t round = 0;  // 0: none
  int rank = -1;
  bool operator==(const Ballot&) const = default;
  bool operator<(const Ballot& other) const { return round != other.round ? round < other.round : rank < other.rank; }
};

struct View {
  std::uint64_t epoch = 0;
  std::vector<int> members;  // ascending
  bool operator==(const View&) const = default;
};

struct MembershipMessage {
  enum class Kind : std::uint8_t { suspect, prepare, promise, accept, accepted, refuse, decide };
  Kind kind = Kind::suspect;
  int from = -1, to = -1;
  std::uint64_t epoch = 0;   // the epoch decided (decide: the sender's view's)
  Ballot ballot;             // prepare, accept: the leader's; promise, accepted: the one answered; refuse: the higher promised
  Ballot accepted_ballot;    // promise: the ballot of the set accepted before (round 0: none)
  std::vector<int> members;  // promise: the set accepted before; accept: the proposal; decide: the view
  int suspected = -1;        // suspect: the rank suspected
};
std::string to_string(const MembershipMessage& message);

class Membership {
 public:
  // `current` holds `self` (a spare: does not hold it); its members
  // ascending, no repeats (else Error).
  Membership(int self, View current, bool spare = false);

  // This rank found `rank` unreachable: it tells the others and, if it is
  // then the lowest member it does not suspect, leads.
  std::vector<MembershipMessage> suspect(int rank);
  std::vector<MembershipMessage> receive(const MembershipMessage& message);
  // The caller's deadline for the agreement passed: lead again with a
  // higher ballot, or suspect the leader waited for.
  std::vector<MembershipMessage> timeout();
  // The leader, between agreements: proposes the next epoch with `ranks`,
  // spares, among its members. Anywhere else (a follower, an agreement
  // already under way) nothing happens and nothing is sent; a rank that is
  // a member already is left out.
  std::vector<MembershipMessage> admit(const std::vector<int>& ranks);

  const View& view() const { return view_; }
  bool agreeing() const { return agreeing_; }  // an agreement on view().epoch + 1 is under way
  bool fenced() const { return fenced_; }      // a decision left this rank out: it must exit
  bool spare() const { return spare_; }        // outside the view, waiting to be admitted
  const std::set<int>& suspected() const { return suspects_; }
  int leader() const;  // the lowest member this rank does not suspect

 private:
  enum class Phase : std::uint8_t { none, prepare, accept };
  std::size_t quorum() const { return view_.members.size() / 2 + 1; }
  bool member(int rank) const;
  std::vector<MembershipMessage> lead();
  std::vector<MembershipMessage> propose_when_complete();
  std::vector<MembershipMessage> propose();
  std::vector<MembershipMessage> adopt(View decided);
  MembershipMessage to(int rank, MembershipMessage::Kind kind) const;

  int self_;
  View view_;
  bool agreeing_ = false, fenced_ = false, spare_ = false;
  std::set<int> joining_;  // leader: spares its proposal adds
  std::set<int> suspects_;
  // Acceptor: for epoch view_.epoch + 1.
  Ballot promised_, accepted_ballot_;
  std::vector<int> accepted_;
  std::uint64_t highest_round_ = 0;
  // Leader.
  Phase phase_ = Phase::none;
  Ballot ballot_;
  std::set<int> answered_;  // promised (prepare) or accepted (accept), self included
  Ballot best_ballot_;      // the highest earlier acceptance among the promises
  std::vector<int> best_, proposal_;
  std::vector<MembershipMessage> later_;  // for epochs past the next, until their decision arrives
};

}  // namespace moed::comm
