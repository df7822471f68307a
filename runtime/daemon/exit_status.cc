#include "runtime/daemon/daemon.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace moed::runtime {

void note_exit_status(int world_rank, int code) {
  const char* dir = std::getenv("MOED_EXIT_STATUS_DIR");
  if (!dir || !*dir) return;
  const std::string path = std::string(dir) + "/rank-" + std::to_string(world_rank);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f || std::fprintf(f, "%d\n", code) < 0 || std::fclose(f) != 0)
    std::fprintf(stderr, "moed: cannot write the exit status to %s (MOED_EXIT_STATUS_DIR)\n", path.c_str());
}

}  // namespace moed::runtime
