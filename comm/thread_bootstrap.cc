#include "comm/thread_bootstrap.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "comm/idle_backoff.h"
#include "common/error.h"

namespace moed::comm {

ThreadRendezvous::ThreadRendezvous(int ranks, std::chrono::milliseconds timeout)
    : ranks_(ranks), timeout_(timeout), next_round_(std::size_t(ranks), 0) {
  MOED_CHECK(ranks > 0, "a rendezvous of {} ranks", ranks);
}

std::vector<std::vector<std::byte>> ThreadRendezvous::gather(int rank, std::span<const std::byte> mine,
                                                             const std::string& what,
                                                             const Bootstrap::Progress& progress) {
  MOED_CHECK(rank >= 0 && rank < ranks_, "rank {} of a {}-rank rendezvous", rank, ranks_);
  std::uint64_t number = 0;
  {
    std::lock_guard lock(mutex_);
    number = next_round_[std::size_t(rank)]++;
    Round& round = rounds_[number];
    if (round.arrived == 0) {
      round.what = what;
      round.first = rank;
      round.parts.resize(std::size_t(ranks_));
    } else if (round.what != what && round.mismatch.empty()) {
      round.mismatch = fmt::format("rank {} is in \"{}\" while rank {} is in \"{}\" (collective {})", rank, what,
                                   round.first, round.what, number);
    }
    round.parts[std::size_t(rank)].assign(mine.begin(), mine.end());
    ++round.arrived;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  IdleBackoff backoff;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      Round& round = rounds_.at(number);
      if (!round.mismatch.empty()) MOED_THROW(Internal, "{}", round.mismatch);  // on every rank that came
      if (round.arrived == ranks_) {
        std::vector<std::vector<std::byte>> parts = round.parts;
        if (++round.taken == ranks_) rounds_.erase(number);
        return parts;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::vector<int> missing;
        for (int r = 0; r < ranks_; ++r)
          if (next_round_[std::size_t(r)] <= number) missing.push_back(r);
        MOED_THROW(Runtime,
                   "rank {}: {}: deadline of {} ms expired in a collective over all {} ranks; ranks [{}] have not "
                   "come",
                   rank, what, timeout_.count(), ranks_, fmt::join(missing, ", "));
      }
    }
    if (progress) progress();
    backoff.idle();
  }
}

std::vector<std::vector<std::byte>> ThreadBootstrap::all_gather(std::span<const std::byte> mine,
                                                                const std::string& what) {
  return rendezvous_.gather(rank_, mine, what, {});
}

void ThreadBootstrap::all_reduce(std::span<std::int64_t> values, Reduction reduction, const std::string& what) {
  const auto parts = rendezvous_.gather(rank_, std::as_bytes(values), what, {});
  std::vector<std::int64_t> theirs(values.size());
  for (std::size_t r = 0; r < parts.size(); ++r) {
    MOED_CHECK(parts[r].size() == values.size_bytes(), "{}: rank {} reduces {} bytes, rank {} {}", what, r,
               parts[r].size(), rank_, values.size_bytes());
    if (int(r) == rank_) continue;
    std::memcpy(theirs.data(), parts[r].data(), values.size_bytes());
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = reduction == Reduction::max ? std::max(values[i], theirs[i]) : values[i] + theirs[i];
  }
}

void ThreadBootstrap::barrier(const std::string& what, const Progress& progress) {
  rendezvous_.gather(rank_, {}, what, progress);
}

}  // namespace moed::comm
