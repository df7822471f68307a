// The records of a step's gather of candidates: per token, its request
// identity and its ranked candidates, in fixed-size records of 32-bit words
// so that every rank's block size is its row count times one size:
//   request (2 words), position, chosen | candidates << 16,
//   then max_candidates x (expert, probability as 2 words of its f64 bits)
// (unused candidates are zeros). Probabilities travel as their exact bits:
// every rank decides from the same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/router/router.h"

namespace moed::runtime {

constexpr std::size_t record_words(std::size_t max_candidates) { return 4 + 3 * max_candidates; }

// Writes tokens.tokens() records at `out`.
void encode_records(const Ranked& tokens, std::span<const TokenTag> tags, std::size_t max_candidates,
                    std::uint32_t* out);
// Appends `count` records at `words` to `out` and `tags`; a record that does
// not fit max_candidates or `experts` is an Internal error.
void decode_records(const std::uint32_t* words, std::size_t count, std::size_t max_candidates, std::size_t experts,
                    Ranked& out, std::vector<TokenTag>& tags);

}  // namespace moed::runtime
