// Each rank's exit code, for a launcher that cannot learn it from mpirun:
// under `mpirun --enable-recovery` (elastic serving) mpirun exits 0 whatever
// its ranks did, measured with Debian's Open MPI 4.1 (docs/elastic.md). With
// MOED_EXIT_STATUS_DIR set (launch/moed-mpirun --elastic sets it), a rank
// that ends writes its code into <dir>/rank-<world rank>. A rank killed, or
// one the survivors left out, writes nothing.
#pragma once

namespace moed::runtime {

// Best effort: a directory that cannot be written is reported on stderr.
void note_exit_status(int world_rank, int code);

}  // namespace moed::runtime
