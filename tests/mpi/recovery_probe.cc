// What Debian's Open MPI does when a rank of a running job dies (issue 31,
// docs/elastic.md): the highest rank kills itself after a barrier; the
// survivors, still alive after a pause, exchange a value point to point with
// a survivor neighbour on MPI_COMM_WORLD, then try a barrier on it, which a
// watchdog alarm gives `--barrier-seconds` to complete. Each survivor prints
// one line per finding and leaves without MPI_Finalize (_exit): a
// finalisation would wait for the dead rank too. Needs 3 ranks or more.
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace {

int g_rank = -1;

void barrier_timed_out(int) {
  // Only async-signal-safe calls here.
  char line[96];
  const int n = std::snprintf(line, sizeof line, "rank %d: barrier after the loss: no answer\n", g_rank);
  if (n > 0) (void)!write(STDOUT_FILENO, line, std::size_t(n));
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned barrier_seconds = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--barrier-seconds") == 0) barrier_seconds = unsigned(std::atoi(argv[i + 1]));
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (size < 3) {
    if (g_rank == 0) std::fprintf(stderr, "recovery_probe: needs 3 ranks or more\n");
    MPI_Finalize();
    return 2;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const int lost = size - 1;
  if (g_rank == lost) std::raise(SIGKILL);
  sleep(2);
  std::printf("rank %d: alive after rank %d was lost\n", g_rank, lost);
  std::fflush(stdout);
  // Survivors pair up (0-1, 2-3, ...); one left without a partner skips this.
  const int peer = g_rank ^ 1;
  if (peer < lost) {
    int mine = g_rank, got = -1;
    const int rc = MPI_Sendrecv(&mine, 1, MPI_INT, peer, 0, &got, 1, MPI_INT, peer, 0, MPI_COMM_WORLD,
                                MPI_STATUS_IGNORE);
    std::printf("rank %d: point to point with rank %d: %s\n", g_rank, peer,
                rc == MPI_SUCCESS && got == peer ? "works" : "fails");
    std::fflush(stdout);
  }
  std::signal(SIGALRM, barrier_timed_out);
  alarm(barrier_seconds);
  const int rc = MPI_Barrier(MPI_COMM_WORLD);
  alarm(0);
  std::printf("rank %d: barrier after the loss: %s\n", g_rank, rc == MPI_SUCCESS ? "completed" : "error");
  std::fflush(stdout);
  _exit(0);
}
