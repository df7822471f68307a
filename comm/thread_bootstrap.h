// A Bootstrap over the threads of one process, for tests: each thread plays
// one rank and holds its own ThreadBootstrap, all over one ThreadRendezvous.
// A collective completes once every rank's thread has made it; the ranks
// must make the same collectives in the same order (the labels must match,
// or the collective throws an Internal error naming both on every rank that
// came). A waiting thread polls, calling its progress, so that a worker it
// owns keeps moving.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "comm/bootstrap.h"

namespace moed::comm {

class ThreadRendezvous {
 public:
  ThreadRendezvous(int ranks, std::chrono::milliseconds timeout);
  int size() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Rank `rank`'s part of its next collective; every rank's part, in rank
  // order, once all have come (under the deadline).
  std::vector<std::vector<std::byte>> gather(int rank, std::span<const std::byte> mine, const std::string& what,
                                             const Bootstrap::Progress& progress);

 private:
  struct Round {
    std::string what;      // the label of the first rank that came
    int first = -1;        // that rank
    std::string mismatch;  // set when a rank came with another label
    std::vector<std::vector<std::byte>> parts;  // by rank
    int arrived = 0, taken = 0;
  };

  const int ranks_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::vector<std::uint64_t> next_round_;  // by rank
  std::map<std::uint64_t, Round> rounds_;  // begun and not yet taken by every rank
};

class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(ThreadRendezvous& rendezvous, int rank) : rendezvous_(rendezvous), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return rendezvous_.size(); }
  std::chrono::milliseconds timeout() const override { return rendezvous_.timeout(); }
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine, const std::string& what) override;
  void all_reduce(std::span<std::int64_t> values, Reduction reduction, const std::string& what) override;
  void barrier(const std::string& what, const Progress& progress) override;

 private:
  ThreadRendezvous& rendezvous_;
  int rank_;
};

}  // namespace moed::comm
