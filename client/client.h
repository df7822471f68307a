// libmoed_client: a model process hands one MoE layer's tokens to the moed
// rank on its host and gets the layer's outputs back. C++ API; the C ABI is
// moed_client.h, and client/python/moed_client.py wraps that.
//
// What a layer returns: for each row h, h + MoE(RMSNorm(h)), as in Mixtral's
// decoder layer: RMSNorm with the layer's post_attention_layernorm weight,
// the router (softmax over the gate's logits, top-k, renormalised), the
// SwiGLU experts, the gate-weighted sum, and the residual add. A row's output
// bits depend only on the row, the layer and the weights: not on which other
// rows, clients or ranks share its step.
//
// Rows travel in shared memory that the daemon maps too: a client has a
// fixed number of slots, each holding up to max_rows rows with their request
// ids and positions. Write rows straight into a slot (rows(), request_ids(),
// positions()), submit it, and wait for it; the outputs replace the inputs in
// the slot. Several slots in flight at once let attention on one micro-batch
// overlap the experts on another. forward() does it all with copies.
//
// A lost connection (the daemon died or is stopping, and a supervisor such
// as `moed-mpirun --restart` brings it back on the same socket) is mended
// here: the client connects again, within Options::reconnect_ms, copies
// every slot's contents into the new shared memory and submits again what
// had no answer yet. A row's output does not depend on its batch, so a
// resubmitted micro-batch gets the same bits: wait() returns late, not
// with an error, and no token is lost or served twice. While a submit is
// in flight the client keeps a copy of its rows (the daemon writes the
// outputs over them in place, possibly just before it died).
//
// Not thread-safe: one Client per thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/protocol.h"

#define MOED_CLIENT_CXX_API __attribute__((visibility("default")))

namespace moed::client {

// A failure the daemon reported (status set) or one on this side (a broken
// connection, a timeout, a misuse).
class MOED_CLIENT_CXX_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::optional<wire::Status> status = std::nullopt)
      : std::runtime_error(what), status_(status) {}
  std::optional<wire::Status> status() const { return status_; }

 private:
  std::optional<wire::Status> status_;
};

// How a client with several homes spreads its submits over them.
enum class Spread { round_robin, least_loaded };

struct Options {
  std::uint32_t slots = 4;        // submits in flight at once (the daemon may grant fewer)
  std::uint32_t max_rows = 1024;  // rows per submit (the daemon grants at most its [ingress].max_rows)
  int timeout_ms = 60'000;        // for connecting and for each wait; < 0: none
  // How long to keep trying to connect again after the connection is lost
  // (backing off from 10 ms to 500 ms between tries); 0: do not, and throw
  // at once as a lost connection always did. A wait that reconnects can
  // take up to reconnect_ms + timeout_ms.
  int reconnect_ms = 60'000;
  // The cluster's key (a file of mode 0600), for ucx:// addresses.
  std::string key_file;
  // With several homes: each submit to the next home in turn, or to the
  // one with the fewest of this client's rows in flight.
  Spread spread = Spread::round_robin;
  // With several homes: a home that holds this client's rows and has sent
  // nothing for this long is pinged, and one that answers nothing for as
  // long again is failed over (its host or link may be gone without any
  // connection breaking). The daemon answers pings from its network
  // thread, whatever its steps are doing. 0: only a broken connection.
  int home_silence_ms = 3'000;
};

class MOED_CLIENT_CXX_API Client {
 public:
  // Connects to a rank's front door: its socket on this host
  // (<[ingress].dir>/moed-ingress-<rank>.sock, bare or as unix:///PATH), or
  // its network door, ucx://HOST:PORT (with Options::key_file). A daemon
  // that does not answer yet is tried again for reconnect_ms, as a lost
  // connection is; a refusal (a wrong key, too many clients) throws at once.
  explicit Client(const std::string& address, Options options = {});
  // Several home ranks, all ucx:// addresses: one set of slots, each
  // submit sent to the home Options::spread picks, the same bits whichever
  // serves it. Homes unreachable at first are left out while one answers;
  // a home lost later is failed over: what was in flight on it is submitted
  // again to the others (and to it, once it is back, at the next failover).
  Client(const std::vector<std::string>& addresses, Options options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int rank() const;  // with several homes, the first reached's
  int ranks() const;
  int hidden() const;
  int layers() const;  // the model's layers: submits name the model's own layer number (dense ones are refused)
  int slots() const;
  int max_rows() const;

  // A free slot (one neither in flight nor holding unreleased outputs); throws
  // when all are taken.
  int acquire();
  // The slot's buffers: max_rows rows of hidden() values (fp32; or bf16, read
  // as uint16_t, in the first half), request ids and positions. Valid until
  // the next submit(), wait() or forward() call: a reconnect may move the
  // shared memory (it stays put when the daemon grants the same slots and
  // rows again), so fetch them again rather than keep them across calls.
  void* rows(int slot);
  std::uint64_t* request_ids(int slot);
  std::uint32_t* positions(int slot);
  // Serves the slot's first `rows` rows at `layer`.
  void submit(int slot, int layer, std::uint32_t rows, wire::DType dtype = wire::DType::f32);
  // Waits until the slot's outputs are in place (timeout_ms < 0: the
  // options' timeout). Throws Error with the daemon's status and message when
  // the submit failed; the slot can then be submitted again or released. A
  // lost connection is mended first (see above); when that fails, the error
  // says for how long it tried and the last errno, and every submit then in
  // flight fails with it (its rows put back in its slot).
  void wait(int slot, int timeout_ms = -1);
  // The slot may be acquired again.
  void release(int slot);

  // All of the above with copies: out[n, hidden] = the layer applied to hidden[n, hidden].
  void forward(int layer, const float* hidden, std::size_t n, const std::uint64_t* request_ids,
               const std::uint32_t* positions, float* out);

  // Connections mended since this client connected.
  std::uint64_t reconnects() const;
  // Options::reconnect_ms from now on (< 0 counts as 0).
  void set_reconnect_ms(int ms);
  // Options::home_silence_ms from now on (< 0 counts as 0: off).
  void set_home_silence_ms(int ms);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::client
