#include "comm/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "common/error.h"

namespace moed::comm {

namespace {

using Kind = MembershipMessage::Kind;

void append(std::vector<MembershipMessage>& out, std::vector<MembershipMessage> more) {
  out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::suspect: return "suspect";
    case Kind::prepare: return "prepare";
    case Kind::promise: return "promise";
    case Kind::accept: return "accept";
    case Kind::accepted: return "accepted";
    case Kind::refuse: return "refuse";
    case Kind::decide: return "decide";
  }
  return "?";
}

}  // namespace

std::string to_string(const MembershipMessage& m) {
  return fmt::format("{} {} -> {} epoch {} ballot ({}, {}) members [{}]{}", kind_name(m.kind), m.from, m.to, m.epoch,
                     m.ballot.round, m.ballot.rank, fmt::join(m.members, " "),
                     m.kind == Kind::suspect ? fmt::format(" suspected {}", m.suspected) : std::string());
}

Membership::Membership(int self, View current, bool spare) : self_(self), view_(std::move(current)), spare_(spare) {
  MOED_CHECK(std::is_sorted(view_.members.begin(), view_.members.end()) &&
                 std::adjacent_find(view_.members.begin(), view_.members.end()) == view_.members.end(),
             "membership of epoch {}: members [{}] are not ascending and distinct", view_.epoch,
             fmt::join(view_.members, " "));
  MOED_CHECK(member(self) != spare, "membership of epoch {}: rank {} is {}among its members [{}]", view_.epoch, self,
             spare ? "a spare but " : "not ", fmt::join(view_.members, " "));
}

bool Membership::member(int rank) const {
  return std::binary_search(view_.members.begin(), view_.members.end(), rank);
}

int Membership::leader() const {
  for (int rank : view_.members)
    if (!suspects_.count(rank)) return rank;
  return self_;  // unreachable: self is never suspected
}

MembershipMessage Membership::to(int rank, Kind kind) const {
  MembershipMessage m;
  m.kind = kind;
  m.from = self_;
  m.to = rank;
  m.epoch = view_.epoch + 1;
  return m;
}

std::vector<MembershipMessage> Membership::suspect(int rank) {
  if (fenced_ || spare_ || rank == self_ || !member(rank) || suspects_.count(rank)) return {};
  suspects_.insert(rank);
  agreeing_ = true;
  std::vector<MembershipMessage> out;
  for (int other : view_.members)
    if (other != self_ && !suspects_.count(other)) {
      out.push_back(to(other, Kind::suspect));
      out.back().suspected = rank;
    }
  // This rank the lowest now (the leader was lost): lead; leading already,
  // the promises it waits for may now be complete.
  if (leader() == self_ && phase_ == Phase::none) append(out, lead());
  if (leader() == self_ && phase_ == Phase::prepare) append(out, propose_when_complete());
  return out;
}

std::vector<MembershipMessage> Membership::propose_when_complete() {
  for (int rank : view_.members)
    if (!suspects_.count(rank) && !answered_.count(rank)) return {};  // wait for it, or the deadline
  return propose();
}

std::vector<MembershipMessage> Membership::propose() {
  // An earlier proposal may have been decided: it must stand. Else the
  // ranks that answered, less any suspected since: a majority of the epoch's
  // members, or none. Suspicions relayed by ranks whose deadlines passed too
  // early could otherwise shrink it to a minority that the live ranks left
  // out would accept, fencing themselves; the leader asks again instead.
  if (best_ballot_.round > 0) {
    proposal_ = best_;
  } else {
    std::set<int> kept;
    for (int rank : answered_)
      if (!suspects_.count(rank)) kept.insert(rank);
    if (kept.size() < quorum()) return {};
    kept.insert(joining_.begin(), joining_.end());
    proposal_.assign(kept.begin(), kept.end());
  }
  phase_ = Phase::accept;
  accepted_ballot_ = ballot_;
  accepted_ = proposal_;
  answered_ = {self_};
  std::vector<MembershipMessage> out;
  for (int other : view_.members)  // any member's acceptance counts toward the majority
    if (other != self_) {
      out.push_back(to(other, Kind::accept));
      out.back().ballot = ballot_;
      out.back().members = proposal_;
    }
  return out;
}

std::vector<MembershipMessage> Membership::lead() {
  highest_round_ = std::max(highest_round_, promised_.round) + 1;
  ballot_ = {highest_round_, self_};
  phase_ = Phase::prepare;
  promised_ = ballot_;
  answered_ = {self_};
  best_ballot_ = accepted_ballot_;
  best_ = accepted_;
  // Every member, the suspected too: one that answers is live after all
  // (its answer clears the suspicion), and a majority may need it.
  std::vector<MembershipMessage> out;
  for (int other : view_.members)
    if (other != self_) {
      out.push_back(to(other, Kind::prepare));
      out.back().ballot = ballot_;
    }
  return out;
}

std::vector<MembershipMessage> Membership::adopt(View decided) {
  view_ = std::move(decided);
  if (spare_)
    spare_ = !member(self_);  // admitted, or still waiting (never fenced: it was not a member)
  else
    fenced_ = !member(self_);
  agreeing_ = false;
  joining_.clear();
  // Suspicions start over with the epoch: a member still unreachable is
  // found so again (a stale one would keep a rank from its leader). Paxos
  // state starts over too.
  suspects_.clear();
  promised_ = accepted_ballot_ = ballot_ = best_ballot_ = {};
  accepted_.clear();
  best_.clear();
  proposal_.clear();
  answered_.clear();
  phase_ = Phase::none;
  std::vector<MembershipMessage> out;
  // The next epoch's messages that came early, now in order.
  std::vector<MembershipMessage> early;
  std::vector<MembershipMessage> kept;
  for (MembershipMessage& m : later_) (m.epoch == view_.epoch + 1 ? early : kept).push_back(std::move(m));
  later_ = std::move(kept);
  for (const MembershipMessage& m : early) append(out, receive(m));
  return out;
}

std::vector<MembershipMessage> Membership::receive(const MembershipMessage& m) {
  if (fenced_ || m.to != self_) return {};
  if (m.kind == Kind::decide) {
    if (m.epoch <= view_.epoch) return {};  // decided already (a decision is final)
    return adopt({m.epoch, m.members});
  }
  if (spare_) return {};  // a spare takes part in nothing but the decision that admits it
  if (m.epoch <= view_.epoch) {  // the sender missed a decision: tell it
    MembershipMessage reply = to(m.from, Kind::decide);
    reply.epoch = view_.epoch;
    reply.members = view_.members;
    return {reply};
  }
  if (!member(m.from)) return {};
  if (m.epoch > view_.epoch + 1) {
    // A decision this rank has not heard yet (it may be on its way: a new
    // leader's prepare can overtake the old one's decide): kept until that
    // decision arrives or this rank's deadline makes it ask for it. At most
    // a few per member: a rank that never catches up holds no more.
    if (later_.size() >= 4 * view_.members.size()) later_.erase(later_.begin());
    later_.push_back(m);
    return {};
  }
  highest_round_ = std::max(highest_round_, m.ballot.round);
  // A rank heard from directly is not lost: a deadline that passed too
  // early is forgiven (else suspicions of live ranks could only grow, and
  // leave no majority to agree).
  suspects_.erase(m.from);
  if (m.kind == Kind::prepare || m.kind == Kind::accept) {
    agreeing_ = true;
    if (m.ballot < promised_) {  // promised a higher ballot: say which
      MembershipMessage reply = to(m.from, Kind::refuse);
      reply.ballot = promised_;
      return {reply};
    }
  }
  switch (m.kind) {
    case Kind::suspect: return suspect(m.suspected);
    case Kind::prepare: {
      promised_ = m.ballot;
      if (phase_ != Phase::none && ballot_ < m.ballot) phase_ = Phase::none;  // outbid: follow
      MembershipMessage reply = to(m.from, Kind::promise);
      reply.ballot = m.ballot;
      reply.accepted_ballot = accepted_ballot_;
      reply.members = accepted_;
      return {reply};
    }
    case Kind::accept: {
      promised_ = accepted_ballot_ = m.ballot;
      accepted_ = m.members;
      MembershipMessage reply = to(m.from, Kind::accepted);
      reply.ballot = m.ballot;
      return {reply};
    }
    case Kind::promise: {
      if (phase_ != Phase::prepare || m.ballot != ballot_) return {};
      answered_.insert(m.from);
      if (m.accepted_ballot.round > 0 && best_ballot_ < m.accepted_ballot) {
        best_ballot_ = m.accepted_ballot;
        best_ = m.members;
      }
      // Every member not suspected: a live rank is never left out for being
      // slower than a majority (the deadline settles a silent one).
      return propose_when_complete();
    }
    case Kind::accepted: {
      if (phase_ != Phase::accept || m.ballot != ballot_) return {};
      answered_.insert(m.from);
      if (answered_.size() < quorum()) return {};
      std::set<int> told(view_.members.begin(), view_.members.end());  // every member: one left out learns it
      told.insert(proposal_.begin(), proposal_.end());                 // and every spare admitted
      std::vector<MembershipMessage> out;
      for (int other : told)
        if (other != self_) {
          out.push_back(to(other, Kind::decide));
          out.back().members = proposal_;
        }
      append(out, adopt({view_.epoch + 1, proposal_}));
      return out;
    }
    case Kind::refuse:
      if (phase_ != Phase::none && ballot_ < m.ballot) phase_ = Phase::none;  // outbid: wait, then lead higher
      return {};
    case Kind::decide: break;
  }
  return {};
}

std::vector<MembershipMessage> Membership::admit(const std::vector<int>& ranks) {
  if (fenced_ || spare_ || agreeing_ || leader() != self_) return {};
  for (int rank : ranks)
    if (rank >= 0 && !member(rank)) joining_.insert(rank);
  if (joining_.empty()) return {};
  agreeing_ = true;
  return lead();
}

std::vector<MembershipMessage> Membership::timeout() {
  if (fenced_ || spare_ || !agreeing_) return {};
  if (leader() != self_) return suspect(leader());  // waited for the leader in vain: lost, or cut off
  if (phase_ == Phase::prepare && answered_.size() >= quorum()) {
    // A majority promised: the silent members are lost (each suspected,
    // and told so), the rest proposed.
    std::vector<MembershipMessage> out;
    for (int rank : view_.members)
      if (!answered_.count(rank) && !suspects_.count(rank)) append(out, suspect(rank));
    if (phase_ == Phase::prepare) append(out, propose());  // suspect() may have proposed already
    if (phase_ == Phase::prepare) append(out, lead());     // too few of them unsuspected: ask every member again
    return out;
  }
  return lead();  // again, with a higher ballot
}

}  // namespace moed::comm
