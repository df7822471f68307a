#include "comm/mpi/mpi_control_link.h"

#include <climits>
#include <span>

#include "comm/mpi/mpi_session.h"
#include "comm/mpi/mpi_wait.h"
#include "common/error.h"

namespace moed::comm {
namespace {

class MpiControlLink final : public ControlLink {
 public:
  MpiControlLink(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
    MPI_Comm_rank(comm_.get(), &rank_);
    MPI_Comm_size(comm_.get(), &size_);
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void set_progress(std::function<void()> progress) override { progress_ = std::move(progress); }

  void broadcast(void* data, std::size_t bytes, const std::string& what) override {
    if (bytes > std::size_t(INT_MAX)) MOED_THROW(Runtime, "{}: {} bytes exceed MPI's int count", what, bytes);
    MPI_Request req;
    check_mpi(MPI_Ibcast(data, int(bytes), MPI_BYTE, 0, comm_.get(), &req), "MPI_Ibcast");
    wait(req, what);
  }

  void reduce(std::span<double> values, Op op, const std::string& what) override {
    reduce_as(values, MPI_DOUBLE, op, what);
  }
  void reduce(std::span<std::uint64_t> values, Op op, const std::string& what) override {
    reduce_as(values, MPI_UINT64_T, op, what);
  }

  int all_max(int value, const std::string& what) override {
    MPI_Request req;
    int out = 0;
    check_mpi(MPI_Iallreduce(&value, &out, 1, MPI_INT, MPI_MAX, comm_.get(), &req), "MPI_Iallreduce");
    wait(req, what);
    return out;
  }

  std::vector<std::byte> gather(const void* data, std::size_t bytes, bool equal, const std::string& what) override {
    return equal ? gather_equal(data, bytes, what) : gather_varying(data, bytes, what);
  }

  std::vector<std::string> all_gather_strings(const std::string& mine, const std::string& what) override {
    const auto bytes = all_gather_varying(comm_.get(), std::as_bytes(std::span(mine)), what,
                                          [&](MPI_Request& request) { wait(request, what); });
    std::vector<std::string> out;
    for (const auto& b : bytes) out.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    return out;
  }

 private:
  void wait(MPI_Request& request, const std::string& what) {
    wait_collective(request, comm_.get(), timeout_, progress_, what);
  }

  template <class T>
  void reduce_as(std::span<T> values, MPI_Datatype type, Op op, const std::string& what) {
    if (values.size() > std::size_t(INT_MAX)) MOED_THROW(Runtime, "{}: {} values exceed MPI's int count", what, values.size());
    const std::vector<T> in(values.begin(), values.end());
    MPI_Request req;
    check_mpi(MPI_Ireduce(in.data(), values.data(), int(values.size()), type, op == Op::max ? MPI_MAX : MPI_SUM, 0,
                          comm_.get(), &req),
              "MPI_Ireduce");
    wait(req, what);
  }

  std::vector<std::byte> gather_varying(const void* data, std::size_t bytes, const std::string& what) {
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
    check_mpi(MPI_Igatherv(data, mine, MPI_BYTE, out.data(), sizes.data(), offsets.data(), MPI_BYTE, 0, comm_.get(),
                           &req),
              "MPI_Igatherv");
    wait(req, what);
    return out;
  }

  std::vector<std::byte> gather_equal(const void* data, std::size_t bytes, const std::string& what) {
    if (bytes > std::size_t(INT_MAX) / std::size_t(size_))
      MOED_THROW(Runtime, "{}: {} bytes x {} ranks exceed MPI's int count", what, bytes, size_);
    std::vector<std::byte> out(rank_ == 0 ? bytes * std::size_t(size_) : 0);
    MPI_Request req;
    check_mpi(MPI_Igather(data, int(bytes), MPI_BYTE, out.data(), int(bytes), MPI_BYTE, 0, comm_.get(), &req),
              "MPI_Igather");
    wait(req, what);
    return out;
  }

  DupComm comm_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::function<void()> progress_;
};

}  // namespace

std::unique_ptr<ControlLink> mpi_control_link(MPI_Comm comm, std::chrono::milliseconds timeout) {
  return std::make_unique<MpiControlLink>(comm, timeout);
}

}  // namespace moed::comm
