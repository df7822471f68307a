// Faults injected on purpose, for the tests that prove failures are loud:
// MOED_FAULT="stall:rank=R,step=S" makes rank R stop answering at the start of
// step S (it sleeps), so its peers' deadlines must fire with a diagnostic.
// Unset in production; an unparsable value is a Usage error, never ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moed::runtime {

struct Fault {
  enum class Kind { Stall } kind = Kind::Stall;
  int rank = -1;
  std::uint64_t step = 0;
};

// Parses the MOED_FAULT syntax above.
std::optional<Fault> parse_fault(const std::string& text);
// The fault from the environment, if any.
std::optional<Fault> fault_from_env();
// Acts on a fault that matches (rank, step); returns otherwise.
void maybe_inject(const std::optional<Fault>& fault, int rank, std::uint64_t step);

}  // namespace moed::runtime
