// The Transport interface: the narrow set of exchanges the data path needs,
// implemented by each backend (NCCL, UCX and MPI). Like NCCL's
// transports, a backend is a small table entry: a name, a probe that says
// whether it can run here (and why not), and a constructor.
//
// Every exchange is collective over the ranks of the job and carries a label
// ("dispatch step 3 layer 1") so that a deadline that expires can say what
// was being waited for. A transport is made over a Bootstrap
// (comm/bootstrap.h), which carries its set-up and teardown collectives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_config.h"
#include "common/error.h"

namespace moed::comm {

class Bootstrap;
class PeerMessenger;

// An exchange or a flush that cannot complete because of some ranks (world
// ranks, ascending): their endpoint failed, or its deadline passed waiting
// for them. Elastic serving starts the survivors' agreement from them
// (comm/survivor_agreement.h); otherwise it ends the job like any Runtime error.
class PeersUnreachable : public Error {
 public:
  PeersUnreachable(std::vector<int> world_ranks, const std::string& message, const char* file, int line)
      : Error(ErrorKind::Runtime, message, file, line), ranks_(std::move(world_ranks)) {}
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;
};

// Byte blocks one rank sends to and receives from every rank.
struct ExchangeLayout {
  std::vector<std::size_t> send_bytes, send_offsets;  // per destination rank
  std::vector<std::size_t> recv_bytes, recv_offsets;  // per source rank
  std::size_t send_total() const;
  std::size_t recv_total() const;
  // Offsets as prefix sums of the byte counts.
  static std::vector<std::size_t> prefix_offsets(const std::vector<std::size_t>& bytes);
};

// Memory every rank exposes for one-sided writes (expert weights in live
// migration, through comm/weight_mover.h): a rank puts bytes into another
// rank's window without that rank taking part, then flushes to know they have
// landed. Created and destroyed collectively.
class RmaWindow {
 public:
  virtual ~RmaWindow() = default;
  virtual std::byte* local() = 0;  // this rank's window, `bytes()` long
  virtual std::size_t bytes() const = 0;
  // Starts a write of `bytes` from `src` (untouched until flush()) to
  // `offset` in `target`'s window.
  virtual void put(int target, std::size_t offset, const void* src, std::size_t bytes) = 0;
  // Waits until every put started by this rank is complete at its target.
  virtual void flush(const std::string& what) = 0;
};

// How a receive's size is known: exactly (the blocking exchanges), or as a
// capacity that the block fills from 1 byte up (a block whose capacity is 0
// is empty on both sides, and never a message).
enum class ReceiveSizes { exact, at_most };

// How long destroying an unfinished exchange waits for the receives it
// cancels: one already matched completes only as its data comes.
inline constexpr std::chrono::seconds kCancelGrace{1};

// One all-to-all-v in flight. Opening it posts every receive; blocks are
// then sent one destination at a time (whenever each is ready), and sources
// are reported as their block lands, in arrival order, so that a caller can
// work on what has arrived while the rest travels. A block of 0 bytes is not
// a message at all: both sides know the sizes, so it is neither sent nor
// waited for (its source is reported at once). Destroying an exchange that
// has not finished (after an error) cancels its receives and waits, at most
// kCancelGrace, until none can still write into the receive blocks; past it
// the job is ending (a stalled sender never delivers), and a late write is
// better than a rank that never aborts, or, in elastic serving, the memory
// is handed to the backend (keep_until_received). Sends still pending go on
// unwatched.
class Exchange {
 public:
  static constexpr int kNoneYet = -2;    // next_arrival(false): nothing new has landed
  static constexpr int kAllArrived = -1; // every source has been reported

  virtual ~Exchange() = default;
  // Sends `bytes` at `data` to `dest` (exactly the receiver's recv_bytes for
  // this rank; the buffer must stay untouched until finish()). To self: a
  // copy into the receive block, reported as an arrival. A sender calls it
  // once for every other rank, 0 bytes included: a backend may start an
  // exchange's messages only once it knows all of them (NCCL's groups).
  virtual void send(int dest, const std::byte* data, std::size_t bytes) = 0;
  // A source whose block has landed and was not reported before; with
  // `block`, waits for one (under the deadline). kAllArrived once all have.
  virtual int next_arrival(bool block) = 0;
  // Waits until every receive and every send is complete (under the deadline).
  virtual void finish() = 0;
  // The bytes that landed from `source` (after it was reported).
  virtual std::size_t received_bytes(int source) const = 0;
  // Before an exchange cut short by a loss is destroyed: `memory` holds its
  // receive blocks. A receive whose sender stalled mid-message (stopped, or
  // cut off) cannot be cancelled, and writes into its block whenever that
  // sender runs again, even after the survivors left it out. The backend
  // keeps `memory` for as long as such a receive is unfinished (for good,
  // if its sender never sends again: one step's blocks per loss), so that
  // no later allocation is written into. The default drops it at once.
  virtual void keep_until_received(std::vector<std::byte> memory) { static_cast<void>(memory); }
};

// One rank's end of the job's data path.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Opens an exchange: posts the receives of `recv_bytes[src]` bytes at
  // `recv + recv_offsets[src]`, whose blocks `what` names in diagnostics.
  // The deadline ([comm].timeout_ms) runs from here.
  virtual std::unique_ptr<Exchange> open_exchange(std::byte* recv, const std::vector<std::size_t>& recv_bytes,
                                                  const std::vector<std::size_t>& recv_offsets,
                                                  const std::string& what, ReceiveSizes sizes) = 0;
  // Collective: every rank exposes `bytes` (each may differ) for puts.
  virtual std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) = 0;
  // Lets the backend make progress on outstanding work (UCX: the worker);
  // called by waits elsewhere so that no peer's one-sided put starves.
  virtual void progress() {}
  // Point-to-point messages outside the exchanges (comm/peer_messenger.h),
  // made on first use and living as long as the transport; nullptr where the
  // backend carries none (MPI: a rank waiting in MPI cannot outlive a peer).
  virtual PeerMessenger* messenger() { return nullptr; }
  // Elastic serving: from here on the job is the world ranks `world_members`
  // (ascending, this rank among them) as epoch `epoch`: rank() and size()
  // count them densely, exchanges and windows span them alone, and what is
  // left of exchanges cut short by the loss is discarded, never matched.
  // Every exchange and window of the earlier epoch must be gone; the send
  // and receive buffers of exchanges cut short must stay allocated and
  // unchanged until this returns (a peer may still be reading a block: it
  // waits, under [comm].timeout_ms, until every send to a member is done,
  // and throws PeersUnreachable naming the members that never took theirs;
  // so too, changing nothing, for members already found lost).
  // A Usage error for a backend that cannot outlive a peer (MPI).
  virtual void continue_with(const std::vector<int>& world_members, std::uint64_t epoch);
  // The world rank of `rank` (the same rank until continue_with()).
  virtual int world_rank(int rank) const { return rank; }
  // Join slots ([comm].join_slots): what a process started later needs to
  // reach each world rank (UCX: its worker address; empty for a rank not
  // known here), and reaching such a process once it has come. A Usage
  // error for a backend that takes no late ranks (MPI).
  virtual std::vector<std::vector<std::byte>> world_addresses() const;
  virtual void connect_joiner(int world_rank, std::span<const std::byte> address);
  // Runs `hook` on the idle polls of this transport's waits (an exchange's,
  // a flush's, and a next_arrival(false) that finds nothing new); it may
  // throw to abandon the wait, which then unwinds as on any error. Elastic
  // serving polls the survivors' agreement there, so that a rank in a step
  // (blocked, or polling its exchanges between expert calls) answers it
  // and leaves the step once it begins.
  // Ignored by a backend without peer messages.
  virtual void set_wait_hook(std::function<void()> hook) { static_cast<void>(hook); }

  // Blocking exchanges, built on open_exchange (the same messages and bits).
  // Each receives into memory of its own and copies the blocks to `recv`
  // once every block has landed: cut short by a loss, it hands that memory
  // to the exchange (finish_or_keep), since the caller's may be released
  // while a stalled sender can still write into it.
  // The all-to-all-v of a whole layout: send every block, wait for all.
  void exchange(const std::byte* send, const ExchangeLayout& layout, std::byte* recv, const std::string& what);
  // send[r] goes to rank r; recv[r] comes from rank r.
  void exchange_sizes(const std::uint64_t* send, std::uint64_t* recv, const std::string& what);
  // Every rank contributes `bytes`; recv holds all contributions in rank order.
  void all_gather(const void* send, std::size_t bytes, void* recv, const std::string& what);
};

// Runs `send` (the exchange's sends), then waits for every block. Cut
// short (a lost peer, the deadline), the exchange takes `received`, the
// memory its blocks are received into (Exchange::keep_until_received), and
// the error goes on.
template <class Send>
void finish_or_keep(Exchange& exchange, std::vector<std::byte>& received, Send&& send) {
  try {
    send();
    exchange.finish();
  } catch (...) {
    exchange.keep_until_received(std::move(received));
    throw;
  }
}

struct TransportBackend {
  const char* name;
  const char* description;
  // Why this backend cannot run in this process with `config` over
  // `bootstrap`, or nullopt when it can.
  std::optional<std::string> (*unavailable)(const CommConfig& config, const Bootstrap& bootstrap);
  // Collective over the bootstrap's ranks, which must outlive the transport
  // and its windows (their teardown is collective too).
  std::unique_ptr<Transport> (*create)(const CommConfig&, Bootstrap&);
};

std::span<const TransportBackend> transport_backends();
std::vector<std::string> transport_backend_names();
// The backend named by config; a Usage error when it is unknown or cannot run
// here. The ranks agree on it over `bootstrap` (whose waits have deadlines),
// which must outlive the transport.
std::unique_ptr<Transport> create_transport(const CommConfig& config, Bootstrap& bootstrap);

}  // namespace moed::comm
