// What the UCX transport, its windows and its peer messages share: the
// bootstrap, the UCX context, the worker and one endpoint to every peer
// (comm/ucx/ucx_transport.h describes the protocol; this is its plumbing).
//
// Tags, from the top bit down: 1 bit set for a peer message
// (comm/peer_messenger.h), clear for an exchange's; 8 bits of the epoch; 31
// bits of the exchange's sequence number in its epoch (wrapping: far fewer
// than 2^31 exchanges are ever open at once); 24 bits of the sender's world
// rank. Neither kind can match the other's receives, and a message of an
// exchange cut short by a loss can never match an exchange of a later epoch.
//
// Ranks: the transport's ranks are dense over the members of the epoch
// (after continue_with(), the survivors of a loss, in world order); the
// endpoints, the tags' senders and the lost peers are by world rank.
//
// Lost peers: with [comm].detect_lost_peers every peer gets a second
// endpoint, the watch, in UCX's error handling mode PEER: an error on it
// (the peer's process or link is gone) marks the peer lost instead of
// leaving the job to a deadline, and the peer messages travel on it. The
// data keeps endpoints without error handling: UCX 1.13 gives an endpoint
// in mode PEER none of its shared-memory transports (tcp alone here), which
// cost the exchanges 3x to 10x of their bandwidth between the ranks of a
// host (tests/bench/transport.sh). An operation on a data endpoint to a
// lost peer may never complete; the waits check the lost peers themselves.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/idle_backoff.h"
#include "comm/ucx/ucx_handles.h"
#include "common/error.h"

namespace moed::comm {

class Bootstrap;

namespace ucx {

using Clock = std::chrono::steady_clock;

constexpr int kRankBits = 24, kSequenceBits = 31, kEpochBits = 8;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr ucp_tag_t kPeerMessageBit = ucp_tag_t{1} << 63;
constexpr int kEpochShift = kRankBits + kSequenceBits;
constexpr ucp_tag_t kEpochMask = ((ucp_tag_t{1} << kEpochBits) - 1) << kEpochShift;

inline ucp_tag_t exchange_tag(std::uint64_t epoch, std::uint64_t sequence, int world_sender) {
  return ((epoch << kEpochShift) & kEpochMask) |
         ((sequence & ((ucp_tag_t{1} << kSequenceBits) - 1)) << kRankBits) | ucp_tag_t(world_sender);
}
inline ucp_tag_t peer_message_tag(int world_sender) { return kPeerMessageBit | ucp_tag_t(world_sender); }
inline int tag_sender(ucp_tag_t tag) { return int(tag & ((ucp_tag_t{1} << kRankBits) - 1)); }

// The messages of an exchange cut short, alive with their requests until
// UCX is done with them: a peer that matched a rendezvous still reads the
// sender's memory, and a receive matched to a sender that stalled still
// writes into its block when that sender runs again (the exchange holds
// the blocks' memory then, Exchange::keep_until_received). continue_with
// waits for every send to a member, and releases the sets whose receives
// are done too; the others stay, with their memory, until theirs are, or
// until the core's end.
class AbandonedSends {
 public:
  virtual ~AbandonedSends() = default;
  // World ranks not lost whose send has not completed.
  virtual std::vector<int> unsettled() const = 0;
  // Bytes of memory kept for receives matched and not completed; 0 when none.
  virtual std::size_t receiving_into() const = 0;
};

// Members are declared in creation order, so they are released endpoints first.
class Core {
 public:
  // `join_slots`: world ranks past the bootstrap's, for processes that join
  // later (connect()); the bootstrap's all_gather may name them already (a
  // joiner's does: the ranks it finds present), an empty address for none.
  Core(Bootstrap& bootstrap, std::chrono::milliseconds timeout, bool detect_lost_peers, int join_slots = 0);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // This rank and the ranks of the epoch, dense.
  int rank() const { return rank_; }
  int size() const { return int(members_.size()); }
  int world_rank(int rank) const { return members_[std::size_t(rank)]; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // "rank 2", or "rank 2 (world 3)" once the ranks are the survivors'.
  std::string name(int rank) const;
  std::uint64_t epoch() const { return epoch_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Clock::time_point deadline() const { return Clock::now() + timeout_; }
  ucp_context_h context() const { return context_.get(); }
  ucp_worker_h worker() const { return worker_.get(); }
  ucp_ep_h endpoint(int rank) const { return endpoints_[std::size_t(world_rank(rank))].get(); }
  // The endpoint for peer messages: the watch where there is one.
  ucp_ep_h message_endpoint(int world_rank) const {
    const auto& endpoints = watch_endpoints_.empty() ? endpoints_ : watch_endpoints_;
    return endpoints[std::size_t(world_rank)].get();
  }

  unsigned progress() { return ucp_worker_progress(worker_.get()); }

  // Every exchange's tag base, in the order the ranks open them (the same
  // on every rank: exchanges and windows' teardowns are collective).
  std::uint64_t next_sequence() { return next_sequence_++; }
  ucp_tag_t tag(std::uint64_t sequence, int sender) const {
    return exchange_tag(epoch_, sequence, world_rank(sender));
  }

  // From here on the ranks are `world_members` (ascending, this rank among
  // them, none lost) as epoch `epoch`: sequence numbers start over, and
  // the messages of earlier epochs' exchanges that no receive took are
  // discarded. Every exchange and window of the earlier epoch must be gone.
  void continue_with(const std::vector<int>& world_members, std::uint64_t epoch);
  // Exchanges and windows alive (+1 as each is made, -1 as it goes).
  void note_open(int delta) { open_ += delta; }
  void set_wait_hook(std::function<void()> hook) { wait_hook_ = std::move(hook); }
  // The wait hook, from a caller that polls instead of blocking (it may throw).
  void run_wait_hook() {
    if (wait_hook_) wait_hook_();
  }
  // Keeps the sends of an exchange cut short until they settle.
  void abandon(std::unique_ptr<AbandonedSends> sends);
  // Keeps the memory of a window torn down without its peers until the
  // core's end: a peer's puts into it may still arrive (one window per
  // loss that cut a migration short).
  void keep_window_memory(std::unique_ptr<MappedMemory> memory);

  // Progresses the worker until done() holds. Past the deadline, calls
  // on_expiry, which must throw (the transport is then marked failed).
  // Yields the core while idle: ranks may share cores. With `hook`, runs the
  // wait hook on idle polls (which may throw to abandon the wait).
  template <class Done, class OnExpiry>
  void progress_until(Done&& done, Clock::time_point deadline, OnExpiry&& on_expiry, bool hook = true) {
    IdleBackoff backoff;
    while (!done()) {
      if (progress() != 0) {
        backoff.reset();
      } else {
        if (hook && wait_hook_) wait_hook_();
        backoff.idle();
      }
      if (Clock::now() > deadline) {
        failed_ = true;
        on_expiry();
        MOED_THROW(Internal, "deadline callback returned instead of throwing");
      }
    }
  }

  // A barrier over the bootstrap during which the worker keeps progressing
  // (a peer may need this rank's progress to finish its close). False, with
  // a warning, when the deadline passes. Only the transport's own teardown
  // uses it: after its endpoints are closed nothing else can carry a barrier.
  bool progressing_barrier(const char* what);

  // After a failure the teardown stays local: peers may be stuck or gone.
  void mark_failed() { failed_ = true; }
  bool failed() const { return failed_ || std::uncaught_exceptions() > 0; }

  // A rank that joined after start-up: its endpoints, from its worker
  // address (Runtime error for a world rank out of range, this rank, or
  // one reached already).
  void connect(int world_rank, std::span<const std::byte> address);
  // Every world rank's worker address known here (empty: none), this rank's included.
  const std::vector<std::vector<std::byte>>& addresses() const { return addresses_; }

  // World ranks whose endpoint reported an error (only with
  // detect_lost_peers), ascending; each is reported by one call only.
  std::vector<int> take_lost_peers();
  bool lost(int world_rank) const { return lost_[std::size_t(world_rank)] != 0; }
  bool any_lost() const { return lost_count_ > 0; }
  // An operation with `world_rank` failed in a way that says it is gone.
  void mark_lost(int world_rank);

 private:
  struct PeerHandle {
    Core* core;
    int peer;
  };
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Every rank reports whether its part succeeded; throws on all ranks
  // unless all did, so that no rank goes on to wait for a failed one.
  void agree(const std::string& local_error, const char* step);
  void close_endpoints();
  // The data endpoint (and the watch) to `peer`, from addresses_.
  void connect_endpoints(int peer);

  // A rank was lost or left out: the bootstrap's collectives would wait for it.
  bool without_some() const { return lost_count_ > 0 || int(members_.size()) < world_size_; }
  // Receives and drops every unexpected exchange message of an epoch other
  // than epoch_ (of `epoch` alone, when given).
  void discard_stale_messages(std::optional<std::uint64_t> epoch = std::nullopt);

  Bootstrap& bootstrap_;
  int world_rank_ = 0, world_size_ = 1, rank_ = 0;
  std::vector<int> members_;  // world rank of each rank
  std::uint64_t epoch_ = 0;
  std::chrono::milliseconds timeout_;
  bool failed_ = false;
  int lost_count_ = 0;
  int open_ = 0;
  std::function<void()> wait_hook_;
  std::uint64_t next_sequence_ = 0;
  std::vector<PeerHandle> peer_handles_;  // the error callbacks' arguments: never reallocated once connected
  std::vector<char> lost_, reported_lost_;
  std::vector<std::vector<std::byte>> addresses_;  // by world rank (empty: none known)
  ucx::Context context_;
  ucx::Worker worker_;
  std::vector<ucx::Endpoint> endpoints_;        // none to self: the self block is a memcpy
  std::vector<ucx::Endpoint> watch_endpoints_;  // with detect_lost_peers: report a lost peer
  std::vector<std::unique_ptr<MappedMemory>> kept_windows_;  // unmapped before the worker and the context go
  std::vector<std::unique_ptr<AbandonedSends>> abandoned_;  // released before the endpoints
};

}  // namespace ucx
}  // namespace moed::comm
