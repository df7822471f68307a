// SIGTERM and SIGINT drain the daemon instead of killing it. Slurm's scancel
// and mpirun both deliver SIGTERM to every rank; Ctrl-C gives SIGINT.
//
// The handler only records the signal. Rank 0's control plane turns it into
// a shutdown at the next step boundary, as `moectl shutdown` would: the step
// in flight finishes, a migration before its switch aborts, the report and
// the statistics are written, the sockets are removed, and the job exits 0.
// The same signal a second time ends the process at once (its default action).
//
// SIGUSR2 drains too: mpirun cannot forward SIGTERM or SIGINT (it ends the job
// itself and exits 1), but it forwards SIGUSR2 to every rank, so moed-mpirun
// turns the SIGTERM or SIGINT it gets into a SIGUSR2 for mpirun.
#pragma once

namespace moed::runtime {

// Installs the handlers for SIGTERM, SIGINT and SIGUSR2 (once per process).
void install_stop_signals();
// The first stop signal received (SIGTERM, SIGINT or SIGUSR2), or 0.
int stop_signal();
// "SIGTERM", "SIGINT", or the number.
const char* signal_name(int signal);

}  // namespace moed::runtime
