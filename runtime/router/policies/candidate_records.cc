#include "runtime/router/policies/candidate_records.h"

#include <algorithm>
#include <bit>

#include "common/error.h"

namespace moed::runtime {

void encode_records(const Ranked& tokens, std::span<const TokenTag> tags, std::size_t max_candidates,
                    std::uint32_t* out) {
  MOED_CHECK(tags.size() == tokens.tokens(), "candidate records: {} tags for {} tokens", tags.size(),
             tokens.tokens());
  const std::size_t W = record_words(max_candidates);
  for (std::size_t t = 0; t < tokens.tokens(); ++t) {
    std::uint32_t* r = out + t * W;
    std::fill(r, r + W, 0u);
    const auto experts = tokens.experts_of(t);
    const auto probs = tokens.probs_of(t);
    MOED_CHECK(experts.size() <= max_candidates && tokens.chosen[t] <= experts.size(),
               "candidate records: {} candidates ({} chosen), room for {}", experts.size(), tokens.chosen[t],
               max_candidates);
    r[0] = std::uint32_t(tags[t].request);
    r[1] = std::uint32_t(tags[t].request >> 32);
    r[2] = tags[t].position;
    r[3] = tokens.chosen[t] | std::uint32_t(experts.size()) << 16;
    for (std::size_t i = 0; i < experts.size(); ++i) {
      const auto bits = std::bit_cast<std::uint64_t>(probs[i]);
      r[4 + 3 * i] = experts[i];
      r[5 + 3 * i] = std::uint32_t(bits);
      r[6 + 3 * i] = std::uint32_t(bits >> 32);
    }
  }
}

void decode_records(const std::uint32_t* words, std::size_t count, std::size_t max_candidates, std::size_t experts,
                    Ranked& out, std::vector<TokenTag>& tags) {
  const std::size_t W = record_words(max_candidates);
  for (std::size_t t = 0; t < count; ++t) {
    const std::uint32_t* r = words + t * W;
    const std::uint32_t chosen = r[3] & 0xffffu, candidates = r[3] >> 16;
    // A replayed trace may leave a token without experts at a layer: 0 chosen.
    MOED_CHECK(chosen <= candidates && candidates <= max_candidates,
               "candidate record {}: {} chosen of {} candidates (room for {})", t, chosen, candidates,
               max_candidates);
    tags.push_back({std::uint64_t(r[0]) | std::uint64_t(r[1]) << 32, r[2]});
    for (std::size_t i = 0; i < candidates; ++i) {
      MOED_CHECK(r[4 + 3 * i] < experts, "candidate record {}: expert {} of {}", t, r[4 + 3 * i], experts);
      out.experts.push_back(r[4 + 3 * i]);
      out.probs.push_back(std::bit_cast<double>(std::uint64_t(r[5 + 3 * i]) | std::uint64_t(r[6 + 3 * i]) << 32));
    }
    out.end_token(chosen);
  }
}

}  // namespace moed::runtime
