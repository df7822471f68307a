// The bootstrap of a process started after the job (`moed --join`): in
// place of MPI, a TCP conversation with world rank 0's join listener
// (runtime/join/join_wire.h). Made, it has proven the key and holds the world
// rank offered it; the transport's all_gather of worker addresses then
// sends this rank's and returns every rank's as rank 0 knows them, once
// every member has reached this one.
//
// Its other collectives are this rank's alone (the job's ranks agreed long
// ago, without it): all_reduce leaves the values as they are and barrier
// returns at once. A transport made over it reaches its peers only through
// its own endpoints, and tears down alone (as after a loss).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "client/auth.h"
#include "comm/bootstrap.h"
#include "runtime/join/join_wire.h"
#include "common/listen_address.h"
#include "common/unique_fd.h"

namespace moed::runtime::join {

class JoinBootstrap final : public comm::Bootstrap {
 public:
  // Connects to `listener` and proves the key: throws JoinRefused
  // with the listener's reason (a different config, the wrong key, no slot
  // left) or a Runtime error (unreachable, silent past `timeout`, a
  // listener that could not prove the key).
  JoinBootstrap(const ListenAddress& listener, const wire::Key& key, const std::string& command,
                const std::string& host, int products_ability, std::chrono::milliseconds timeout);

  int rank() const override { return offer_.world_rank; }
  int size() const override { return offer_.launched_ranks; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  // Once: sends `mine` (the worker address) and waits, up to `welcome_wait`,
  // for the welcome; returns every world rank's address (empty: none).
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine, const std::string& what) override;
  void all_reduce(std::span<std::int64_t>, Reduction, const std::string&) override {}
  void barrier(const std::string&, const Progress&) override {}

  const Offer& offer() const { return offer_; }
  // After all_gather: what rank 0 told this rank of the job.
  const Welcome& welcome() const;

 private:
  ListenAddress listener_;
  std::string from_;  // "the join listener at HOST:PORT"
  std::chrono::milliseconds timeout_;
  UniqueFd fd_;
  Offer offer_;
  std::optional<Welcome> welcome_;
};

}  // namespace moed::runtime::join
