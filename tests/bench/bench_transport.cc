// Transport bandwidth for large batches, every backend that can run here,
// under mpirun (2 ranks for the figures in tests/bench/transport.sh):
//   bidir   dispatch + combine: every rank sends B bytes to every peer, then
//           the same back (the self block is left out: it is a memcpy in
//           every backend). GB/s per rank = bytes a rank sends / time.
//   oneway  rank 0 sends B bytes to rank 1, nothing else moves (the shape of
//           ucx_perftest's tag_bw, for the comparison with it).
// Besides the backends, "ucx-detect": UCX with [comm].detect_lost_peers
// (endpoints in error handling mode PEER), the price of elastic serving.
// Each figure is the best of --repeats timings of about --seconds each.
// Prints one "RESULT backend mode bytes GB/s" line per figure on rank 0, and
// asserts nothing.
//   mpirun -np 2 bench_transport [--sizes 262144,1048576,...] [--seconds S]
//                                [--repeats R] [--backend NAME|ucx-detect]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/mpi/mpi_bootstrap.h"
#include "comm/mpi/mpi_session.h"
#include "comm/transport.h"
#include "common/error.h"

namespace {

using namespace moed;
using comm::ExchangeLayout;
using comm::Transport;

ExchangeLayout uniform_layout(int ranks, int me, std::size_t bytes) {
  ExchangeLayout layout;
  for (int peer = 0; peer < ranks; ++peer) {
    layout.send_bytes.push_back(peer == me ? 0 : bytes);
    layout.recv_bytes.push_back(peer == me ? 0 : bytes);
  }
  layout.send_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
  layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
  return layout;
}

ExchangeLayout oneway_layout(int ranks, int me, std::size_t bytes) {
  ExchangeLayout layout;
  layout.send_bytes.assign(ranks, 0);
  layout.recv_bytes.assign(ranks, 0);
  if (me == 0 && ranks > 1) layout.send_bytes[1] = bytes;
  if (me == 1) layout.recv_bytes[0] = bytes;
  layout.send_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
  layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
  return layout;
}

// Seconds for `iters` rounds (one exchange, or two with the way back), on
// the slowest rank.
double time_rounds(Transport& t, const ExchangeLayout& out, const ExchangeLayout& back, int iters,
                   bool with_back) {
  std::vector<std::byte> send(std::max(out.send_total(), back.send_total()) + 1, std::byte{1});
  std::vector<std::byte> recv(std::max(out.recv_total(), back.recv_total()) + 1);
  const auto round = [&] {
    t.exchange(send.data(), out, recv.data(), "bench dispatch");
    if (with_back) t.exchange(send.data(), back, recv.data(), "bench combine");
  };
  for (int i = 0; i < 3; ++i) round();  // warm-up: connections, registration caches
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) round();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) sizes.push_back(std::stoull(item));
  return sizes;
}

}  // namespace

// UCX with [comm].detect_lost_peers: what elastic serving's endpoints cost.
constexpr const char* kUcxDetecting = "ucx-detect";

int main(int argc, char** argv) {
  comm::MpiSession mpi(&argc, &argv);
  std::vector<std::size_t> sizes{std::size_t(256) << 10, std::size_t(1) << 20,
                                 std::size_t(2048) * 4096, std::size_t(32) << 20};
  double target_seconds = 0.5;
  int repeats = 3;
  std::vector<std::string> backends = comm::transport_backend_names();
  backends.emplace_back(kUcxDetecting);
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--sizes")
      sizes = parse_sizes(argv[i + 1]);
    else if (arg == "--seconds")
      target_seconds = std::stod(argv[i + 1]);
    else if (arg == "--repeats")
      repeats = std::max(1, std::stoi(argv[i + 1]));
    else if (arg == "--backend")
      backends = {argv[i + 1]};
  }
  if (mpi.size() < 2) {
    if (mpi.rank() == 0) std::cerr << "bench_transport needs at least 2 ranks\n";
    return 2;
  }
  comm::MpiBootstrap bootstrap(mpi.world(), std::chrono::milliseconds(120000));
  try {
    for (const std::string& name : backends) {
      comm::CommConfig config;
      config.detect_lost_peers = name == kUcxDetecting;
      config.backend = comm::kBackendNames.parse(config.detect_lost_peers ? "ucx" : name, "--backend");
      config.timeout_ms = 120000;
      std::unique_ptr<Transport> t;
      try {
        t = comm::create_transport(config, bootstrap);
      } catch (const Error& e) {
        if (mpi.rank() == 0) std::cout << fmt::format("# {} skipped: {}\n", name, e.what());
        continue;
      }
      for (std::size_t bytes : sizes) {
        // Enough rounds for about target_seconds at 2 GB/s, at least 5; the
        // best of `repeats` timings (other work on a shared machine only slows).
        const int iters = std::max(5, int(target_seconds * 2e9 / double(2 * bytes)));
        const ExchangeLayout both = uniform_layout(t->size(), t->rank(), bytes);
        const ExchangeLayout one = oneway_layout(t->size(), t->rank(), bytes);
        double bidir_gbps = 0, oneway_gbps = 0;
        for (int r = 0; r < repeats; ++r) {
          const double bidir = time_rounds(*t, both, both, iters, true);
          bidir_gbps =
              std::max(bidir_gbps, double(bytes) * (t->size() - 1) * 2 * iters / bidir / 1e9);
          const double oneway = time_rounds(*t, one, one, 2 * iters, false);
          oneway_gbps = std::max(oneway_gbps, double(bytes) * 2 * iters / oneway / 1e9);
        }
        if (mpi.rank() == 0) {
          std::cout << fmt::format("RESULT {} bidir {} {:.3f}\n", name, bytes, bidir_gbps);
          std::cout << fmt::format("RESULT {} oneway {} {:.3f}\n", name, bytes, oneway_gbps);
          std::cout.flush();
        }
      }
    }
  } catch (const Error& e) {
    std::cerr << fmt::format("rank {}: {}\n", mpi.rank(), e.describe());
    mpi.abort(1);
  }
  return 0;
}
