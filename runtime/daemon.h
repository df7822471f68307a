// The moed daemon on one rank: start-up (islands, placement, weights,
// transport, workload) checked on every rank before any step, then the step
// loop driven by rank 0, the coordinator, then the report.
#pragma once

#include <string>

#include "comm/mpi/mpi_session.h"
#include "runtime/config.h"

namespace moed::runtime {

struct ServeOptions {
  std::string dump_output;  // --dump-output
  std::string report_json;  // --report-json
};

// Returns the process exit code. Start-up errors on any rank end every rank
// with the worst exit code, each failing rank having said why; errors during
// steps abort the job (a peer may be blocked on us).
int serve(const Config& config, const ServeOptions& options, comm::MpiSession& mpi);

}  // namespace moed::runtime
