#include "comm/mpi/mpi_transport.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <vector>

#include <fmt/ranges.h>

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

class MpiTransport final : public Transport {
 public:
  MpiTransport(const CommConfig& config, MPI_Comm comm)
      : timeout_(std::chrono::milliseconds(config.timeout_ms)) {
    check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiTransport() override { MPI_Comm_free(&comm_); }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void exchange_sizes(const std::uint64_t* send, std::uint64_t* recv,
                      const std::string& what) override {
    ExchangeLayout layout;
    layout.send_bytes.assign(size_, sizeof(std::uint64_t));
    layout.recv_bytes = layout.send_bytes;
    layout.send_offsets = layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
    exchange(reinterpret_cast<const std::byte*>(send), layout, reinterpret_cast<std::byte*>(recv),
             what);
  }

  void exchange(const std::byte* send, const ExchangeLayout& layout, std::byte* recv,
                const std::string& what) override {
    MOED_CHECK(int(layout.send_bytes.size()) == size_ && int(layout.recv_bytes.size()) == size_,
               "{}: layout for {} ranks", what, layout.send_bytes.size());
    std::vector<MPI_Request> requests;
    std::vector<int> peer_of_request;  // recv requests carry the source, sends -(dest+1)
    requests.reserve(2 * size_);
    for (int src = 0; src < size_; ++src) {
      if (src == rank_) continue;
      requests.emplace_back();
      peer_of_request.push_back(src);
      check_mpi(MPI_Irecv(recv + layout.recv_offsets[src], count(layout.recv_bytes[src], what),
                          MPI_BYTE, src, kTag, comm_, &requests.back()),
                "MPI_Irecv");
    }
    for (int dst = 0; dst < size_; ++dst) {
      if (dst == rank_) continue;
      requests.emplace_back();
      peer_of_request.push_back(-(dst + 1));
      check_mpi(MPI_Isend(send + layout.send_offsets[dst], count(layout.send_bytes[dst], what),
                          MPI_BYTE, dst, kTag, comm_, &requests.back()),
                "MPI_Isend");
    }
    MOED_CHECK(layout.send_bytes[rank_] == layout.recv_bytes[rank_], "{}: self block {} vs {}", what,
               layout.send_bytes[rank_], layout.recv_bytes[rank_]);
    if (layout.send_bytes[rank_])
      std::memcpy(recv + layout.recv_offsets[rank_], send + layout.send_offsets[rank_],
                  layout.send_bytes[rank_]);
    wait_all(requests, peer_of_request, what);
  }

  std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) override {
    return std::make_unique<MpiWindow>(comm_, bytes, timeout_);
  }

  void all_gather(const void* send, std::size_t bytes, void* recv,
                  const std::string& what) override {
    ExchangeLayout layout;
    layout.send_bytes.assign(size_, bytes);
    layout.recv_bytes = layout.send_bytes;
    layout.send_offsets.assign(size_, 0);  // the same block goes to everyone
    layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
    exchange(static_cast<const std::byte*>(send), layout, static_cast<std::byte*>(recv), what);
  }

 private:
  static constexpr int kTag = 7001;

  static int count(std::size_t bytes, const std::string& what) {
    if (bytes > std::size_t(INT_MAX))
      MOED_THROW(Runtime, "{}: a {}-byte message exceeds MPI's int count; use fewer tokens per step",
                 what, bytes);
    return int(bytes);
  }

  void wait_all(std::vector<MPI_Request>& requests, const std::vector<int>& peer_of_request,
                const std::string& what) {
    wait_all_until(requests, Clock::now() + timeout_, {}, [&](const std::vector<std::size_t>& pending) {
      std::vector<int> waiting_from, waiting_to;
      for (std::size_t i : pending) {
        int p = peer_of_request[i];
        if (p >= 0)
          waiting_from.push_back(p);
        else
          waiting_to.push_back(-p - 1);
      }
      std::string sends =
          waiting_to.empty() ? "" : fmt::format(", and for sends to ranks [{}]", fmt::join(waiting_to, ", "));
      MOED_THROW(Runtime,
                 "rank {}: {}: deadline of {} ms expired; still waiting for data from ranks [{}]{} "
                 "([comm].timeout_ms)",
                 rank_, what, timeout_.count(), fmt::join(waiting_from, ", "), sends);
    });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<Transport> create_mpi_transport(const CommConfig& config, MPI_Comm comm) {
  return std::make_unique<MpiTransport>(config, comm);
}

}  // namespace moed::comm
