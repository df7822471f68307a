// Which global token sits at each position of a step. In order, token
// step x T + p sits at position p. Shuffled ([workload].order = "shuffled"),
// the step serves the same T tokens in a permutation drawn from the step and
// the seed, so each token lands at another position, and often on another
// rank, than in order: the tests use it to show that a token's output does
// not depend on where in its step it is served.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/router/router.h"

namespace moed::runtime {

// Requests of the built-in workloads ([workload].positions_per_request = P):
// token id s x T + i (step s, slot i) is position s mod P of request
// (s / P) x T + i, so a request is served at one slot of P consecutive steps,
// one position per step, as in decoding. P = 1: every token is request = its
// id, at position 0. Pure: every rank count sees the same requests.
TokenTag request_of_token(std::uint64_t id, std::uint64_t tokens_per_step, std::uint64_t positions_per_request);
// The step that serves request `request`'s last position (its slot of the P
// consecutive steps of its block): the inverse of request_of_token.
std::uint64_t last_step_of_request(std::uint64_t request, std::uint64_t tokens_per_step,
                                   std::uint64_t positions_per_request);

class TokenOrder {
 public:
  TokenOrder(std::uint64_t tokens_per_step, bool shuffled, std::uint64_t seed);
  bool shuffled() const { return shuffled_; }
  // Global ids of positions [first, first + count) of step `step`.
  void ids(std::uint64_t step, std::uint64_t first, std::size_t count, std::vector<std::uint64_t>& out) const;
  // The position of every token of the step, indexed by id - step x T (the
  // inverse permutation), for putting rows back in id order.
  void positions(std::uint64_t step, std::vector<std::uint32_t>& out) const;

 private:
  void permutation(std::uint64_t step, std::vector<std::uint32_t>& out) const;  // position -> id offset

  std::uint64_t tokens_per_step_;
  bool shuffled_;
  std::uint64_t seed_;
};

}  // namespace moed::runtime
