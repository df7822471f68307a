// The ranks' NCCL lanes in one process, with NCCL's rules for grouped
// point-to-point (comm/nccl/nccl_groups.h), so that the NCCL transport's
// bookkeeping runs without a GPU:
//  - on each rank's lane, groups run one after the other, in launch order;
//  - the n-th send from a to b on a lane meets the n-th receive on b from a;
//  - a send or a receive completes only once the group holding its match
//    runs (has begun), and a group completes once all of its own have.
// So an exchange launched out of order, a send with no receive, or sizes
// that disagree show up here as they would on GPUs: a group that never
// completes (a deadline), or an error naming the block.
//
// Thread-safe: ranks may run as threads or all in one thread.
#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/nccl/nccl_groups.h"

namespace moed::test {

class FakeNcclFabric {
 public:
  FakeNcclFabric(int ranks, int lanes)
      : ranks_(ranks), lanes_(lanes), state_(std::size_t(ranks) * std::size_t(lanes)), aborted_(std::size_t(ranks), 0) {
    for (LaneState& s : state_) s.sends_to.assign(std::size_t(ranks), 0), s.receives_from.assign(std::size_t(ranks), 0);
  }

  std::unique_ptr<comm::NcclGroups> groups(int rank);

  // Groups launched and not yet complete, over every rank and lane.
  std::size_t groups_in_flight() const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const LaneState& s : state_) n += s.groups.size();
    return n;
  }
  std::uint64_t groups_completed() const {
    std::lock_guard lock(mutex_);
    std::uint64_t n = 0;
    for (const LaneState& s : state_) n += s.completed;
    return n;
  }

 private:
  friend class FakeNcclGroups;
  struct Group {
    std::uint64_t ticket = 0;
    std::vector<comm::P2pBlock> receives;
    std::vector<std::uint64_t> receive_seq;                  // per receive: its index among those from its peer
    std::vector<std::pair<int, std::uint64_t>> sends;        // (peer, index among sends to it)
  };
  struct LaneState {
    std::deque<Group> groups;  // launched, not complete; the front one runs
    std::uint64_t launched = 0, completed = 0;
    std::vector<std::uint64_t> sends_to, receives_from;  // by peer: how many were launched
  };
  struct Message {
    std::vector<std::byte> bytes;
    std::uint64_t ticket;  // the sender's group
  };
  using Key = std::tuple<int, int, int, std::uint64_t>;  // (lane, source, destination, index)

  LaneState& at(int rank, int lane) { return state_[std::size_t(rank) * std::size_t(lanes_) + std::size_t(lane)]; }
  // Whether rank `rank`'s group `ticket` on `lane` has begun (never, once
  // the rank aborted: its peers' matching groups then never complete).
  bool running(int rank, int lane, std::uint64_t ticket) {
    return !aborted_[std::size_t(rank)] && ticket <= at(rank, lane).completed + 1;
  }

  std::uint64_t launch(int rank, int lane, std::span<const comm::P2pBlock> sends,
                       std::span<const comm::P2pBlock> receives) {
    std::lock_guard lock(mutex_);
    if (aborted_[std::size_t(rank)]) throw std::runtime_error("fake NCCL: launch after abort");
    LaneState& s = at(rank, lane);
    Group g;
    g.ticket = ++s.launched;
    for (const comm::P2pBlock& b : sends) {
      const std::uint64_t index = s.sends_to[std::size_t(b.peer)]++;
      messages_[Key{lane, rank, b.peer, index}] = {std::vector<std::byte>(b.data, b.data + b.bytes), g.ticket};
      g.sends.emplace_back(b.peer, index);
    }
    for (const comm::P2pBlock& b : receives) {
      const std::uint64_t index = s.receives_from[std::size_t(b.peer)]++;
      receive_tickets_[Key{lane, b.peer, rank, index}] = g.ticket;
      g.receives.push_back(b);
      g.receive_seq.push_back(index);
    }
    s.groups.push_back(std::move(g));
    settle();
    return s.launched;
  }

  bool complete(int rank, int lane, std::uint64_t ticket) {
    std::lock_guard lock(mutex_);
    if (!error_.empty()) throw std::runtime_error(error_);
    settle();
    if (!error_.empty()) throw std::runtime_error(error_);
    return at(rank, lane).completed >= ticket;
  }

  // Completes every group that can, until none can.
  void settle() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < ranks_; ++r)
        for (int lane = 0; lane < lanes_ && !aborted_[std::size_t(r)]; ++lane) {
          LaneState& s = at(r, lane);
          if (s.groups.empty() || !ready(r, lane, s.groups.front())) continue;
          finish(r, lane, s.groups.front());
          s.groups.pop_front();
          ++s.completed;
          moved = true;
        }
    }
  }

  bool ready(int rank, int lane, const Group& g) {
    for (std::size_t i = 0; i < g.receives.size(); ++i) {
      const auto m = messages_.find(Key{lane, g.receives[i].peer, rank, g.receive_seq[i]});
      if (m == messages_.end() || !running(g.receives[i].peer, lane, m->second.ticket)) return false;
      if (m->second.bytes.size() != g.receives[i].bytes && error_.empty())
        error_ = "fake NCCL: rank " + std::to_string(g.receives[i].peer) + " sent " +
                 std::to_string(m->second.bytes.size()) + " bytes to rank " + std::to_string(rank) + " on lane " +
                 std::to_string(lane) + ", which receives " + std::to_string(g.receives[i].bytes);
    }
    for (const auto& [peer, index] : g.sends) {
      const Key key{lane, rank, peer, index};
      if (delivered_.count(key)) continue;
      const auto t = receive_tickets_.find(key);
      if (t == receive_tickets_.end() || !running(peer, lane, t->second)) return false;
    }
    return error_.empty();
  }

  void finish(int rank, int lane, const Group& g) {
    for (std::size_t i = 0; i < g.receives.size(); ++i) {
      const Key key{lane, g.receives[i].peer, rank, g.receive_seq[i]};
      const std::vector<std::byte>& bytes = messages_.at(key).bytes;
      if (!bytes.empty()) std::memcpy(g.receives[i].data, bytes.data(), bytes.size());
      messages_.erase(key);
      receive_tickets_.erase(key);
      delivered_.insert(key);  // until its sender's group completes too
    }
    for (const auto& [peer, index] : g.sends) delivered_.erase(Key{lane, rank, peer, index});
  }

  const int ranks_, lanes_;
  mutable std::mutex mutex_;
  std::vector<LaneState> state_;
  std::map<Key, Message> messages_;
  std::map<Key, std::uint64_t> receive_tickets_;
  std::set<Key> delivered_;  // received, while the sending group has not completed
  std::string error_;
  std::vector<char> aborted_;  // by rank: its lanes stopped, nothing of theirs completes
};

class FakeNcclGroups final : public comm::NcclGroups {
 public:
  FakeNcclGroups(FakeNcclFabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}
  int lanes() const override { return fabric_.lanes_; }
  std::uint64_t launch(int lane, std::span<const comm::P2pBlock> sends,
                       std::span<const comm::P2pBlock> receives) override {
    return fabric_.launch(rank_, lane, sends, receives);
  }
  bool complete(int lane, std::uint64_t ticket) override { return fabric_.complete(rank_, lane, ticket); }
  void abort() noexcept override {
    std::lock_guard lock(fabric_.mutex_);
    fabric_.aborted_[std::size_t(rank_)] = 1;
  }
  std::string describe(int lane) const override {
    std::lock_guard lock(fabric_.mutex_);
    const FakeNcclFabric::LaneState& s = fabric_.at(rank_, lane);
    return "launched " + std::to_string(s.launched) + ", completed " + std::to_string(s.completed);
  }

 private:
  FakeNcclFabric& fabric_;
  int rank_;
};

inline std::unique_ptr<comm::NcclGroups> FakeNcclFabric::groups(int rank) {
  return std::make_unique<FakeNcclGroups>(*this, rank);
}

}  // namespace moed::test
