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
// Not thread-safe: one Client per thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

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

struct Options {
  std::uint32_t slots = 4;        // submits in flight at once (the daemon may grant fewer)
  std::uint32_t max_rows = 256;   // rows per submit (the daemon may grant fewer)
  int timeout_ms = 60'000;        // for connecting and for each wait; < 0: none
};

class MOED_CLIENT_CXX_API Client {
 public:
  // Connects to a rank's front-door socket: <[ingress].dir>/moed-ingress-<rank>.sock.
  explicit Client(const std::string& socket_path, Options options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int rank() const;
  int ranks() const;
  int hidden() const;
  int layers() const;
  int slots() const;
  int max_rows() const;

  // A free slot (one neither in flight nor holding unreleased outputs); throws
  // when all are taken.
  int acquire();
  // The slot's buffers: max_rows rows of hidden() values (fp32; or bf16, read
  // as uint16_t, in the first half), request ids and positions.
  void* rows(int slot);
  std::uint64_t* request_ids(int slot);
  std::uint32_t* positions(int slot);
  // Serves the slot's first `rows` rows at `layer`.
  void submit(int slot, int layer, std::uint32_t rows, wire::DType dtype = wire::DType::f32);
  // Waits until the slot's outputs are in place (timeout_ms < 0: the
  // options' timeout). Throws Error with the daemon's status and message when
  // the submit failed; the slot can then be submitted again or released.
  void wait(int slot, int timeout_ms = -1);
  // The slot may be acquired again.
  void release(int slot);

  // All of the above with copies: out[n, hidden] = the layer applied to hidden[n, hidden].
  void forward(int layer, const float* hidden, std::size_t n, const std::uint64_t* request_ids,
               const std::uint32_t* positions, float* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::client
