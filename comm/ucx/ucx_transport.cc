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
#include "comm/ucx/ucx_handles.h"
#include "common/error.h"

namespace moed::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Tag of a message: the exchange's sequence number above the sender's rank.
constexpr int kRankBits = 24;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
ucp_tag_t message_tag(std::uint64_t sequence, int sender) {
  return (sequence << kRankBits) | ucp_tag_t(sender);
}

// What the transport and its windows share: the bootstrap, the UCX context,
// the worker and the endpoints. Members are declared in creation order, so
// they are released endpoints first.
class UcxCore {
 public:
  UcxCore(Bootstrap& bootstrap, std::chrono::milliseconds timeout);
  ~UcxCore();
  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Clock::time_point deadline() const { return Clock::now() + timeout_; }
  ucp_context_h context() const { return context_.get(); }
  ucp_worker_h worker() const { return worker_.get(); }
  ucp_ep_h endpoint(int peer) const { return endpoints_[peer].get(); }

  unsigned progress() { return ucp_worker_progress(worker_.get()); }

  // Every exchange's sequence number, in the order the ranks open them
  // (the same on every rank: exchanges and windows' teardowns are collective).
  std::uint64_t next_sequence() { return next_sequence_++; }

  // Progresses the worker until done() holds. Past the deadline, calls
  // on_expiry, which must throw (the transport is then marked failed).
  // Yields the core while idle: ranks may share cores.
  template <class Done, class OnExpiry>
  void progress_until(Done&& done, Clock::time_point deadline, OnExpiry&& on_expiry) {
    IdleBackoff backoff;
    while (!done()) {
      if (progress() != 0)
        backoff.reset();
      else
        backoff.idle();
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

 private:
  // Every rank reports whether its part succeeded; throws on all ranks
  // unless all did, so that no rank goes on to wait for a failed one.
  void agree(const std::string& local_error, const char* step);
  void close_endpoints();

  Bootstrap& bootstrap_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  ucx::Context context_;
  ucx::Worker worker_;
  std::vector<ucx::Endpoint> endpoints_;  // none to self: the self block is a memcpy
  bool failed_ = false;
  std::uint64_t next_sequence_ = 0;
};

UcxCore::UcxCore(Bootstrap& bootstrap, std::chrono::milliseconds timeout)
    : bootstrap_(bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()), timeout_(timeout) {
  if (size_ >= (1 << kRankBits))
    MOED_THROW(Runtime, "UCX transport: {} ranks exceed the {} the message tags can name", size_,
               1 << kRankBits);

  std::string error;
  std::optional<ucx::WorkerAddress> address;
  try {
    context_ = ucx::make_context(std::size_t(size_));
    worker_ = ucx::make_worker(context_.get());
    address.emplace(worker_.get());
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "start");

  const std::vector<std::vector<std::byte>> addresses =
      bootstrap_.all_gather(address->bytes(), "UCX transport: the worker addresses");
  try {
    endpoints_.resize(size_);
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_) endpoints_[peer] = ucx::Endpoint(worker_.get(), addresses[peer]);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "connect");
}

void UcxCore::agree(const std::string& local_error, const char* step) {
  const bool failed_somewhere =
      bootstrap_.all_max(local_error.empty() ? 0 : 1, fmt::format("UCX transport: whether every rank could {}", step));
  if (!failed_somewhere) return;
  failed_ = true;
  if (!local_error.empty()) MOED_THROW(Runtime, "UCX transport on rank {}: {}", rank_, local_error);
  MOED_THROW(Runtime, "UCX transport: failed to {} on another rank (see its error)", step);
}

bool UcxCore::progressing_barrier(const char* what) {
  try {
    bootstrap_.barrier(fmt::format("UCX transport: {}", what), [this] { progress(); });
    return true;
  } catch (const Error&) {
    spdlog::warn("UCX transport: {}: not every rank arrived within {} ms; closing without them",
                 what, timeout_.count());
    failed_ = true;
    return false;
  }
}

void UcxCore::close_endpoints() {
  std::vector<ucx::Request> closing;
  for (auto& endpoint : endpoints_)
    if (endpoint) closing.push_back(endpoint.start_close());
  const auto all_closed = [&] {
    for (const auto& request : closing)
      if (!request.done()) return false;
    return true;
  };
  try {
    progress_until(all_closed, deadline(), [&] {
      MOED_THROW(Runtime, "closing UCX endpoints took over {} ms", timeout_.count());
    });
  } catch (const Error& e) {
    spdlog::warn("UCX transport: {}", e.what());
  }
}

UcxCore::~UcxCore() {
  // Graceful teardown, all ranks together: once every rank is here no more
  // data is in flight; close the endpoints (each close flushes and tells the
  // peer); and wait again so that no worker is destroyed while a peer still
  // needs it to finish closing. After a failure, skip the peers.
  try {
    if (!failed() && progressing_barrier("teardown")) {
      close_endpoints();
      progressing_barrier("teardown after closing endpoints");
    }
  } catch (const std::exception& e) {
    spdlog::warn("UCX transport teardown: {}", e.what());
  }
}

// The tagged messages of one exchange. Completion callbacks count finished
// operations and queue completed receives as arrivals.
//
// A set destroyed with receives pending (after an error) cancels them and
// progresses the worker until each has completed, for at most kCancelGrace,
// before it releases their handles: ucp_request_cancel completes at once
// (UCS_ERR_CANCELED) only a receive that no message has matched yet; one
// already matched (a rendezvous under way) goes on and completes as its data
// lands, and a handle released before then lets UCX write into the buffer
// unseen. Past the grace (a sender stalled mid-rendezvous) the receive is
// released unfinished: the job is ending. Pending sends are released and go
// on unwatched (UCX cannot cancel a send).
class MessageSet {
 public:
  // at_most: a receive's size is its capacity, filled from 1 byte up.
  MessageSet(ucp_worker_h worker, std::size_t capacity, bool at_most) : worker_(worker), at_most_(at_most) {
    ops_.reserve(capacity);
  }
  ~MessageSet() {
    const auto receiving = [&] {
      return std::any_of(ops_.begin(), ops_.end(), [](const Op& op) { return op.is_recv && op.request && !op.done; });
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
    for (Op& op : ops_)
      if (op.request) ucp_request_free(op.request);
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
        "ucp_tag_recv_nbx", fmt::format("from rank {}", peer));
  }

  void post_send(ucp_ep_h ep, int peer, const std::byte* buffer, std::size_t bytes, ucp_tag_t tag) {
    Op& op = add(peer, false, bytes);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = on_send;
    param.user_data = &op;
    op.request = ucx::check_request(ucp_tag_send_nbx(ep, non_null(buffer), bytes, tag, &param),
                                    "ucp_tag_send_nbx", fmt::format("to rank {}", peer));
    if (!op.request) complete(op, UCS_OK, bytes);
  }

  bool all_done() const { return completed_ == ops_.size(); }
  bool has_arrival() const { return !arrivals_.empty(); }

  // The peer of the oldest completed receive not taken before, checked as
  // check() does. Only when has_arrival().
  int take_arrival(int rank, const std::string& what) {
    const Op& op = ops_[arrivals_.front()];
    arrivals_.pop_front();
    check(op, rank, what, at_most_);
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
  void check(int rank, const std::string& what) const {
    for (const Op& op : ops_) check(op, rank, what, at_most_);
  }

 private:
  struct Op {
    MessageSet* set;
    int peer;
    bool is_recv;
    std::size_t expected;
    void* request = nullptr;
    bool done = false;
    ucs_status_t status = UCS_OK;
    std::size_t length = 0;
  };

  static void check(const Op& op, int rank, const std::string& what, bool at_most) {
    if (op.status == UCS_ERR_MESSAGE_TRUNCATED)
      MOED_THROW(Runtime, "rank {}: {}: rank {} sent more than the {} bytes expected", rank, what,
                 op.peer, op.expected);
    if (op.status != UCS_OK)
      ucx::throw_ucs(op.is_recv ? "ucp_tag_recv_nbx" : "ucp_tag_send_nbx", op.status,
                     fmt::format("rank {}: {}: {} rank {}", rank, what,
                                 op.is_recv ? "from" : "to", op.peer));
    if (op.is_recv && op.length != op.expected && !(at_most && op.length > 0 && op.length < op.expected))
      MOED_THROW(Runtime,
                 "rank {}: {}: rank {} sent {} bytes, {} expected (the ranks disagree "
                 "on the exchange layout)",
                 rank, what, op.peer, op.length, op.expected);
  }

  Op& add(int peer, bool is_recv, std::size_t bytes) {
    // The callbacks hold pointers into ops_: it must never reallocate.
    MOED_CHECK(ops_.size() < ops_.capacity(), "{} messages posted, room for {}", ops_.size() + 1,
               ops_.capacity());
    return ops_.emplace_back(Op{this, peer, is_recv, bytes});
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

  ucp_worker_h worker_;
  bool at_most_;
  std::vector<Op> ops_;
  std::size_t completed_ = 0;
  std::deque<std::size_t> arrivals_;  // completed receives (indices into ops_) not yet taken
};

// One all-to-all-v over tagged messages: message_tag(sequence, sender), so
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
        messages_(core_->worker(), 2 * std::size_t(core_->size() - 1), sizes == ReceiveSizes::at_most),
        at_most_(sizes == ReceiveSizes::at_most),
        sent_(std::size_t(core_->size()), false) {
    guarded([&] {
      const int n = core_->size(), me = core_->rank();
      MOED_CHECK(int(recv_bytes_.size()) == n && int(recv_offsets_.size()) == n,
                 "{}: receive layout for {} ranks, {} in the job", what_, recv_bytes_.size(), n);
      for (int src = 0; src < n; ++src) {
        if (recv_bytes_[src] == 0)
          local_arrivals_.push_back(src);  // both sides know the block is empty
        else if (src != me)
          messages_.post_recv(src, recv_ + recv_offsets_[src], recv_bytes_[src],
                              message_tag(sequence_, src));
      }
    });
  }
  ~UcxExchange() override {
    // Unfinished: an error unwinds. The messages' destructor cancels the
    // pending receives; peers may be left waiting, so teardown stays local.
    if (!finished_) core_->mark_failed();
  }

  void send(int dest, const std::byte* data, std::size_t bytes) override {
    guarded([&] {
      const int n = core_->size(), me = core_->rank();
      MOED_CHECK(dest >= 0 && dest < n, "{}: send to rank {} of {}", what_, dest, n);
      MOED_CHECK(!sent_[dest], "{}: a second send to rank {}", what_, dest);
      sent_[dest] = true;
      if (dest == me) return send_to_self(data, bytes);
      if (bytes == 0) return;
      messages_.post_send(core_->endpoint(dest), dest, data, bytes, message_tag(sequence_, me));
    });
  }

  int next_arrival(bool block) override {
    return guarded([&] {
      if (reported_ == core_->size()) return kAllArrived;
      if (block) {
        core_->progress_until([&] { return has_arrival(); }, deadline_, [&] { throw_deadline(); });
      } else {
        core_->progress();  // once: the caller polls between its own work
        if (!has_arrival() && Clock::now() > deadline_) throw_deadline();
      }
      if (!has_arrival()) return kNoneYet;
      ++reported_;
      if (!local_arrivals_.empty()) {
        const int src = local_arrivals_.front();
        local_arrivals_.pop_front();
        return src;
      }
      return messages_.take_arrival(core_->rank(), what_);
    });
  }

  std::size_t received_bytes(int source) const override {
    if (source == core_->rank()) return self_bytes_;
    if (recv_bytes_.at(std::size_t(source)) == 0) return 0;
    return messages_.received_length(source);
  }

  void finish() override {
    guarded([&] {
      const int me = core_->rank();
      MOED_CHECK(sent_[me] || recv_bytes_[me] == 0, "{}: finish before the block to self was sent",
                 what_);
      core_->progress_until([&] { return messages_.all_done(); }, deadline_,
                            [&] { throw_deadline(); });
      messages_.check(me, what_);
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

  bool has_arrival() const { return !local_arrivals_.empty() || messages_.has_arrival(); }

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
    std::vector<int> from = messages_.pending(true);
    const int me = core_->rank();
    if (!sent_[me] && recv_bytes_[me] != 0) {
      from.push_back(me);
      std::sort(from.begin(), from.end());
    }
    const std::vector<int> to = messages_.pending(false);
    std::string sends =
        to.empty() ? "" : fmt::format(", and for sends to ranks [{}]", fmt::join(to, ", "));
    MOED_THROW(Runtime,
               "rank {}: {}: deadline of {} ms expired; still waiting for data from ranks [{}]{} "
               "([comm].timeout_ms)",
               me, what_, core_->timeout().count(), fmt::join(from, ", "), sends);
  }

  std::shared_ptr<UcxCore> core_;  // declared first: the worker outlives the messages
  std::uint64_t sequence_;
  Clock::time_point deadline_;
  std::string what_;
  std::byte* recv_;
  std::vector<std::size_t> recv_bytes_, recv_offsets_;
  MessageSet messages_;
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
        memory_(core_->context(), std::max<std::size_t>(bytes, 1)),  // UCX refuses length 0
        bytes_(bytes) {
    std::memset(memory_.data(), 0, memory_.bytes());
  }
  ~UcxWindow() override {
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
  }

  const ucx::MappedMemory& memory() const { return memory_; }

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

  std::byte* local() override { return memory_.data(); }
  std::size_t bytes() const override { return bytes_; }

  void put(int target, std::size_t offset, const void* src, std::size_t bytes) override {
    MOED_CHECK(target >= 0 && target < core_->size(), "put to rank {} of {}", target,
               core_->size());
    MOED_CHECK(offset <= remote_bytes_[target] && bytes <= remote_bytes_[target] - offset,
               "put of {} bytes at {} into rank {}'s {}-byte window", bytes, offset, target,
               remote_bytes_[target]);
    if (bytes == 0) return;
    if (target == core_->rank()) {
      std::memcpy(memory_.data() + offset, src, bytes);
      return;
    }
    ucp_request_param_t param{};
    // The handle is released at once: flush() waits for completion.
    ucx::Request request(
        ucx::check_request(ucp_put_nbx(core_->endpoint(target), src, bytes,
                                       remote_base_[target] + offset, rkeys_[target].get(), &param),
                           "ucp_put_nbx", fmt::format("to rank {}", target)));
    unflushed_[target] = true;
  }

  void flush(const std::string& what) override {
    ucp_request_param_t param{};
    ucx::Request request(
        ucx::check_request(ucp_worker_flush_nbx(core_->worker(), &param), "ucp_worker_flush_nbx"));
    core_->progress_until(
        [&] { return request.done(); }, core_->deadline(),
        [&] {
          std::vector<int> targets;
          for (int r = 0; r < core_->size(); ++r)
            if (unflushed_[r]) targets.push_back(r);
          MOED_THROW(
              Runtime,
              "rank {}: {}: deadline of {} ms expired; puts to ranks [{}] not confirmed (over "
              "tcp a target completes puts only while it progresses UCX) ([comm].timeout_ms)",
              core_->rank(), what, core_->timeout().count(), fmt::join(targets, ", "));
        });
    if (ucs_status_t s = request.status(); s != UCS_OK) {
      core_->mark_failed();
      ucx::throw_ucs("ucp_worker_flush_nbx", s, fmt::format("rank {}: {}", core_->rank(), what));
    }
    unflushed_.assign(core_->size(), false);
  }

 private:
  std::shared_ptr<UcxCore> core_;  // outlives the keys and the memory
  ucx::MappedMemory memory_;
  std::size_t bytes_;
  std::vector<std::uint64_t> remote_base_, remote_bytes_;
  std::vector<ucx::Rkey> rkeys_;  // released before the memory and the endpoints
  std::vector<bool> unflushed_;   // targets put to since the last flush
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(const CommConfig& config, Bootstrap& bootstrap)
      : core_(std::make_shared<UcxCore>(bootstrap, std::chrono::milliseconds(config.timeout_ms))) {}
  ~UcxTransport() override {
    if (std::uncaught_exceptions() > 0) core_->mark_failed();
  }

  const char* name() const override { return "ucx"; }
  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  void progress() override { core_->progress(); }

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
};

}  // namespace

std::unique_ptr<Transport> create_ucx_transport(const CommConfig& config, Bootstrap& bootstrap) {
  return std::make_unique<UcxTransport>(config, bootstrap);
}

std::optional<std::string> ucx_unavailable(const Bootstrap&) {
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
