#include "comm/mpi/mpi_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <vector>

#include <fmt/ranges.h>

#include "comm/idle_backoff.h"
#include "comm/mpi/mpi_bootstrap.h"
#include "comm/mpi/mpi_session.h"
#include "comm/mpi/mpi_wait.h"
#include "common/error.h"

namespace moed::comm {

namespace {

using Clock = std::chrono::steady_clock;

// An MPI-3 window under a passive lock_all epoch for its whole life: puts are
// MPI_Rput (local completion watched with the deadline), flush is
// MPI_Win_flush_all (remote completion).
class MpiWindow final : public RmaWindow {
 public:
  MpiWindow(MPI_Comm comm, std::size_t bytes, std::chrono::milliseconds timeout)
      : bytes_(bytes), timeout_(timeout) {
    check_mpi(MPI_Win_allocate(MPI_Aint(bytes), 1, MPI_INFO_NULL, comm, &base_, &win_),
              "MPI_Win_allocate");
    check_mpi(MPI_Win_lock_all(0, win_), "MPI_Win_lock_all");
  }
  ~MpiWindow() override {
    MPI_Win_unlock_all(win_);
    // MPI_Win_free is collective: while an error unwinds this rank, its peers
    // may never come, and the job is about to end anyway (the window leaks).
    if (std::uncaught_exceptions() == 0) MPI_Win_free(&win_);
  }
  std::byte* local() override { return static_cast<std::byte*>(base_); }
  std::size_t bytes() const override { return bytes_; }
  void put(int target, std::size_t offset, const void* src, std::size_t bytes) override {
    constexpr std::size_t kMax = std::size_t(1) << 30;  // MPI counts are int
    for (std::size_t done = 0; done < bytes; done += kMax) {
      const std::size_t n = std::min(kMax, bytes - done);
      requests_.emplace_back();
      check_mpi(MPI_Rput(static_cast<const std::byte*>(src) + done, int(n), MPI_BYTE, target,
                         MPI_Aint(offset + done), int(n), MPI_BYTE, win_, &requests_.back()),
                "MPI_Rput");
    }
  }
  void flush(const std::string& what) override {
    wait_all_until(requests_, Clock::now() + timeout_, {}, [&](const std::vector<std::size_t>& pending) {
      MOED_THROW(Runtime, "{}: {} of {} one-sided writes not complete after {} ms ([comm].timeout_ms)",
                 what, pending.size(), requests_.size(), timeout_.count());
    });
    requests_.clear();
    check_mpi(MPI_Win_flush_all(win_), "MPI_Win_flush_all");
  }

 private:
  void* base_ = nullptr;
  MPI_Win win_ = MPI_WIN_NULL;
  std::size_t bytes_;
  std::chrono::milliseconds timeout_;
  std::vector<MPI_Request> requests_;
};

// The MPI message count of a `bytes`-byte block.
int message_count(std::size_t bytes, const std::string& what) {
  if (bytes > std::size_t(INT_MAX))
    MOED_THROW(Runtime, "{}: a {}-byte message exceeds MPI's int count; use fewer tokens per step",
               what, bytes);
  return int(bytes);
}

// One all-to-all-v over point-to-point messages. The receives are posted at
// open; a source is reported once its receive has completed (and its length
// checked). Lives no longer than its transport's communicator.
class MpiExchange final : public Exchange {
 public:
  MpiExchange(MPI_Comm comm, int tag, std::chrono::milliseconds timeout, std::byte* recv,
              const std::vector<std::size_t>& recv_bytes, const std::vector<std::size_t>& recv_offsets,
              const std::string& what, ReceiveSizes sizes)
      : comm_(comm), tag_(tag), timeout_(timeout), deadline_(Clock::now() + timeout), what_(what),
        recv_(recv), recv_bytes_(recv_bytes), recv_offsets_(recv_offsets), landed_bytes_(recv_bytes),
        sizes_(sizes) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MOED_CHECK(int(recv_bytes_.size()) == size_ && int(recv_offsets_.size()) == size_,
               "{}: receive layout for {} ranks, {} in the job", what_, recv_bytes_.size(), size_);
    receives_.assign(size_, MPI_REQUEST_NULL);  // indexed by source
    landed_.assign(size_, false);
    sent_.assign(size_, false);
    indices_.resize(size_);
    statuses_.resize(size_);
    try {
      post_receives();
    } catch (...) {
      release_pending();
      throw;
    }
  }

  ~MpiExchange() override {
    if (!finished_) release_pending();
  }

  void send(int dest, const std::byte* data, std::size_t bytes) override {
    MOED_CHECK(dest >= 0 && dest < size_, "{}: send to rank {} of {}", what_, dest, size_);
    MOED_CHECK(!sent_[dest], "{}: a second send to rank {}", what_, dest);
    sent_[dest] = true;
    if (dest == rank_) return send_to_self(data, bytes);
    if (bytes == 0) return;
    sends_.emplace_back();
    send_dests_.push_back(dest);
    check_mpi(MPI_Isend(data, message_count(bytes, what_), MPI_BYTE, dest, tag_, comm_, &sends_.back()),
              "MPI_Isend");
  }

  int next_arrival(bool block) override {
    if (reported_ == size_) return kAllArrived;
    if (block) {
      wait_until([&] { return !arrivals_.empty(); });
    } else {
      poll();
      if (arrivals_.empty() && Clock::now() > deadline_) throw_deadline();
    }
    if (arrivals_.empty()) return kNoneYet;
    const int src = arrivals_.front();
    arrivals_.pop_front();
    ++reported_;
    return src;
  }

  std::size_t received_bytes(int source) const override { return landed_bytes_.at(std::size_t(source)); }

  void finish() override {
    MOED_CHECK(sent_[rank_] || recv_bytes_[rank_] == 0, "{}: finish before the block to self was sent",
               what_);
    wait_until([&] { return landed_count_ == size_ && sends_pending() == 0; });
    finished_ = true;
  }

 private:
  void post_receives() {
    for (int src = 0; src < size_; ++src) {
      if (recv_bytes_[src] == 0) {
        land(src);  // nothing to wait for: both sides know the block is empty
      } else if (src != rank_) {
        check_mpi(MPI_Irecv(recv_ + recv_offsets_[src], message_count(recv_bytes_[src], what_),
                            MPI_BYTE, src, tag_, comm_, &receives_[src]),
                  "MPI_Irecv");
      }
    }
  }

  // After an error (or a caller that gave up): stops MPI writing into the
  // receive blocks, which the caller may reuse. A receive not yet matched
  // cancels at once; one already matched completes only as its data comes,
  // which a stalled sender may never deliver, so the wait is bounded (the
  // job is ending: better a late write than a rank that never aborts). Send
  // requests are released and go on unwatched. Errors are ignored: this
  // runs in the destructor.
  void release_pending() noexcept {
    for (MPI_Request& r : receives_)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    const auto until = Clock::now() + kCancelGrace;
    IdleBackoff backoff;
    for (int done = 0; !done && Clock::now() < until; backoff.idle())
      if (MPI_Testall(size_, receives_.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
    for (MPI_Request& r : receives_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    for (MPI_Request& r : sends_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

  void send_to_self(const std::byte* data, std::size_t bytes) {
    landed_bytes_[rank_] = bytes;
    MOED_CHECK(bytes == recv_bytes_[rank_] || (sizes_ == ReceiveSizes::at_most && bytes > 0 && bytes < recv_bytes_[rank_]),
               "{}: {} bytes sent to self, {} expected", what_, bytes,
               recv_bytes_[rank_]);
    if (bytes == 0) return;  // reported at open
    std::memcpy(recv_ + recv_offsets_[rank_], data, bytes);
    land(rank_);
  }

  void land(int src) {
    landed_[src] = true;
    ++landed_count_;
    arrivals_.push_back(src);
  }

  // Takes in the receives and sends that completed; true when any did.
  bool poll() {
    const bool received = poll_receives();
    const bool sent = poll_sends();
    return received || sent;
  }

  bool poll_receives() {
    int count = 0;
    const int rc = MPI_Testsome(size_, receives_.data(), &count, indices_.data(), statuses_.data());
    if (rc != MPI_ERR_IN_STATUS) check_mpi(rc, "MPI_Testsome");
    if (count == MPI_UNDEFINED) return false;  // no receive left active
    for (int i = 0; i < count; ++i) check_received(indices_[i], statuses_[i], rc == MPI_ERR_IN_STATUS);
    return count > 0;
  }

  // A completed receive from `src` holds exactly the bytes the layout expects.
  void check_received(int src, const MPI_Status& status, bool error_in_status) {
    if (error_in_status && status.MPI_ERROR == MPI_ERR_TRUNCATE)
      MOED_THROW(Runtime, "rank {}: {}: rank {} sent more than the {} bytes expected", rank_, what_, src,
                 recv_bytes_[src]);
    if (error_in_status) check_mpi(status.MPI_ERROR, "MPI_Irecv");
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    landed_bytes_[src] = std::size_t(received);
    if (sizes_ == ReceiveSizes::at_most && received > 0) return land(src);  // longer ones truncate
    if (std::size_t(received) != recv_bytes_[src])
      MOED_THROW(Runtime,
                 "rank {}: {}: rank {} sent {} bytes, {} expected (the ranks disagree on the "
                 "exchange layout)",
                 rank_, what_, src, received, recv_bytes_[src]);
    land(src);
  }

  bool poll_sends() {
    if (sends_.empty()) return false;
    int count = 0;
    indices_.resize(std::max(indices_.size(), sends_.size()));
    check_mpi(MPI_Testsome(int(sends_.size()), sends_.data(), &count, indices_.data(), MPI_STATUSES_IGNORE),
              "MPI_Testsome");
    return count != MPI_UNDEFINED && count > 0;
  }

  // Completed requests are MPI_REQUEST_NULL (MPI_Testsome frees them).
  std::size_t sends_pending() const {
    return std::size_t(std::count_if(sends_.begin(), sends_.end(),
                                     [](MPI_Request r) { return r != MPI_REQUEST_NULL; }));
  }

  // Polls until done() holds, yielding the core while idle; past the
  // deadline, throws what is still awaited.
  template <class Done>
  void wait_until(Done&& done) {
    IdleBackoff backoff;
    for (;;) {
      const bool moved = poll();
      if (done()) return;
      if (Clock::now() > deadline_) throw_deadline();
      if (moved)
        backoff.reset();
      else
        backoff.idle();
    }
  }

  [[noreturn]] void throw_deadline() const {
    std::vector<int> waiting_from, waiting_to;
    for (int src = 0; src < size_; ++src)
      if (!landed_[src]) waiting_from.push_back(src);
    for (std::size_t i = 0; i < sends_.size(); ++i)
      if (sends_[i] != MPI_REQUEST_NULL) waiting_to.push_back(send_dests_[i]);
    std::string sends =
        waiting_to.empty() ? "" : fmt::format(", and for sends to ranks [{}]", fmt::join(waiting_to, ", "));
    MOED_THROW(Runtime,
               "rank {}: {}: deadline of {} ms expired; still waiting for data from ranks [{}]{} "
               "([comm].timeout_ms)",
               rank_, what_, timeout_.count(), fmt::join(waiting_from, ", "), sends);
  }

  MPI_Comm comm_;
  int tag_;
  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;
  std::string what_;
  int rank_ = 0, size_ = 1;
  std::byte* recv_;
  std::vector<std::size_t> recv_bytes_, recv_offsets_;
  std::vector<std::size_t> landed_bytes_;  // by source: what arrived (the capacity until then)
  ReceiveSizes sizes_;
  std::vector<MPI_Request> receives_;  // by source; MPI_REQUEST_NULL once complete or never posted
  std::vector<bool> landed_, sent_;    // by source, by destination
  int landed_count_ = 0, reported_ = 0;
  std::deque<int> arrivals_;           // landed, not yet reported
  std::vector<MPI_Request> sends_;
  std::vector<int> send_dests_;        // the destination of sends_[i]
  std::vector<int> indices_;           // MPI_Testsome's output, kept between polls
  std::vector<MPI_Status> statuses_;
  bool finished_ = false;
};

class MpiTransport final : public Transport {
 public:
  MpiTransport(const CommConfig& config, MPI_Comm comm)
      : timeout_(std::chrono::milliseconds(config.timeout_ms)) {
    check_tag_range(comm);
    check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiTransport() override { MPI_Comm_free(&comm_); }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Exchange> open_exchange(std::byte* recv, const std::vector<std::size_t>& recv_bytes,
                                          const std::vector<std::size_t>& recv_offsets,
                                          const std::string& what, ReceiveSizes sizes) override {
    // Every rank opens its exchanges in the same order, so the sequence
    // number names the same exchange everywhere; its tag keeps the blocks of
    // exchanges open at once apart, whatever order they are sent in.
    const int tag = kTagBase + int(next_sequence_++ % kTagCycle);
    return std::make_unique<MpiExchange>(comm_, tag, timeout_, recv, recv_bytes, recv_offsets, what, sizes);
  }

  std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) override {
    return std::make_unique<MpiWindow>(comm_, bytes, timeout_);
  }

 private:
  // Tags cycle through [kTagBase, kTagBase + kTagCycle): exchanges
  // kTagCycle apart share a tag, far more than are ever open at once. MPI
  // guarantees tags up to 32767.
  static constexpr int kTagBase = 7001;
  static constexpr std::uint64_t kTagCycle = 16384;

  static void check_tag_range(MPI_Comm comm) {
    int* tag_ub = nullptr;
    int flag = 0;
    check_mpi(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr(MPI_TAG_UB)");
    MOED_CHECK(flag && *tag_ub >= kTagBase + int(kTagCycle) - 1, "MPI_TAG_UB {} below the exchange tags",
               flag ? *tag_ub : -1);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::uint64_t next_sequence_ = 0;
};

}  // namespace

std::unique_ptr<Transport> create_mpi_transport(const CommConfig& config, Bootstrap& bootstrap) {
  return std::make_unique<MpiTransport>(config, mpi_communicator(bootstrap, "mpi"));
}

std::optional<std::string> mpi_unavailable(const CommConfig&, const Bootstrap& bootstrap) {
  if (dynamic_cast<const MpiBootstrap*>(&bootstrap)) return std::nullopt;
  return std::string("it runs only over the job's MPI (this bootstrap is not)");
}

}  // namespace moed::comm
