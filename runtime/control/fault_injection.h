// Faults injected on purpose, for the tests that prove failures are loud.
// MOED_FAULT is one of:
//   stall:rank=R,step=S     rank R stops answering at the start of step S (it
//                           sleeps), so its peers' deadlines must fire
//   pause:rank=R,step=S,ms=M
//                           rank R sleeps M ms at the start of step S, then
//                           goes on (a rank slow for a while: the fencing
//                           lease, [comm].lease_ms)
//   migrate-fail:rank=R     rank R, as a migration source, fails its transfer
//                           after the first chunk
//   migrate-corrupt:rank=R  rank R, as a migration destination, flips a byte
//                           of what landed before verifying it
//   migrate-kill:rank=R     rank R dies (SIGKILL) when it first sends weights
//   migrate-hold:rank=R     rank R, as a migration source, sends nothing: the
//                           migration stays in transfer until it is aborted
//                           (a shutdown or a signal), whatever the step time
//   migrate-commit-kill:rank=R
//                           rank R dies (SIGKILL) at the boundary that
//                           commits a migration, before it switches (rank 0
//                           after it has sent the others the commit)
// Unset in production; an unparsable value is a Usage error, never ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moed::runtime {

struct Fault {
  enum class Kind { Stall, Pause, MigrateFail, MigrateCorrupt, MigrateKill, MigrateHold, MigrateCommitKill } kind =
      Kind::Stall;
  int rank = -1;
  std::uint64_t step = 0;  // stall and pause only
  std::uint64_t ms = 0;    // pause only
};

// Parses the MOED_FAULT syntax above.
std::optional<Fault> parse_fault(const std::string& text);
// The fault from the environment, if any.
std::optional<Fault> fault_from_env();
// Whether `fault` is of `kind` and acts on `rank` (a stall or a pause: at
// `step` too; the migration faults at any step). The one matching rule of
// maybe_inject.
bool fault_applies(const std::optional<Fault>& fault, int rank, std::uint64_t step, Fault::Kind kind);
// Acts on a stall or a pause that applies to (rank, step); returns otherwise
// (after the pause).
void maybe_inject(const std::optional<Fault>& fault, int rank, std::uint64_t step);

}  // namespace moed::runtime
