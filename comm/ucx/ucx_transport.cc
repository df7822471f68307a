#include "comm/ucx/ucx_transport.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/idle_backoff.h"
#include "comm/peer_messenger.h"
#include "comm/ucx/ucx_core.h"
#include "comm/ucx/ucx_handles.h"
#include "comm/ucx/ucx_messenger.h"
#include "common/error.h"

namespace moed::comm {

namespace {

using ucx::Clock;
using ucx::kFullMask;
using UcxCore = ucx::Core;

// The tagged messages of one exchange. Completion callbacks count finished
// operations and queue completed receives as arrivals.
//
// A set destroyed with receives pending (after an error) cancels them and
// progresses the worker until each has completed, for at most kCancelGrace,
// before it releases their handles: ucp_request_cancel completes at once
// (UCS_ERR_CANCELED) only a receive that no message has matched yet; one
// already matched (a rendezvous under way) goes on and completes as its data
// lands, and a handle released before then lets UCX write into the buffer
// unseen. Past the grace (a sender stalled mid-rendezvous), a set given the
// blocks' memory (keep) goes to the core with it, its receives unreleased,
// until they complete (elastic serving goes on, and the sender may run
// again); one without is released unfinished. UCX cannot cancel a send, and a
// peer that matched a rendezvous still reads the sender's memory: a set
// with sends pending is handed to the core (ucx::AbandonedSends), alive
// with its callbacks until they complete or their peer is lost; the caller
// keeps the send buffers until then (Transport::continue_with waits for it).
class MessageSet final : public ucx::AbandonedSends {
  struct Op;

 public:
  // at_most: a receive's size is its capacity, filled from 1 byte up.
  MessageSet(const UcxCore& core, std::size_t capacity, bool at_most)
      : core_(core), worker_(core.worker()), at_most_(at_most) {
    ops_.reserve(capacity);
  }
  ~MessageSet() override {
    if (!cancelled_) cancel_receives();
    for (Op& op : ops_)
      if (op.request) ucp_request_free(op.request);  // a send goes on unwatched
  }

  // Cancels the receives not matched yet, and waits (at most kCancelGrace)
  // for those matched to land; not for a lost peer's, which never will.
  void cancel_receives() {
    cancelled_ = true;
    const auto receiving = [&] {
      return std::any_of(ops_.begin(), ops_.end(), [&](const Op& op) {
        return op.is_recv && op.request && !op.done && !core_.lost(op.world);
      });
    };
    for (Op& op : ops_)
      if (op.is_recv && op.request && !op.done) ucp_request_cancel(worker_, op.request);  // may complete it at once
    const auto until = Clock::now() + kCancelGrace;
    IdleBackoff backoff;
    while (receiving() && Clock::now() < until) {
      if (ucp_worker_progress(worker_) != 0)
        backoff.reset();
      else
        backoff.idle();
    }
  }

  bool sending() const {
    return std::any_of(ops_.begin(), ops_.end(), [](const Op& op) { return !op.is_recv && !op.done; });
  }

  // The memory the receive blocks lie in, kept with the set.
  void keep(std::vector<std::byte> memory) { kept_ = std::move(memory); }
  std::size_t receiving_into() const override {
    const bool receiving = std::any_of(ops_.begin(), ops_.end(),
                                       [](const Op& op) { return op.is_recv && op.request && !op.done; });
    return receiving ? kept_.size() : 0;
  }

  // Every send to a rank not lost has completed.
  std::vector<int> unsettled() const override {
    std::vector<int> peers;
    for (const Op& op : ops_)
      if (!op.is_recv && !op.done && !core_.lost(op.world)) peers.push_back(op.world);
    return peers;
  }
  MessageSet(const MessageSet&) = delete;
  MessageSet& operator=(const MessageSet&) = delete;

  void post_recv(int peer, std::byte* buffer, std::size_t bytes, ucp_tag_t tag) {
    Op& op = add(peer, true, bytes);
    ucp_request_param_t param{};
    // No immediate completion: UCX 1.13 does not fill recv_info.tag_info when
    // a receive completes at once (a message already there), so the length
    // would be lost. With this flag the callback reports it, possibly from
    // within this call.
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = on_recv;
    param.user_data = &op;
    op.request = ucx::check_request(
        ucp_tag_recv_nbx(worker_, non_null(buffer), bytes, tag, kFullMask, &param),
        "ucp_tag_recv_nbx", fmt::format("from {}", core_.name(peer)));
  }

  void post_send(ucp_ep_h ep, int peer, const std::byte* buffer, std::size_t bytes, ucp_tag_t tag) {
    Op& op = add(peer, false, bytes);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = on_send;
    param.user_data = &op;
    ucs_status_ptr_t result = ucp_tag_send_nbx(ep, non_null(buffer), bytes, tag, &param);
    if (UCS_PTR_IS_ERR(result)) {
      // Reported as the operation's failure by check(): a lost peer is then
      // PeersUnreachable, not a broken exchange.
      complete(op, UCS_PTR_STATUS(result), 0);
      return;
    }
    op.request = result;
    if (!op.request) complete(op, UCS_OK, bytes);
  }

  bool all_done() const { return completed_ == ops_.size(); }
  bool has_arrival() const { return !arrivals_.empty(); }

  // The peer of the oldest completed receive not taken before, checked as
  // check() does. Only when has_arrival().
  int take_arrival(const std::string& what) {
    const Op& op = ops_[arrivals_.front()];
    arrivals_.pop_front();
    check(op, what);
    return op.peer;
  }

  // The bytes received from `peer` (a completed receive).
  std::size_t received_length(int peer) const {
    for (const Op& op : ops_)
      if (op.is_recv && op.peer == peer) return op.length;
    return 0;
  }

  // Ranks whose receive (or send) has not completed.
  std::vector<int> pending(bool receives) const {
    std::vector<int> peers;
    for (const Op& op : ops_)
      if (!op.done && op.is_recv == receives) peers.push_back(op.peer);
    return peers;
  }

  // After all_done(): every operation succeeded and every message had the
  // length the layout expects.
  void check(const std::string& what) const {
    // A lost peer first, whatever else failed with it.
    std::vector<int> lost;
    const Op* failed_first = nullptr;  // before its peer's watch endpoint said so
    for (const Op& op : ops_)
      if (op.done && unreachable(op)) {
        lost.push_back(op.peer);
        if (!failed_first && !core_.lost(op.world)) failed_first = &op;
      }
    if (!lost.empty()) throw_unreachable(lost, what, failed_first);
    for (const Op& op : ops_) check(op, what);
  }

  // Unfinished operations with a peer found lost since they were posted.
  std::vector<int> pending_with_lost_peers() const {
    std::vector<int> peers;
    if (!core_.any_lost()) return peers;
    for (const Op& op : ops_)
      if (!op.done && core_.lost(core_.world_rank(op.peer))) peers.push_back(op.peer);
    return peers;
  }

  // failed_first: an operation that failed with its connection before a
  // watch endpoint reported its peer, named as the cause.
  [[noreturn]] void throw_unreachable(std::vector<int> peers, const std::string& what,
                                      const Op* failed_first = nullptr) const {
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    std::vector<int> world;
    std::vector<std::string> names;
    for (int peer : peers) {
      world.push_back(core_.world_rank(peer));
      names.push_back(core_.name(peer));
    }
    throw PeersUnreachable(world,
                           fmt::format("{}: {}: lost [{}] ({})", core_.name(core_.rank()), what,
                                       fmt::join(names, ", "),
                                       failed_first ? fmt::format("{} {} failed: {}",
                                                                  failed_first->is_recv ? "a receive from" : "a send to",
                                                                  core_.name(failed_first->peer),
                                                                  ucs_status_string(failed_first->status))
                                                    : std::string("their endpoints failed")),
                           __FILE__, __LINE__);
  }

 private:
  struct Op {
    MessageSet* set;
    int peer;   // in the epoch the set was made in
    int world;  // the same peer's world rank
    bool is_recv;
    std::size_t expected;
    void* request = nullptr;
    bool done = false;
    ucs_status_t status = UCS_OK;
    std::size_t length = 0;
  };

  void check(const Op& op, const std::string& what) const {
    const std::string me = core_.name(core_.rank()), peer = core_.name(op.peer);
    if (unreachable(op)) throw_unreachable({op.peer}, what, core_.lost(op.world) ? nullptr : &op);
    if (op.status == UCS_ERR_MESSAGE_TRUNCATED)
      MOED_THROW(Runtime, "{}: {}: {} sent more than the {} bytes expected", me, what, peer, op.expected);
    if (op.status != UCS_OK)
      ucx::throw_ucs(op.is_recv ? "ucp_tag_recv_nbx" : "ucp_tag_send_nbx", op.status,
                     fmt::format("{}: {}: {} {}", me, what, op.is_recv ? "from" : "to", peer));
    if (op.is_recv && op.length != op.expected && !(at_most_ && op.length > 0 && op.length < op.expected))
      MOED_THROW(Runtime, "{}: {}: {} sent {} bytes, {} expected (the ranks disagree on the exchange layout)", me,
                 what, peer, op.length, op.expected);
  }

  // Failed because its peer is gone: the peer's watch endpoint said so, or
  // the operation's own status did first (a send to a rank killed a moment
  // ago fails at once). The peer is not marked lost here: the receives
  // matched to it are still waited for (cancel_receives), and the survivors'
  // agreement decides.
  bool unreachable(const Op& op) const {
    if (op.status == UCS_OK || op.status == UCS_ERR_MESSAGE_TRUNCATED) return false;
    return core_.lost(op.world) || ucx::connection_gone(op.status);
  }

  Op& add(int peer, bool is_recv, std::size_t bytes) {
    // The callbacks hold pointers into ops_: it must never reallocate.
    MOED_CHECK(ops_.size() < ops_.capacity(), "{} messages posted, room for {}", ops_.size() + 1,
               ops_.capacity());
    return ops_.emplace_back(Op{this, peer, core_.world_rank(peer), is_recv, bytes});
  }

  // UCX wants a valid address even for a zero-byte message.
  template <class T>
  static T* non_null(T* p) {
    static std::byte dummy;
    return p ? p : reinterpret_cast<T*>(&dummy);
  }

  // False when the operation had completed before.
  static bool complete(Op& op, ucs_status_t status, std::size_t length) {
    if (op.done) return false;
    op.done = true;
    op.status = status;
    op.length = length;
    ++op.set->completed_;
    return true;
  }
  static void on_send(void*, ucs_status_t status, void* user_data) {
    Op& op = *static_cast<Op*>(user_data);
    complete(op, status, op.expected);
  }
  static void on_recv(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user_data) {
    Op& op = *static_cast<Op*>(user_data);
    if (complete(op, status, info ? info->length : 0))
      op.set->arrivals_.push_back(std::size_t(&op - op.set->ops_.data()));
  }

  const UcxCore& core_;
  ucp_worker_h worker_;
  bool at_most_;
  bool cancelled_ = false;
  std::vector<std::byte> kept_;  // the receive blocks' memory, once handed over (keep)
  std::vector<Op> ops_;
  std::size_t completed_ = 0;
  std::deque<std::size_t> arrivals_;  // completed receives (indices into ops_) not yet taken
};

// One all-to-all-v over tagged messages: ucx::exchange_tag(sequence, sender), so
// that the blocks of exchanges open at once never match each other's
// receives. Blocks of 0 bytes are not messages; the block to self is a copy.
// Any error marks the core failed (the teardown then stays local).
class UcxExchange final : public Exchange {
 public:
  UcxExchange(std::shared_ptr<UcxCore> core, std::uint64_t sequence, std::byte* recv,
              const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offsets,
              const std::string& what, ReceiveSizes sizes)
      : core_(std::move(core)),
        sequence_(sequence),
        deadline_(core_->deadline()),
        what_(what),
        recv_(recv),
        recv_bytes_(recv_bytes),
        recv_offsets_(recv_offsets),
        messages_(std::make_unique<MessageSet>(*core_, 2 * std::size_t(core_->size() - 1),
                                               sizes == ReceiveSizes::at_most)),
        at_most_(sizes == ReceiveSizes::at_most),
        sent_(std::size_t(core_->size()), false) {
    core_->note_open(+1);
    guarded([&] {
      const int n = core_->size(), me = core_->rank();
      MOED_CHECK(int(recv_bytes_.size()) == n && int(recv_offsets_.size()) == n,
                 "{}: receive layout for {} ranks, {} in the job", what_, recv_bytes_.size(), n);
      for (int src = 0; src < n; ++src) {
        if (recv_bytes_[src] == 0)
          local_arrivals_.push_back(src);  // both sides know the block is empty
        else if (src != me)
          messages_->post_recv(src, recv_ + recv_offsets_[src], recv_bytes_[src],
                              core_->tag(sequence_, src));
      }
    });
  }
  ~UcxExchange() override {
    core_->note_open(-1);
    // Unfinished: an error unwinds. Pending receives are cancelled; pending
    // sends stay with the core until UCX is done with them. Peers may be
    // left waiting, so teardown stays local.
    if (finished_) return;
    core_->mark_failed();
    messages_->cancel_receives();
    if (messages_->sending() || messages_->receiving_into() > 0) core_->abandon(std::move(messages_));
  }

  void keep_until_received(std::vector<std::byte> memory) override { messages_->keep(std::move(memory)); }

  void send(int dest, const std::byte* data, std::size_t bytes) override {
    guarded([&] {
      const int n = core_->size(), me = core_->rank();
      MOED_CHECK(dest >= 0 && dest < n, "{}: send to rank {} of {}", what_, dest, n);
      MOED_CHECK(!sent_[dest], "{}: a second send to rank {}", what_, dest);
      sent_[dest] = true;
      if (dest == me) return send_to_self(data, bytes);
      if (bytes == 0) return;
      messages_->post_send(core_->endpoint(dest), dest, data, bytes, core_->tag(sequence_, me));
    });
  }

  int next_arrival(bool block) override {
    return guarded([&] {
      if (reported_ == core_->size()) return kAllArrived;
      if (block) {
        core_->progress_until([&] { return has_arrival() || lost_peer(); }, deadline_, [&] { throw_deadline(); });
      } else {
        const unsigned events = core_->progress();  // once: the caller polls between its own work
        // A caller that only polls waits all the same: on an idle poll it
        // answers the hook as a blocking wait does, or an agreement it never
        // hears of leaves it out (mpi.elastic.late_join failed so under load).
        if (events == 0 && !has_arrival()) core_->run_wait_hook();
        if (!has_arrival() && Clock::now() > deadline_) throw_deadline();
      }
      if (!has_arrival()) throw_if_lost();
      if (!has_arrival()) return kNoneYet;
      ++reported_;
      if (!local_arrivals_.empty()) {
        const int src = local_arrivals_.front();
        local_arrivals_.pop_front();
        return src;
      }
      return messages_->take_arrival(what_);
    });
  }

  std::size_t received_bytes(int source) const override {
    if (source == core_->rank()) return self_bytes_;
    if (recv_bytes_.at(std::size_t(source)) == 0) return 0;
    return messages_->received_length(source);
  }

  void finish() override {
    guarded([&] {
      const int me = core_->rank();
      MOED_CHECK(sent_[me] || recv_bytes_[me] == 0, "{}: finish before the block to self was sent",
                 what_);
      core_->progress_until([&] { return messages_->all_done() || lost_peer(); }, deadline_,
                            [&] { throw_deadline(); });
      throw_if_lost();
      messages_->check(what_);
      finished_ = true;
    });
  }

 private:
  // Runs f; an error marks the core failed on its way out.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (...) {
      core_->mark_failed();
      throw;
    }
  }

  bool has_arrival() const { return !local_arrivals_.empty() || messages_->has_arrival(); }
  // A peer this exchange still waits for is lost: a receive posted by tag
  // belongs to no endpoint, and UCX never fails it.
  bool lost_peer() const { return !messages_->pending_with_lost_peers().empty(); }
  void throw_if_lost() const {
    if (std::vector<int> peers = messages_->pending_with_lost_peers(); !peers.empty())
      messages_->throw_unreachable(std::move(peers), what_);
  }

  void send_to_self(const std::byte* data, std::size_t bytes) {
    const int me = core_->rank();
    MOED_CHECK(bytes == recv_bytes_[me] || (at_most_ && bytes > 0 && bytes < recv_bytes_[me]),
               "{}: {} bytes sent to self, {} expected", what_, bytes, recv_bytes_[me]);
    self_bytes_ = bytes;
    if (bytes == 0) return;  // reported at open
    std::memcpy(recv_ + recv_offsets_[me], data, bytes);
    local_arrivals_.push_back(me);
  }

  [[noreturn]] void throw_deadline() const {
    std::vector<int> from = messages_->pending(true);
    const int me = core_->rank();
    if (!sent_[me] && recv_bytes_[me] != 0) {
      from.push_back(me);
      std::sort(from.begin(), from.end());
    }
    const std::vector<int> to = messages_->pending(false);
    std::string sends =
        to.empty() ? "" : fmt::format(", and for sends to ranks [{}]", fmt::join(to, ", "));
    // The peers waited for, by world rank: elastic serving suspects them.
    std::vector<int> peers;
    for (int rank : from)
      if (rank != me) peers.push_back(core_->world_rank(rank));
    for (int rank : to) peers.push_back(core_->world_rank(rank));
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    const std::string message = fmt::format(
        "{}: {}: deadline of {} ms expired; still waiting for data from ranks [{}]{} ([comm].timeout_ms)",
        core_->name(me), what_, core_->timeout().count(), fmt::join(from, ", "), sends);
    if (peers.empty()) MOED_THROW(Runtime, "{}", message);
    throw PeersUnreachable(std::move(peers), message, __FILE__, __LINE__);
  }

  std::shared_ptr<UcxCore> core_;  // declared first: the worker outlives the messages
  std::uint64_t sequence_;
  Clock::time_point deadline_;
  std::string what_;
  std::byte* recv_;
  std::vector<std::size_t> recv_bytes_, recv_offsets_;
  std::unique_ptr<MessageSet> messages_;
  bool at_most_;
  std::size_t self_bytes_ = 0;       // the block to self, once sent
  std::vector<bool> sent_;           // by destination
  std::deque<int> local_arrivals_;   // self and 0-byte sources, not yet reported
  int reported_ = 0;
  bool finished_ = false;
};

// A barrier over the endpoints, not the bootstrap: one exchange of a byte
// with every peer (so that serving never waits on MPI after start-up).
// Throws as an exchange does when a peer does not come in time.
void peer_barrier(const std::shared_ptr<UcxCore>& core, const std::string& what) {
  const auto ranks = std::size_t(core->size());
  std::vector<std::byte> tokens(ranks);
  const std::vector<std::size_t> bytes(ranks, 1);
  std::vector<std::size_t> offsets(ranks);
  std::iota(offsets.begin(), offsets.end(), std::size_t{0});
  UcxExchange exchange(core, core->next_sequence(), tokens.data(), bytes, offsets, what, ReceiveSizes::exact);
  const std::byte token{1};
  for (int peer = 0; peer < core->size(); ++peer) exchange.send(peer, &token, 1);
  exchange.finish();
}

// A window in memory allocated and registered by ucp_mem_map. Puts to self
// are a memcpy; puts to peers go through their unpacked rkeys.
class UcxWindow final : public RmaWindow {
 public:
  UcxWindow(std::shared_ptr<UcxCore> core, std::size_t bytes)
      : core_(std::move(core)),
        memory_(std::make_unique<ucx::MappedMemory>(core_->context(),
                                                    std::max<std::size_t>(bytes, 1))),  // UCX refuses length 0
        bytes_(bytes) {
    std::memset(memory_->data(), 0, memory_->bytes());
    core_->note_open(+1);
  }
  ~UcxWindow() override {
    core_->note_open(-1);
    // Collective like MPI_Win_free: no rank unmaps its window while a peer may
    // still be writing into it. Each rank's puts have landed once it has
    // flushed; the barrier waits for every rank's flush.
    try {
      if (!core_->failed()) {
        flush("window teardown");
        peer_barrier(core_, "window teardown: every rank's puts landed");
      }
    } catch (const std::exception& e) {
      spdlog::warn("UCX window teardown: {}", e.what());
    }
    // Torn down alone (a loss, or an error): a peer's puts may still be on
    // their way, and over tcp this rank's worker writes each where its
    // sender aimed it, whenever it arrives. The memory stays.
    if (core_->failed()) core_->keep_window_memory(std::move(memory_));
  }

  const ucx::MappedMemory& memory() const { return *memory_; }

  // Called once by create_window with every rank's base address, size and
  // packed rkey (packed[r] is rank r's).
  void connect(std::vector<std::uint64_t> bases, std::vector<std::uint64_t> sizes,
               const std::vector<std::span<const std::byte>>& packed) {
    remote_base_ = std::move(bases);
    remote_bytes_ = std::move(sizes);
    rkeys_.resize(core_->size());
    for (int peer = 0; peer < core_->size(); ++peer)
      if (peer != core_->rank())
        rkeys_[peer] = ucx::unpack_rkey(core_->endpoint(peer), packed[peer]);
    unflushed_.assign(core_->size(), false);
  }

  std::byte* local() override { return memory_->data(); }
  std::size_t bytes() const override { return bytes_; }

  void put(int target, std::size_t offset, const void* src, std::size_t bytes) override {
    MOED_CHECK(target >= 0 && target < core_->size(), "put to rank {} of {}", target,
               core_->size());
    MOED_CHECK(offset <= remote_bytes_[target] && bytes <= remote_bytes_[target] - offset,
               "put of {} bytes at {} into rank {}'s {}-byte window", bytes, offset, target,
               remote_bytes_[target]);
    if (bytes == 0) return;
    if (target == core_->rank()) {
      std::memcpy(memory_->data() + offset, src, bytes);
      return;
    }
    ucp_request_param_t param{};
    // The handle is released at once: flush() waits for completion.
    unflushed_[target] = true;
    ucs_status_ptr_t result = ucp_put_nbx(core_->endpoint(target), src, bytes, remote_base_[target] + offset,
                                                rkeys_[target].get(), &param);
    if (UCS_PTR_IS_ERR(result) && core_->lost(core_->world_rank(target))) return;  // flush() reports it
    if (UCS_PTR_IS_ERR(result) && ucx::connection_gone(UCS_PTR_STATUS(result))) {  // before its watch endpoint said so
      core_->mark_failed();
      throw PeersUnreachable({core_->world_rank(target)},
                             fmt::format("{}: a put to {} failed: {}", core_->name(core_->rank()), core_->name(target),
                                         ucs_status_string(UCS_PTR_STATUS(result))),
                             __FILE__, __LINE__);
    }
    ucx::Request request(ucx::check_request(result, "ucp_put_nbx", fmt::format("to {}", core_->name(target))));
  }

  void flush(const std::string& what) override {
    ucp_request_param_t param{};
    ucx::Request request(
        ucx::check_request(ucp_worker_flush_nbx(core_->worker(), &param), "ucp_worker_flush_nbx"));
    core_->progress_until(
        [&] { return request.done() || !lost_targets().empty(); }, core_->deadline(),
        [&] {
          std::vector<int> targets, world;
          for (int r = 0; r < core_->size(); ++r)
            if (unflushed_[r]) {
              targets.push_back(r);
              world.push_back(core_->world_rank(r));
            }
          throw PeersUnreachable(
              world,
              fmt::format("{}: {}: deadline of {} ms expired; puts to ranks [{}] not confirmed (over "
                          "tcp a target completes puts only while it progresses UCX) ([comm].timeout_ms)",
                          core_->name(core_->rank()), what, core_->timeout().count(), fmt::join(targets, ", ")),
              __FILE__, __LINE__);
        });
    if (std::vector<int> lost = lost_targets(); !lost.empty()) {
      core_->mark_failed();
      throw PeersUnreachable(lost,
                             fmt::format("{}: {}: puts to world ranks [{}] cannot land: their endpoints failed",
                                         core_->name(core_->rank()), what, fmt::join(lost, ", ")),
                             __FILE__, __LINE__);
    }
    if (ucs_status_t s = request.status(); s != UCS_OK) {
      core_->mark_failed();
      ucx::throw_ucs("ucp_worker_flush_nbx", s, fmt::format("{}: {}", core_->name(core_->rank()), what));
    }
    unflushed_.assign(core_->size(), false);
  }

 private:
  // World ranks put to since the last flush whose endpoint failed.
  std::vector<int> lost_targets() const {
    std::vector<int> lost;
    if (!core_->any_lost()) return lost;
    for (int r = 0; r < core_->size(); ++r)
      if (unflushed_[r] && core_->lost(core_->world_rank(r))) lost.push_back(core_->world_rank(r));
    return lost;
  }

  std::shared_ptr<UcxCore> core_;  // outlives the keys and the memory
  std::unique_ptr<ucx::MappedMemory> memory_;
  std::size_t bytes_;
  std::vector<std::uint64_t> remote_base_, remote_bytes_;
  std::vector<ucx::Rkey> rkeys_;  // released before the memory and the endpoints
  std::vector<bool> unflushed_;   // targets put to since the last flush
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(const CommConfig& config, Bootstrap& bootstrap)
      : core_(std::make_shared<UcxCore>(bootstrap, std::chrono::milliseconds(config.timeout_ms),
                                        config.detect_lost_peers || config.elastic, int(config.join_slots))) {}
  ~UcxTransport() override {
    if (std::uncaught_exceptions() > 0) core_->mark_failed();
  }

  const char* name() const override { return "ucx"; }
  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  int world_rank(int rank) const override { return core_->world_rank(rank); }
  void progress() override { core_->progress(); }
  void continue_with(const std::vector<int>& world_members, std::uint64_t epoch) override {
    core_->continue_with(world_members, epoch);
  }
  void set_wait_hook(std::function<void()> hook) override { core_->set_wait_hook(std::move(hook)); }
  std::vector<std::vector<std::byte>> world_addresses() const override { return core_->addresses(); }
  void connect_joiner(int world_rank, std::span<const std::byte> address) override {
    core_->connect(world_rank, address);
  }
  PeerMessenger* messenger() override {
    // Made on first use: its posted receives match by a mask, which every
    // arriving exchange message would otherwise be checked against too.
    if (!messenger_) messenger_ = make_ucx_messenger(core_);
    return messenger_.get();
  }

  std::unique_ptr<Exchange> open_exchange(std::byte* recv, const std::vector<std::size_t>& recv_bytes,
                                          const std::vector<std::size_t>& recv_offsets,
                                          const std::string& what, ReceiveSizes sizes) override {
    // All ranks open their exchanges in the same order: the sequence number
    // names the same exchange everywhere.
    return std::make_unique<UcxExchange>(core_, core_->next_sequence(), recv, recv_bytes, recv_offsets, what,
                                         sizes);
  }

  std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) override {
    auto window = std::make_unique<UcxWindow>(core_, bytes);
    ucx::PackedRkey packed(core_->context(), window->memory());
    // Every rank's base address, size and packed-key length ...
    struct Info {
      std::uint64_t base, bytes, key_bytes;
    };
    const Info mine{reinterpret_cast<std::uintptr_t>(window->local()), bytes,
                    packed.bytes().size()};
    std::vector<Info> infos(size());
    all_gather(&mine, sizeof mine, infos.data(), what + " (window addresses)");
    // ... then the packed keys themselves.
    ExchangeLayout layout;
    layout.send_bytes.assign(size(), packed.bytes().size());
    layout.send_offsets.assign(size(), 0);
    for (const Info& info : infos) layout.recv_bytes.push_back(info.key_bytes);
    layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
    std::vector<std::byte> keys(layout.recv_total());
    exchange(packed.bytes().data(), layout, keys.data(), what + " (window keys)");

    std::vector<std::uint64_t> bases, sizes;
    std::vector<std::span<const std::byte>> key_of;
    for (int r = 0; r < size(); ++r) {
      bases.push_back(infos[r].base);
      sizes.push_back(infos[r].bytes);
      key_of.push_back(
          std::span<const std::byte>(keys).subspan(layout.recv_offsets[r], layout.recv_bytes[r]));
    }
    try {
      window->connect(std::move(bases), std::move(sizes), key_of);
    } catch (...) {
      core_->mark_failed();
      throw;
    }
    return window;
  }

 private:
  std::shared_ptr<UcxCore> core_;  // shared with the windows, which may outlive the transport
  std::unique_ptr<PeerMessenger> messenger_;
};

}  // namespace

std::unique_ptr<Transport> create_ucx_transport(const CommConfig& config, Bootstrap& bootstrap) {
  return std::make_unique<UcxTransport>(config, bootstrap);
}

std::optional<std::string> ucx_unavailable(const CommConfig&, const Bootstrap&) {
  try {
    ucx::Context context = ucx::make_context(1);
    ucx::Worker worker = ucx::make_worker(context.get());
    ucx::WorkerAddress address(worker.get());
    return std::nullopt;
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

}  // namespace moed::comm
