// The front door of one moed rank: model processes on this host connect to
// <[ingress].dir>/moed-ingress-<rank>.sock (mode 0600, peer uid checked) and
// submit one MoE layer's rows at a time; the rows travel in shared memory
// (client/protocol.h). A thread of its own (a SocketService,
// common/socket_service.h) accepts clients, hands each a sealed memfd of
// slots, and queues their submits; the step thread takes them (take),
// serves them, and answers (complete).
//
// Nothing a client does can stop the daemon or reach another client's
// tokens: every field of a submit is checked before it is queued, rows are
// copied out of shared memory before they are checked (a client writing to
// its slot meanwhile changes only its own rows), a row with NaN or Inf fails
// only its own submit, each client has at most one submit per slot in flight
// ("busy" beyond that) and gets one turn per round when a step takes work, a
// client that disconnects or dies has its queued submits dropped and its
// memory freed once no step uses it, and the number of clients is bounded.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/protocol.h"
#include "runtime/ingress/network_door.h"

namespace moed::runtime::ingress {

struct Limits {
  int max_clients = 64;
  std::uint32_t max_slots = 8;
  std::uint32_t max_rows = 1024;           // rows per submit
  std::size_t max_tokens_per_step = 4096;  // rows per layer per step on this rank
  std::chrono::microseconds max_wait{100};  // for more work once some is queued
  std::size_t max_client_bytes = 256u << 20;
  std::chrono::milliseconds hello_timeout{10'000};
};

class Session;

// One layer's rows of a step on this rank, in the order taken.
struct LayerBatch {
  struct Piece {
    std::shared_ptr<Session> session;
    wire::Submit submit;
    std::size_t first = 0;  // its rows are [first, first + submit.rows)
  };
  std::vector<float> x;  // rows x hidden, fp32
  std::vector<std::uint64_t> request_ids;
  std::vector<std::uint32_t> positions;
  std::vector<Piece> pieces;
  std::size_t rows() const { return request_ids.size(); }
  void clear();
};

struct FrontDoorCounters {
  std::uint64_t clients = 0;          // connected now
  std::uint64_t accepted = 0;         // connections welcomed since start
  std::uint64_t submits_queued = 0;   // submits accepted into the queue for a step since start
  std::uint64_t submits_served = 0;
  std::uint64_t rows_served = 0;
  std::uint64_t refused = 0;          // submits and connections answered with an error
};

// The layer numbers clients send: the model's own. batch_of[L] is the batch
// model layer L's rows are queued in: its MoE layer, or (dense layers moed
// serves, [model].serve_dense) one after the MoE layers; -1 for a dense
// layer moed does not serve (`dense` says which those are, for the refusal).
struct ModelLayers {
  std::vector<int> batch_of;
  std::string dense;
  int batches() const;  // the batches take() fills: one per served layer
};

class FrontDoor {
 public:
  // Binds the socket and starts the thread; throws a moed::Error naming the
  // path (Usage for a bad [ingress].dir).
  // With `network`, it also listens for clients on other hosts
  // (network_door.h) and writes the addresses, one ucx://HOST:PORT a line,
  // to <dir>/moed-ingress-<rank>.ucx.
  FrontDoor(const std::string& dir, int rank, int ranks, int hidden, ModelLayers layers, Limits limits,
            std::optional<NetworkOptions> network = std::nullopt);
  // Answers every queued submit with shutting_down and closes every client.
  ~FrontDoor();
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;

  const std::string& path() const;
  static std::string socket_path(const std::string& dir, int rank);
  static std::string network_file(const std::string& dir, int rank);
  // ucx://HOST:PORT for each address listened on; empty without a network door.
  std::vector<std::string> network_addresses() const;

  // Step thread. Waits until a submit is queued, at most `idle`; once one is,
  // waits at most max_wait for a layer's budget to fill.
  void wait_for_work(std::chrono::microseconds idle);
  // Takes this step's submits into batches[layer] (cleared first), copies
  // their rows, ids and positions out of shared memory and checks them; a
  // submit holding a non-finite value is answered with not_finite and left out.
  void take(std::vector<LayerBatch>& batches);
  // Writes each piece's outputs (its rows of batches[layer].x) into its slot
  // in the submit's dtype and answers done.
  void complete(std::vector<LayerBatch>& batches);

  FrontDoorCounters counters() const;
  NetworkCounters network_counters() const;  // zeros without a network door

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime::ingress
