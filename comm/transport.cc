#include "comm/transport.h"

#include <numeric>

#include "comm/mpi/mpi_transport.h"
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

std::span<const TransportBackend> transport_backends() {
  static const TransportBackend table[] = {
      {"mpi", "MPI_Alltoallv over the job's communicator (any fabric Open MPI drives)",
       [] { return std::optional<std::string>(); }, create_mpi_transport},
  };
  return table;
}

std::vector<std::string> transport_backend_names() {
  std::vector<std::string> names;
  for (const auto& b : transport_backends()) names.push_back(b.name);
  return names;
}

std::unique_ptr<Transport> create_transport(const CommConfig& config, MPI_Comm comm) {
  for (const auto& b : transport_backends()) {
    if (config.backend != b.name) continue;
    if (auto why = b.unavailable())
      MOED_THROW(Usage, "[comm].backend = \"{}\" cannot run here: {}", b.name, *why);
    return b.create(config, comm);
  }
  MOED_THROW(Usage, "[comm].backend = \"{}\" is not a transport backend", config.backend);
}

}  // namespace moed::comm
