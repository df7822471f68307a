#include "comm/transport.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/mpi/mpi_transport.h"
#include "comm/nccl/nccl_probe.h"
#include "comm/nccl/nccl_transport.h"
#include "comm/ucx/ucx_transport.h"
#include "common/error.h"

namespace moed::comm {

std::size_t ExchangeLayout::send_total() const {
  return std::accumulate(send_bytes.begin(), send_bytes.end(), std::size_t{0});
}
std::size_t ExchangeLayout::recv_total() const {
  return std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0});
}
std::vector<std::size_t> ExchangeLayout::prefix_offsets(const std::vector<std::size_t>& bytes) {
  std::vector<std::size_t> offsets(bytes.size(), 0);
  for (std::size_t i = 1; i < bytes.size(); ++i) offsets[i] = offsets[i - 1] + bytes[i - 1];
  return offsets;
}

std::vector<std::vector<std::byte>> Transport::world_addresses() const {
  MOED_THROW(Usage, "the {} transport takes no rank after start-up ([comm].join_slots needs backend ucx)", name());
}

void Transport::connect_joiner(int, std::span<const std::byte>) {
  MOED_THROW(Usage, "the {} transport takes no rank after start-up ([comm].join_slots needs backend ucx)", name());
}

void Transport::continue_with(const std::vector<int>&, std::uint64_t) {
  MOED_THROW(Usage, "[comm].backend {} cannot go on without a lost rank: elastic serving needs ucx", name());
}

void Transport::exchange(const std::byte* send, const ExchangeLayout& layout, std::byte* recv,
                         const std::string& what) {
  const int n = size();
  MOED_CHECK(int(layout.send_bytes.size()) == n && int(layout.recv_bytes.size()) == n &&
                 int(layout.send_offsets.size()) == n && int(layout.recv_offsets.size()) == n,
             "{}: layout for {} ranks", what, layout.send_bytes.size());
  std::size_t extent = 0;
  for (int r = 0; r < n; ++r) extent = std::max(extent, layout.recv_offsets[r] + layout.recv_bytes[r]);
  std::vector<std::byte> received(extent);
  std::unique_ptr<Exchange> x =
      open_exchange(received.data(), layout.recv_bytes, layout.recv_offsets, what, ReceiveSizes::exact);
  finish_or_keep(*x, received, [&] {
    // Remote blocks first, so that the copy to self overlaps their travel.
    for (int i = 1; i <= n; ++i) {
      const int dest = (rank() + i) % n;
      x->send(dest, send + layout.send_offsets[dest], layout.send_bytes[dest]);
    }
  });
  for (int r = 0; r < n; ++r)  // block by block: what lies between them is the caller's
    if (layout.recv_bytes[r])
      std::memcpy(recv + layout.recv_offsets[r], received.data() + layout.recv_offsets[r], layout.recv_bytes[r]);
}

void Transport::exchange_sizes(const std::uint64_t* send, std::uint64_t* recv, const std::string& what) {
  ExchangeLayout layout;
  layout.send_bytes.assign(size(), sizeof(std::uint64_t));
  layout.recv_bytes = layout.send_bytes;
  layout.send_offsets = layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
  exchange(reinterpret_cast<const std::byte*>(send), layout, reinterpret_cast<std::byte*>(recv), what);
}

void Transport::all_gather(const void* send, std::size_t bytes, void* recv, const std::string& what) {
  ExchangeLayout layout;
  layout.send_bytes.assign(size(), bytes);
  layout.recv_bytes = layout.send_bytes;
  layout.send_offsets.assign(size(), 0);  // the same block goes to everyone
  layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
  exchange(static_cast<const std::byte*>(send), layout, static_cast<std::byte*>(recv), what);
}

// In order of preference: "auto" picks the first that can run on every rank.
std::span<const TransportBackend> transport_backends() {
  static const TransportBackend table[] = {
      {"nccl", "NCCL grouped send/receive through the rank's GPU (NVLink, InfiniBand with GPUDirect)",
       nccl_unavailable, create_nccl_transport},
      {"ucx", "UCX (ucp) tagged messages and RMA puts (shared memory, tcp, InfiniBand, ...)",
       ucx_unavailable, create_ucx_transport},
      {"mpi", "MPI point-to-point over the job's communicator (any fabric Open MPI drives)",
       mpi_unavailable, create_mpi_transport},
  };
  return table;
}

std::vector<std::string> transport_backend_names() {
  std::vector<std::string> names;
  for (const auto& b : transport_backends()) names.emplace_back(b.name);
  return names;
}

std::unique_ptr<Transport> create_transport(const CommConfig& config, Bootstrap& bootstrap) {
  const auto backends = transport_backends();
  const bool automatic = config.backend == Backend::automatic;
  const auto named = [&](const TransportBackend& b) { return name_of(config.backend) == b.name; };
  if (!automatic && std::none_of(backends.begin(), backends.end(), named))
    MOED_THROW(Usage, "[comm].backend = \"{}\" is not a transport backend", name_of(config.backend));

  // Probe the candidates here, then agree over all ranks: every rank must pick
  // the same backend, and a backend that cannot run on one rank runs on none
  // (its constructor is collective and would wait for that rank forever).
  std::vector<std::optional<std::string>> why_not(backends.size());
  std::vector<int> usable(backends.size(), 0);
  for (std::size_t i = 0; i < backends.size(); ++i) {
    if (!automatic && !named(backends[i])) continue;
    why_not[i] = backends[i].unavailable(config, bootstrap);
    usable[i] = why_not[i] ? 0 : 1;
  }
  for (std::size_t i = 0; i < backends.size(); ++i)
    usable[i] = 1 - int(bootstrap.all_max(1 - usable[i], fmt::format("whether [comm].backend {} runs everywhere",
                                                                     backends[i].name)));

  for (std::size_t i = 0; i < backends.size(); ++i) {
    const TransportBackend& b = backends[i];
    if (!automatic && !named(b)) continue;
    if (usable[i]) {
      return b.create(config, bootstrap);
    }
    if (automatic) continue;
    if (why_not[i])
      MOED_THROW(Usage, "[comm].backend = \"{}\" cannot run here: {}", b.name, *why_not[i]);
    MOED_THROW(Usage, "[comm].backend = \"{}\" cannot run on another rank (see its error)", b.name);
  }
  std::string reasons;
  for (std::size_t i = 0; i < backends.size(); ++i)
    reasons += fmt::format("; {}: {}", backends[i].name,
                           why_not[i] ? *why_not[i] : std::string("cannot run on another rank"));
  MOED_THROW(Usage, "[comm].backend = \"auto\": no backend can run on every rank{}", reasons);
}

}  // namespace moed::comm
