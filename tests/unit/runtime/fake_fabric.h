// The ranks of a job in one process: a comm::Transport per rank over an
// in-memory fabric that delivers the messages late and in a random order.
// A message is keyed by (exchange sequence, source, destination): every rank
// opens its exchanges in the same order, so the n-th exchange of one rank
// meets the n-th of every other.
//
// Thread-safe: the ranks may run as threads (blocking waits then wait for the
// other threads' sends, under a deadline) or all in one thread, which must
// then only poll. A fabric made with layer_pass_only also checks
// what LayerPass promises: no block to self goes through the transport, no
// wait blocks, and every block is reported before finish().
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/transport.h"
#include "common/rng.h"

namespace moed::runtime::fake {

struct FabricOptions {
  bool layer_pass_only = false;
};

class Fabric {
 public:
  explicit Fabric(std::uint64_t seed, FabricOptions options = {}) : rng_(seed), options_(options) {}

  // Rank `rank`'s end; every rank's transport must come from the same fabric.
  std::unique_ptr<comm::Transport> transport(int rank, int ranks);

  // A draw of the fabric's random stream (the delivery order; tests may share it).
  std::uint64_t draw() {
    std::lock_guard lock(mutex_);
    return rng_.bits(draws_++);
  }
  std::size_t in_flight() const {
    std::lock_guard lock(mutex_);
    return in_flight_.size();
  }
  std::uint64_t delivered() const {
    std::lock_guard lock(mutex_);
    return delivered_;
  }
  const FabricOptions& options() const { return options_; }

 private:
  friend class Exchange;
  using Key = std::tuple<std::uint64_t, int, int>;  // (sequence, source, destination)
  // Blocking waits give up after this long: a deadlock fails the test instead of hanging it.
  static constexpr std::chrono::seconds kDeadline{20};

  void post(const Key& key, std::vector<std::byte> bytes) {
    {
      std::lock_guard lock(mutex_);
      in_flight_[key] = std::move(bytes);
    }
    posted_.notify_all();
  }
  // One message for (sequence, rank): with `block`, waits for one; otherwise
  // takes one only sometimes, so that arrivals come late. Returns its source,
  // or -1 when none was taken.
  int take(std::uint64_t sequence, int rank, bool block, std::vector<std::byte>& out) {
    std::unique_lock lock(mutex_);
    const auto pending = [&] {
      std::vector<int> sources;
      for (const auto& [key, bytes] : in_flight_)
        if (std::get<0>(key) == sequence && std::get<2>(key) == rank) sources.push_back(std::get<1>(key));
      return sources;
    };
    std::vector<int> sources = pending();
    if (block) {
      const auto deadline = std::chrono::steady_clock::now() + kDeadline;
      while (sources.empty()) {
        if (posted_.wait_until(lock, deadline) == std::cv_status::timeout)
          throw std::runtime_error("fake fabric: rank " + std::to_string(rank) + " waited " +
                                   std::to_string(kDeadline.count()) + " s for exchange " + std::to_string(sequence));
        sources = pending();
      }
    } else if (sources.empty() || rng_.bits(draws_++) % 3 != 0) {
      return -1;
    }
    const int source = sources[rng_.bits(draws_++) % sources.size()];
    out = std::move(in_flight_.extract(Key{sequence, source, rank}).mapped());
    ++delivered_;
    return source;
  }

  mutable std::mutex mutex_;
  std::condition_variable posted_;
  std::map<Key, std::vector<std::byte>> in_flight_;
  CounterRng rng_;
  std::uint64_t draws_ = 0, delivered_ = 0;
  FabricOptions options_;
};

class Exchange final : public comm::Exchange {
 public:
  Exchange(Fabric& fabric, int rank, int ranks, std::uint64_t sequence, std::byte* recv,
               std::vector<std::size_t> capacity, std::vector<std::size_t> offsets, comm::ReceiveSizes sizes)
      : fabric_(fabric),
        rank_(rank),
        sequence_(sequence),
        recv_(recv),
        capacity_(std::move(capacity)),
        offsets_(std::move(offsets)),
        exact_(sizes == comm::ReceiveSizes::exact),
        landed_(std::size_t(ranks), 0),
        bytes_(std::size_t(ranks), 0) {
    for (int s = 0; s < ranks; ++s)
      if (capacity_[s] == 0) land(s, nullptr, 0);
  }
  void send(int dest, const std::byte* data, std::size_t bytes) override {
    if (bytes == 0) return;
    if (dest == rank_) {
      EXPECT_FALSE(fabric_.options().layer_pass_only) << "a block to self went through the transport";
      land(dest, data, bytes);
      return;
    }
    fabric_.post({sequence_, rank_, dest}, std::vector<std::byte>(data, data + bytes));
  }
  int next_arrival(bool block) override {
    EXPECT_FALSE(block && fabric_.options().layer_pass_only) << "LayerPass only polls";
    if (reported_ == int(landed_.size())) return kAllArrived;
    receive(false);
    while (block && arrivals_.empty()) receive(true);
    if (arrivals_.empty()) return kNoneYet;
    const int s = arrivals_.front();
    arrivals_.pop_front();
    ++reported_;
    return s;
  }
  void finish() override {
    if (fabric_.options().layer_pass_only) {
      EXPECT_EQ(reported_, int(landed_.size())) << "finish before every block was reported";
      return;
    }
    while (landed_count_ < int(landed_.size())) receive(true);
  }
  std::size_t received_bytes(int source) const override { return bytes_[source]; }

 private:
  void receive(bool block) {
    std::vector<std::byte> bytes;
    const int s = fabric_.take(sequence_, rank_, block, bytes);
    if (s >= 0) land(s, bytes.data(), bytes.size());
  }
  void land(int s, const std::byte* data, std::size_t bytes) {
    EXPECT_FALSE(landed_[s]) << "rank " << s << " twice";
    EXPECT_LE(bytes, capacity_[s]) << "block from rank " << s;
    if (exact_) {
      EXPECT_EQ(bytes, capacity_[s]) << "block from rank " << s;
    }
    if (bytes) std::memcpy(recv_ + offsets_[s], data, std::min(bytes, capacity_[s]));
    landed_[s] = 1;
    ++landed_count_;
    bytes_[s] = bytes;
    arrivals_.push_back(s);
  }

  Fabric& fabric_;
  int rank_;
  std::uint64_t sequence_;
  std::byte* recv_;
  std::vector<std::size_t> capacity_, offsets_;
  bool exact_;
  std::vector<char> landed_;
  int landed_count_ = 0;
  std::vector<std::size_t> bytes_;
  std::deque<int> arrivals_;
  int reported_ = 0;
};

class Transport final : public comm::Transport {
 public:
  Transport(Fabric& fabric, int rank, int ranks) : fabric_(fabric), rank_(rank), ranks_(ranks) {}
  const char* name() const override { return "fake"; }
  int rank() const override { return rank_; }
  int size() const override { return ranks_; }
  std::unique_ptr<comm::Exchange> open_exchange(std::byte* recv, const std::vector<std::size_t>& bytes,
                                                const std::vector<std::size_t>& offsets, const std::string&,
                                                comm::ReceiveSizes sizes) override {
    return std::make_unique<Exchange>(fabric_, rank_, ranks_, sequence_++, recv, bytes, offsets, sizes);
  }
  std::unique_ptr<comm::RmaWindow> create_window(std::size_t, const std::string&) override {
    throw std::logic_error("no windows here");
  }

 private:
  Fabric& fabric_;
  int rank_, ranks_;
  std::uint64_t sequence_ = 0;
};

inline std::unique_ptr<comm::Transport> Fabric::transport(int rank, int ranks) {
  return std::make_unique<Transport>(*this, rank, ranks);
}

}  // namespace moed::runtime::fake
