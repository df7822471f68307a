#include "comm/control_channel.h"

#include <array>
#include <climits>
#include <cstring>
#include <span>

#include "comm/mpi/mpi_session.h"
#include "comm/mpi/mpi_wait.h"
#include "common/error.h"

namespace moed::comm {

ControlChannel::ControlChannel(MPI_Comm comm, std::chrono::milliseconds timeout)
    : comm_(comm), timeout_(timeout) {
  MPI_Comm_rank(comm_.get(), &rank_);
  MPI_Comm_size(comm_.get(), &size_);
}

void ControlChannel::wait(MPI_Request& request, const std::string& what) {
  wait_collective(request, comm_.get(), timeout_, progress_, what);
}

void ControlChannel::broadcast(void* data, std::size_t bytes, const std::string& what) {
  MPI_Request req;
  check_mpi(MPI_Ibcast(data, int(bytes), MPI_BYTE, 0, comm_.get(), &req), "MPI_Ibcast");
  wait(req, what);
}

void ControlChannel::reduce_max(double* values, std::size_t n, const std::string& what) {
  MPI_Request req;
  std::vector<double> in(values, values + n);
  check_mpi(MPI_Ireduce(in.data(), values, int(n), MPI_DOUBLE, MPI_MAX, 0, comm_.get(), &req), "MPI_Ireduce");
  wait(req, what);
}

void ControlChannel::reduce_sum(std::uint64_t* values, std::size_t n, const std::string& what) {
  MPI_Request req;
  std::vector<std::uint64_t> in(values, values + n);
  check_mpi(MPI_Ireduce(in.data(), values, int(n), MPI_UINT64_T, MPI_SUM, 0, comm_.get(), &req),
            "MPI_Ireduce");
  wait(req, what);
}

void ControlChannel::reduce_sum(double* values, std::size_t n, const std::string& what) {
  MPI_Request req;
  std::vector<double> in(values, values + n);
  check_mpi(MPI_Ireduce(in.data(), values, int(n), MPI_DOUBLE, MPI_SUM, 0, comm_.get(), &req), "MPI_Ireduce");
  wait(req, what);
}

int ControlChannel::all_max(int value, const std::string& what) {
  MPI_Request req;
  int out = 0;
  check_mpi(MPI_Iallreduce(&value, &out, 1, MPI_INT, MPI_MAX, comm_.get(), &req), "MPI_Iallreduce");
  wait(req, what);
  return out;
}

std::vector<std::byte> ControlChannel::gather(const void* data, std::size_t bytes,
                                              const std::string& what) {
  if (bytes > std::size_t(INT_MAX)) MOED_THROW(Runtime, "{}: {} bytes exceed MPI's int count", what, bytes);
  int mine = int(bytes);
  std::vector<int> sizes(rank_ == 0 ? size_ : 0), offsets;
  MPI_Request req;
  check_mpi(MPI_Igather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_.get(), &req), "MPI_Igather");
  wait(req, what);
  std::vector<std::byte> out;
  if (rank_ == 0) {
    long long total = 0;
    for (int s : sizes) offsets.push_back(int(total)), total += s;
    if (total > INT_MAX) MOED_THROW(Runtime, "{}: {} bytes exceed MPI's int count", what, total);
    out.resize(std::size_t(total));
  }
  check_mpi(MPI_Igatherv(data, mine, MPI_BYTE, out.data(), sizes.data(), offsets.data(), MPI_BYTE, 0,
                         comm_.get(), &req),
            "MPI_Igatherv");
  wait(req, what);
  return out;
}

std::vector<std::byte> ControlChannel::gather_equal(const void* data, std::size_t bytes, const std::string& what) {
  if (bytes > std::size_t(INT_MAX) / std::size_t(size_))
    MOED_THROW(Runtime, "{}: {} bytes x {} ranks exceed MPI's int count", what, bytes, size_);
  std::vector<std::byte> out(rank_ == 0 ? bytes * std::size_t(size_) : 0);
  MPI_Request req;
  check_mpi(MPI_Igather(data, int(bytes), MPI_BYTE, out.data(), int(bytes), MPI_BYTE, 0, comm_.get(), &req),
            "MPI_Igather");
  wait(req, what);
  return out;
}

void ControlChannel::broadcast_text(std::string& text, const std::string& what) {
  constexpr std::size_t kBlock = 256, kInline = kBlock - sizeof(std::uint64_t);
  std::array<char, kBlock> block{};
  std::uint64_t size = rank_ == 0 ? text.size() : 0;
  if (rank_ == 0) {
    std::memcpy(block.data(), &size, sizeof size);
    std::memcpy(block.data() + sizeof size, text.data(), std::min<std::size_t>(text.size(), kInline));
  }
  broadcast(block.data(), kBlock, what);
  std::memcpy(&size, block.data(), sizeof size);
  if (rank_ != 0) text.assign(block.data() + sizeof size, std::min<std::size_t>(size, kInline));
  if (size <= kInline) return;
  text.resize(size);
  broadcast(text.data() + kInline, size - kInline, what);
}

std::vector<std::string> ControlChannel::all_gather_strings(const std::string& mine,
                                                            const std::string& what) {
  const auto bytes = all_gather_varying(comm_.get(), std::as_bytes(std::span(mine)), what,
                                        [&](MPI_Request& request) { wait(request, what); });
  std::vector<std::string> out;
  for (const auto& b : bytes) out.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
  return out;
}

}  // namespace moed::comm
