#include "runtime/control/fault_injection.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <thread>

#include "common/error.h"

namespace moed::runtime {

std::optional<Fault> parse_fault(const std::string& text) {
  if (text.empty()) return std::nullopt;
  static const std::regex stall(R"(stall:rank=(\d{1,9}),step=(\d{1,18}))");
  static const std::regex pause(R"(pause:rank=(\d{1,9}),step=(\d{1,18}),ms=(\d{1,9}))");
  static const std::regex migrate(R"(migrate-(fail|corrupt|kill|hold|commit-kill):rank=(\d{1,9}))");
  std::smatch m;
  if (std::regex_match(text, m, stall)) return Fault{Fault::Kind::Stall, std::stoi(m[1]), std::stoull(m[2])};
  if (std::regex_match(text, m, pause))
    return Fault{Fault::Kind::Pause, std::stoi(m[1]), std::stoull(m[2]), std::stoull(m[3])};
  if (std::regex_match(text, m, migrate)) {
    const Fault::Kind kind = m[1] == "fail"      ? Fault::Kind::MigrateFail
                             : m[1] == "corrupt" ? Fault::Kind::MigrateCorrupt
                             : m[1] == "kill"    ? Fault::Kind::MigrateKill
                             : m[1] == "hold"    ? Fault::Kind::MigrateHold
                                                 : Fault::Kind::MigrateCommitKill;
    return Fault{kind, std::stoi(m[2]), 0};
  }
  MOED_THROW(Usage,
             "MOED_FAULT=\"{}\": expected stall:rank=R,step=S, pause:rank=R,step=S,ms=M or "
             "migrate-fail|migrate-corrupt|migrate-kill|migrate-hold|migrate-commit-kill:rank=R",
             text);
}

std::optional<Fault> fault_from_env() {
  const char* text = std::getenv("MOED_FAULT");
  return parse_fault(text ? text : "");
}

bool fault_applies(const std::optional<Fault>& fault, int rank, std::uint64_t step, Fault::Kind kind) {
  const bool at_a_step = kind == Fault::Kind::Stall || kind == Fault::Kind::Pause;
  return fault && fault->kind == kind && fault->rank == rank && (!at_a_step || fault->step == step);
}

void maybe_inject(const std::optional<Fault>& fault, int rank, std::uint64_t step) {
  if (fault_applies(fault, rank, step, Fault::Kind::Pause)) {
    spdlog::warn("MOED_FAULT: rank {} pauses {} ms at step {} on purpose", rank, fault->ms, step);
    std::this_thread::sleep_for(std::chrono::milliseconds(fault->ms));
    return;
  }
  if (!fault_applies(fault, rank, step, Fault::Kind::Stall)) return;
  spdlog::warn("MOED_FAULT: rank {} stalls at step {} on purpose", rank, step);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the job is aborted
}

}  // namespace moed::runtime
