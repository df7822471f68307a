#include "comm/nccl/nccl_transport.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/idle_backoff.h"
#include "common/error.h"

namespace moed::comm {

namespace {

using Clock = std::chrono::steady_clock;

class NcclTransport;

// One exchange: collects its sends, then launches on its lane (when its turn
// comes) the sizes group (at_most only) and the data group, and lands every
// remote block once the data group is complete.
class NcclExchange final : public Exchange {
 public:
  enum class Stage { collecting, sizes, data, done };

  NcclExchange(NcclTransport& transport, int lane, std::byte* recv, const std::vector<std::size_t>& capacity,
               const std::vector<std::size_t>& offsets, const std::string& what, ReceiveSizes sizes);
  ~NcclExchange() override;

  void send(int dest, const std::byte* data, std::size_t bytes) override;
  int next_arrival(bool block) override;
  void finish() override;
  std::size_t received_bytes(int source) const override { return landed_bytes_.at(std::size_t(source)); }

  // Launches what it may and takes in what completed; true when anything did.
  bool advance();
  int lane() const { return lane_; }
  const std::string& what() const { return what_; }
  // Where it stands, for a diagnostic.
  std::string state() const;

 private:
  void send_to_self(const std::byte* data, std::size_t bytes);
  // The other ranks send() has not been called for yet.
  std::vector<int> unsent() const;
  void land(int source, std::size_t bytes);
  void launch_sizes();
  void take_sizes();
  void launch_data();
  template <class Done>
  void wait_until(Done&& done);
  [[noreturn]] void throw_deadline() const;

  NcclTransport& t_;
  const int lane_, rank_, size_;
  const Clock::time_point deadline_;
  const std::string what_;
  std::byte* const recv_;
  const std::vector<std::size_t> capacity_, offsets_;
  const bool exact_;
  Stage stage_ = Stage::collecting;
  std::uint64_t ticket_ = 0;  // the group in flight (0: none was needed)
  std::vector<P2pBlock> out_;  // by destination: what send() was given
  std::vector<char> sent_, landed_;
  int sent_to_others_ = 0, landed_count_ = 0, reported_ = 0;
  std::vector<std::size_t> landed_bytes_;
  std::vector<std::uint64_t> sizes_out_, sizes_in_;  // at_most: each block's length, by rank
  std::deque<int> arrivals_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(int rank, int size, std::chrono::milliseconds timeout, std::unique_ptr<NcclGroups> groups,
                std::unique_ptr<Transport> windows)
      : rank_(rank), size_(size), timeout_(timeout), groups_(std::move(groups)), windows_(std::move(windows)),
        queues_(std::size_t(groups_->lanes())) {
    MOED_CHECK(groups_->lanes() > 0, "the NCCL transport needs at least one lane");
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  NcclGroups& groups() { return *groups_; }

  std::unique_ptr<Exchange> open_exchange(std::byte* recv, const std::vector<std::size_t>& recv_bytes,
                                          const std::vector<std::size_t>& recv_offsets, const std::string& what,
                                          ReceiveSizes sizes) override {
    check_usable(what);
    const int lane = int(opened_++ % std::uint64_t(groups_->lanes()));
    auto x = std::make_unique<NcclExchange>(*this, lane, recv, recv_bytes, recv_offsets, what, sizes);
    live_.push_back(x.get());
    queues_[std::size_t(lane)].push_back(x.get());
    return x;
  }

  std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) override {
    if (!windows_)
      MOED_THROW(Usage, "{}: the nccl transport has no host transport for one-sided windows here (NCCL has no "
                 "one-sided writes; live migration needs ucx or mpi beside it)", what);
    return windows_->create_window(bytes, what);
  }

  // Launches and lands what it can: a rank whose passes are done keeps its
  // exchanges moving (an at_most exchange launches its data group once its
  // sizes have come) until it finishes them.
  void progress() override {
    advance_all();
    if (windows_) windows_->progress();
  }

  // The exchange whose groups launch next on `lane`.
  bool my_turn(const NcclExchange* x) const { return queues_[std::size_t(x->lane())].front() == x; }
  void launched_all(NcclExchange* x) {
    auto& queue = queues_[std::size_t(x->lane())];
    MOED_CHECK(queue.front() == x, "NCCL lane {}: '{}' launched out of turn", x->lane(), x->what());
    queue.pop_front();
  }

  // Every live exchange moves on, in the order they were opened (so that one
  // that hands its lane on lets the next launch in the same pass).
  bool advance_all() {
    check_usable("an exchange");
    bool moved = false;
    for (std::size_t i = 0; i < live_.size(); ++i) moved = live_[i]->advance() || moved;
    return moved;
  }

  // An exchange goes; one that had not completed leaves its lane's order
  // broken and may have groups in flight writing into its blocks: every
  // lane stops, and the transport with them (the job is ending).
  void closed(NcclExchange* x, bool complete) noexcept {
    live_.erase(std::find(live_.begin(), live_.end(), x));
    auto& queue = queues_[std::size_t(x->lane())];
    if (const auto it = std::find(queue.begin(), queue.end(), x); it != queue.end()) queue.erase(it);
    if (complete || !stopped_.empty()) return;
    groups_->abort();
    try {
      stopped_ = "'" + x->what() + "' was left unfinished";
    } catch (...) {
      stopped_ = "an exchange was left unfinished";
    }
  }

  void check_usable(const std::string& what) const {
    if (!stopped_.empty())
      MOED_THROW(Runtime, "{}: the nccl transport stopped every lane after {}, and takes no more exchanges", what,
                 stopped_);
  }

  // Every lane: its groups, and the exchanges waiting to launch there.
  std::string lanes_state() const {
    std::string out;
    for (int lane = 0; lane < groups_->lanes(); ++lane) {
      out += fmt::format("\n  lane {}: {}", lane, groups_->describe(lane));
      for (const NcclExchange* x : queues_[std::size_t(lane)]) out += fmt::format("; '{}' {}", x->what(), x->state());
    }
    return out;
  }

 private:
  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<NcclGroups> groups_;
  std::unique_ptr<Transport> windows_;
  std::uint64_t opened_ = 0;
  std::vector<NcclExchange*> live_;                   // in the order opened
  std::vector<std::deque<NcclExchange*>> queues_;     // by lane: not yet launched in full
  std::string stopped_;                               // why every lane stopped ("" while usable)
};

NcclExchange::NcclExchange(NcclTransport& transport, int lane, std::byte* recv,
                           const std::vector<std::size_t>& capacity, const std::vector<std::size_t>& offsets,
                           const std::string& what, ReceiveSizes sizes)
    : t_(transport), lane_(lane), rank_(transport.rank()), size_(transport.size()),
      deadline_(Clock::now() + transport.timeout()), what_(what), recv_(recv), capacity_(capacity),
      offsets_(offsets), exact_(sizes == ReceiveSizes::exact) {
  MOED_CHECK(int(capacity_.size()) == size_ && int(offsets_.size()) == size_,
             "{}: receive layout for {} ranks, {} in the job", what_, capacity_.size(), size_);
  const auto n = std::size_t(size_);
  out_.resize(n);
  sent_.assign(n, 0);
  landed_.assign(n, 0);
  landed_bytes_.assign(n, 0);
  sizes_out_.assign(n, 0);
  sizes_in_.assign(n, 0);
  for (int src = 0; src < size_; ++src)
    if (capacity_[src] == 0) land(src, 0);  // both sides know it is empty
}

NcclExchange::~NcclExchange() { t_.closed(this, stage_ == Stage::done); }

void NcclExchange::send(int dest, const std::byte* data, std::size_t bytes) {
  MOED_CHECK(dest >= 0 && dest < size_, "{}: send to rank {} of {}", what_, dest, size_);
  MOED_CHECK(!sent_[dest], "{}: a second send to rank {}", what_, dest);
  t_.check_usable(what_);
  sent_[dest] = 1;
  if (dest == rank_) return send_to_self(data, bytes);
  // The group only reads it, at launch; the caller keeps it until finish().
  out_[dest] = {dest, const_cast<std::byte*>(data), bytes};
  sizes_out_[dest] = bytes;
  if (++sent_to_others_ == size_ - 1) t_.advance_all();  // launch as soon as it may
}

void NcclExchange::send_to_self(const std::byte* data, std::size_t bytes) {
  const std::size_t cap = capacity_[rank_];
  MOED_CHECK(bytes == cap || (!exact_ && bytes > 0 && bytes < cap), "{}: {} bytes sent to self, {} expected", what_,
             bytes, cap);
  if (bytes == 0) return;  // landed at open
  std::memcpy(recv_ + offsets_[rank_], data, bytes);
  land(rank_, bytes);
}

void NcclExchange::land(int source, std::size_t bytes) {
  landed_[source] = 1;
  landed_bytes_[source] = bytes;
  ++landed_count_;
  arrivals_.push_back(source);
}

bool NcclExchange::advance() {
  switch (stage_) {
    case Stage::collecting:
      if (sent_to_others_ < size_ - 1 || !t_.my_turn(this)) return false;
      if (exact_)
        launch_data();
      else
        launch_sizes();
      return true;
    case Stage::sizes:
      if (ticket_ && !t_.groups().complete(lane_, ticket_)) return false;
      take_sizes();
      launch_data();
      return true;
    case Stage::data:
      if (ticket_ && !t_.groups().complete(lane_, ticket_)) return false;
      for (int src = 0; src < size_; ++src)
        if (!landed_[src] && src != rank_) land(src, exact_ ? capacity_[src] : sizes_in_[src]);
      stage_ = Stage::done;
      return true;
    case Stage::done:
      return false;
  }
  return false;
}

// A size for every block that is a message: a sender's block of 1 byte or
// more is one its receiver gave a capacity, and a capacity of 0 is no
// message on either side.
void NcclExchange::launch_sizes() {
  std::vector<P2pBlock> sends, receives;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (sizes_out_[r]) sends.push_back({r, reinterpret_cast<std::byte*>(&sizes_out_[r]), sizeof(std::uint64_t)});
    if (capacity_[r]) receives.push_back({r, reinterpret_cast<std::byte*>(&sizes_in_[r]), sizeof(std::uint64_t)});
  }
  ticket_ = sends.empty() && receives.empty() ? 0 : t_.groups().launch(lane_, sends, receives);
  stage_ = Stage::sizes;
}

void NcclExchange::take_sizes() {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && capacity_[r] && (sizes_in_[r] == 0 || sizes_in_[r] > capacity_[r]))
      MOED_THROW(Runtime, "rank {}: {}: rank {} announced a {}-byte block where 1 to {} fit (the ranks disagree "
                 "on the plan)", rank_, what_, r, sizes_in_[r], capacity_[r]);
}

void NcclExchange::launch_data() {
  std::vector<P2pBlock> sends, receives;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (out_[r].bytes) sends.push_back(out_[r]);
    if (!landed_[r] && capacity_[r])
      receives.push_back({r, recv_ + offsets_[r], exact_ ? capacity_[r] : std::size_t(sizes_in_[r])});
  }
  ticket_ = sends.empty() && receives.empty() ? 0 : t_.groups().launch(lane_, sends, receives);
  stage_ = Stage::data;
  t_.launched_all(this);
}

template <class Done>
void NcclExchange::wait_until(Done&& done) {
  IdleBackoff backoff;
  while (!done()) {
    t_.progress();
    if (t_.advance_all()) {
      backoff.reset();
      continue;
    }
    if (Clock::now() > deadline_) throw_deadline();
    backoff.idle();
  }
}

int NcclExchange::next_arrival(bool block) {
  if (reported_ == size_) return kAllArrived;
  t_.advance_all();
  if (block)
    wait_until([&] { return !arrivals_.empty(); });
  else if (arrivals_.empty() && Clock::now() > deadline_)
    throw_deadline();
  if (arrivals_.empty()) return kNoneYet;
  const int source = arrivals_.front();
  arrivals_.pop_front();
  ++reported_;
  return source;
}

std::vector<int> NcclExchange::unsent() const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !sent_[r]) ranks.push_back(r);
  return ranks;
}

void NcclExchange::finish() {
  const std::vector<int> missing = unsent();
  MOED_CHECK(missing.empty(), "{}: finish() with no send() to ranks [{}]: an NCCL exchange launches once it has a "
             "send to every other rank, 0 bytes included", what_, fmt::join(missing, ", "));
  MOED_CHECK(sent_[rank_] || capacity_[rank_] == 0, "{}: finish before the block to self was sent", what_);
  wait_until([&] { return stage_ == Stage::done; });
}

std::string NcclExchange::state() const {
  switch (stage_) {
    case Stage::collecting: {
      if (const std::vector<int> missing = unsent(); !missing.empty())
        return fmt::format("waiting for send() to ranks [{}]", fmt::join(missing, ", "));
      return t_.my_turn(this) ? "ready to launch" : "every send made, waiting for earlier exchanges of its lane";
    }
    case Stage::sizes:
      return fmt::format("sizes group {} launched, not complete", ticket_);
    case Stage::data:
      return fmt::format("data group {} launched, not complete", ticket_);
    case Stage::done:
      return "complete";
  }
  return "?";
}

void NcclExchange::throw_deadline() const {
  std::vector<int> waiting;
  for (int r = 0; r < size_; ++r)
    if (!landed_[r]) waiting.push_back(r);
  MOED_THROW(Runtime, "rank {}: {}: deadline of {} ms expired on NCCL lane {} ({}); still waiting for data from "
             "ranks [{}] ([comm].timeout_ms). Every lane:{}", rank_, what_, t_.timeout().count(), lane_, state(),
             fmt::join(waiting, ", "), t_.lanes_state());
}

}  // namespace

std::unique_ptr<Transport> create_nccl_transport_over(int rank, int size, std::chrono::milliseconds timeout,
                                                      std::unique_ptr<NcclGroups> groups,
                                                      std::unique_ptr<Transport> windows) {
  return std::make_unique<NcclTransport>(rank, size, timeout, std::move(groups), std::move(windows));
}

#ifndef MOED_NCCL_TRANSPORT
bool nccl_transport_built() { return false; }

std::unique_ptr<Transport> create_nccl_transport(const CommConfig&, Bootstrap&) {
  MOED_THROW(Usage, "[comm].backend = \"nccl\": this moed was built without nvcc, so without the NCCL transport's "
             "CUDA side");
}
#endif

}  // namespace moed::comm
