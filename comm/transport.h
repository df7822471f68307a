// The Transport interface: the narrow set of exchanges the data path needs,
// implemented by each backend (MPI and UCX; NCCL for the GPU path later). Like NCCL's
// transports, a backend is a small table entry: a name, a probe that says
// whether it can run here (and why not), and a constructor.
//
// Every exchange is collective over the ranks of the job and carries a label
// ("dispatch step 3 layer 1") so that a deadline that expires can say what
// was being waited for.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/comm_config.h"

namespace moed::comm {

class ControlChannel;

// Byte blocks one rank sends to and receives from every rank.
struct ExchangeLayout {
  std::vector<std::size_t> send_bytes, send_offsets;  // per destination rank
  std::vector<std::size_t> recv_bytes, recv_offsets;  // per source rank
  std::size_t send_total() const;
  std::size_t recv_total() const;
  // Offsets as prefix sums of the byte counts.
  static std::vector<std::size_t> prefix_offsets(const std::vector<std::size_t>& bytes);
};

// Memory every rank exposes for one-sided writes (expert weights in live
// migration): a rank puts bytes into another rank's window without that rank
// taking part, then flushes to know they have landed. Created collectively.
class RmaWindow {
 public:
  virtual ~RmaWindow() = default;
  virtual std::byte* local() = 0;  // this rank's window, `bytes()` long
  virtual std::size_t bytes() const = 0;
  // Starts a write of `bytes` from `src` to `offset` in `target`'s window.
  virtual void put(int target, std::size_t offset, const void* src, std::size_t bytes) = 0;
  // Waits until every put started by this rank is complete at its target.
  virtual void flush(const std::string& what) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // send[r] goes to rank r; recv[r] comes from rank r.
  virtual void exchange_sizes(const std::uint64_t* send, std::uint64_t* recv,
                              const std::string& what) = 0;
  // The all-to-all-v of dispatch and combine.
  virtual void exchange(const std::byte* send, const ExchangeLayout& layout, std::byte* recv,
                        const std::string& what) = 0;
  // Every rank contributes `bytes`; recv holds all contributions in rank order.
  virtual void all_gather(const void* send, std::size_t bytes, void* recv,
                          const std::string& what) = 0;
  // Collective: every rank exposes `bytes` (each may differ) for puts.
  virtual std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) = 0;
  // Lets the backend make progress on outstanding work (UCX: the worker);
  // called by waits elsewhere so that no peer's one-sided put starves.
  virtual void progress() {}
};

struct TransportBackend {
  const char* name;
  const char* description;
  // Why this backend cannot run in this process, or nullopt when it can.
  std::optional<std::string> (*unavailable)();
  std::unique_ptr<Transport> (*create)(const CommConfig&, MPI_Comm);
};

std::span<const TransportBackend> transport_backends();
std::vector<std::string> transport_backend_names();
// The backend named by config; a Usage error when it is unknown or cannot run
// here. The ranks agree on it through `control` (whose waits have deadlines).
std::unique_ptr<Transport> create_transport(const CommConfig& config, MPI_Comm comm, ControlChannel& control);

}  // namespace moed::comm
