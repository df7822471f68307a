// NcclGroups on the rank's GPU: each lane is a non-blocking NCCL
// communicator with a CUDA stream of its own. A group's host blocks go
// through pinned staging: the sends are copied to it at launch (so the
// caller's memory is free at once, and no copy from pageable memory makes
// the host wait on the stream), then to device memory, NCCL moves them, and
// the receives come back the same way, landing in their host blocks when
// the group's event says it is done. Nothing here waits for a peer: NCCL's
// calls are non-blocking (ncclInProgress is polled), device memory is
// stream-ordered (cudaMallocAsync, never cudaFree, which would wait for the
// whole device), and completion is an event query.
//
// NCCL is loaded at run time (libnccl.so.2), as the probe does, so that moed
// links no NCCL; CUDA is the static runtime, which loads the driver on use.
// Built only with nvcc (MOED_NCCL_TRANSPORT). Nothing of it has run on a GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "comm/bootstrap.h"
#include "comm/mpi/mpi_transport.h"
#include "comm/nccl/nccl_groups.h"
#include "comm/nccl/nccl_probe.h"
#include "comm/nccl/nccl_transport.h"
#include "comm/ucx/ucx_transport.h"
#include "common/error.h"

namespace moed::comm {

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* call, int lane) {
  if (e != cudaSuccess)
    MOED_THROW(Runtime, "NCCL lane {}: {}: {} ({})", lane, call, cudaGetErrorName(e), cudaGetErrorString(e));
}

// NCCL's entry points, from libnccl.so.2, loaded once for the process.
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommFinalize) finalize = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

  static const NcclApi& get() {
    static const NcclApi api = load();
    return api;
  }

  // ncclSuccess and ncclInProgress (a non-blocking call still working) pass.
  void check(ncclResult_t r, const char* call, int lane) const {
    if (r != ncclSuccess && r != ncclInProgress)
      MOED_THROW(Runtime, "NCCL lane {}: {}: {} (ncclResult_t {})", lane, call, error_string(r), int(r));
  }

 private:
  static NcclApi load() {
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);  // kept for the process
    if (!handle) MOED_THROW(Runtime, "the nccl transport cannot load NCCL: {}", dlerror());
    NcclApi a;
    const auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn) MOED_THROW(Runtime, "libnccl.so.2 has no {} (the transport needs NCCL {} or later)", name,
                          nccl_version_string(kOldestNccl));
    };
    find(a.get_unique_id, "ncclGetUniqueId");
    find(a.init_rank_config, "ncclCommInitRankConfig");
    find(a.finalize, "ncclCommFinalize");
    find(a.destroy, "ncclCommDestroy");
    find(a.abort, "ncclCommAbort");
    find(a.async_error, "ncclCommGetAsyncError");
    find(a.group_start, "ncclGroupStart");
    find(a.group_end, "ncclGroupEnd");
    find(a.send, "ncclSend");
    find(a.recv, "ncclRecv");
    find(a.error_string, "ncclGetErrorString");
    return a;
  }
};

// Page-locked host memory, kept for reuse: a lane holds at most one buffer
// per group in flight, each grown by doubling, so what it keeps is bounded by
// the largest step, never by the number of steps.
struct Pinned {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

class CudaNcclGroups final : public NcclGroups {
 public:
  CudaNcclGroups(const CommConfig& config, Bootstrap& bootstrap)
      : api_(NcclApi::get()), device_(config.device), lanes_(std::size_t(config.nccl_lanes)) {
    MOED_CHECK(device_ >= 0, "the nccl transport needs the rank's GPU ([experts].device)");
    const auto deadline = Clock::now() + std::chrono::milliseconds(config.timeout_ms);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice", -1);
    // Stream-ordered allocations keep their memory between groups.
    cudaMemPool_t pool = nullptr;
    check_cuda(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool", -1);
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute", -1);

    // One unique id per lane, made by rank 0 and gathered by all.
    std::vector<ncclUniqueId> ids(lanes_.size());
    if (bootstrap.rank() == 0)
      for (std::size_t l = 0; l < lanes_.size(); ++l)
        api_.check(api_.get_unique_id(&ids[l]), "ncclGetUniqueId", int(l));
    const auto all = bootstrap.all_gather(std::as_bytes(std::span(ids)), "the NCCL lanes' unique ids");
    MOED_CHECK(all[0].size() == ids.size() * sizeof(ncclUniqueId), "NCCL unique ids: {} bytes from rank 0",
               all[0].size());
    std::memcpy(ids.data(), all[0].data(), all[0].size());

    for (std::size_t l = 0; l < lanes_.size(); ++l) {
      ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
      nccl_config.blocking = 0;
      api_.check(api_.init_rank_config(&lanes_[l].comm, bootstrap.size(), ids[l], bootstrap.rank(), &nccl_config),
                 "ncclCommInitRankConfig", int(l));
      check_cuda(cudaStreamCreateWithFlags(&lanes_[l].stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                 int(l));
    }
    for (std::size_t l = 0; l < lanes_.size(); ++l) wait_ready(int(l), deadline, "ncclCommInitRankConfig");
    connect_every_peer(bootstrap.rank(), bootstrap.size(), deadline);
  }

  ~CudaNcclGroups() override {
    if (!aborted_) {
      // The job's end: each communicator finishes what it has, within a
      // grace period; if one cannot, every one is aborted instead.
      const auto until = Clock::now() + std::chrono::seconds(10);
      bool clean = true;
      for (Lane& lane : lanes_) {
        const ncclResult_t r = api_.finalize(lane.comm);
        clean = clean && (r == ncclSuccess || r == ncclInProgress);
      }
      for (Lane& lane : lanes_) {
        ncclResult_t state = ncclInProgress;
        while (clean && api_.async_error(lane.comm, &state) == ncclSuccess && state == ncclInProgress &&
               Clock::now() < until) {
        }
        clean = clean && state == ncclSuccess;
      }
      for (Lane& lane : lanes_) {
        if (clean)
          api_.destroy(lane.comm);
        else
          api_.abort(lane.comm);
        lane.comm = nullptr;
      }
    }
    cudaSetDevice(device_);
    for (Lane& lane : lanes_) {
      if (lane.stream) cudaStreamSynchronize(lane.stream);
      for (Group& g : lane.groups) release(lane, g);
      for (cudaEvent_t e : lane.events) cudaEventDestroy(e);
      for (const Pinned& p : lane.pinned) cudaFreeHost(p.data);
      if (lane.stream) cudaStreamDestroy(lane.stream);
    }
  }

  int lanes() const override { return int(lanes_.size()); }

  std::uint64_t launch(int l, std::span<const P2pBlock> sends, std::span<const P2pBlock> receives) override {
    MOED_CHECK(!aborted_, "NCCL lane {}: a launch after the lanes stopped", l);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice", l);
    Lane& lane = lanes_[std::size_t(l)];
    Group g;
    g.ticket = ++lane.launched;
    g.sends.assign(sends.begin(), sends.end());
    g.receives.assign(receives.begin(), receives.end());
    for (const P2pBlock& b : sends) g.send_bytes += b.bytes;
    for (const P2pBlock& b : receives) g.receive_bytes += b.bytes;
    g.staging = take_pinned(lane, g.send_bytes + g.receive_bytes, l);
    std::size_t at = 0;
    for (const P2pBlock& b : sends) std::memcpy(g.staging.data + at, b.data, b.bytes), at += b.bytes;
    lane.groups.push_back(std::move(g));
    pump(l);
    return lane.launched;
  }

  bool complete(int l, std::uint64_t ticket) override {
    MOED_CHECK(!aborted_, "NCCL lane {}: polled after the lanes stopped", l);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice", l);
    pump(l);
    return lanes_[std::size_t(l)].completed >= ticket;
  }

  void abort() noexcept override {
    if (aborted_) return;
    aborted_ = true;
    for (Lane& lane : lanes_)
      if (lane.comm) api_.abort(lane.comm), lane.comm = nullptr;
  }

  std::string describe(int l) const override {
    const Lane& lane = lanes_[std::size_t(l)];
    std::string front = "nothing in flight";
    if (!lane.groups.empty()) {
      static constexpr const char* kStates[] = {"waiting for the group before it", "issued, NCCL still enqueuing",
                                                "on the stream, not done"};
      const Group& g = lane.groups.front();
      front = fmt::format("group {} {} ({} B out, {} B in)", g.ticket, kStates[int(g.state)], g.send_bytes,
                          g.receive_bytes);
    }
    ncclResult_t state = ncclSuccess;
    if (lane.comm) api_.async_error(lane.comm, &state);
    return fmt::format("GPU {}, launched {}, completed {}, {}; ncclCommGetAsyncError: {}", device_, lane.launched,
                       lane.completed, front, api_.error_string(state));
  }

 private:
  struct Group {
    enum class State { waiting, issued, enqueued };
    std::uint64_t ticket = 0;
    State state = State::waiting;
    std::vector<P2pBlock> sends, receives;
    std::size_t send_bytes = 0, receive_bytes = 0;
    Pinned staging;                  // sends, then receives
    std::byte* device = nullptr;     // the same layout, stream-ordered
    cudaEvent_t done = nullptr;
  };
  struct Lane {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    std::deque<Group> groups;  // launched, not complete, in order
    std::uint64_t launched = 0, completed = 0;
    std::vector<cudaEvent_t> events;  // made once, reused
    std::vector<Pinned> pinned;       // every buffer this lane made
    std::vector<Pinned> free_pinned;
  };

  Pinned take_pinned(Lane& lane, std::size_t bytes, int l) {
    auto best = lane.free_pinned.end();
    for (auto it = lane.free_pinned.begin(); it != lane.free_pinned.end(); ++it)
      if (it->bytes >= bytes && (best == lane.free_pinned.end() || it->bytes < best->bytes)) best = it;
    if (best != lane.free_pinned.end()) {
      const Pinned p = *best;
      lane.free_pinned.erase(best);
      return p;
    }
    std::size_t largest = 0;
    for (const Pinned& p : lane.pinned) largest = std::max(largest, p.bytes);
    Pinned p;
    p.bytes = std::max({bytes, 2 * largest, std::size_t(64) << 10});
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&p.data), p.bytes, cudaHostAllocDefault), "cudaHostAlloc", l);
    lane.pinned.push_back(p);
    return p;
  }

  void release(Lane& lane, Group& g) noexcept {
    if (g.staging.data) lane.free_pinned.push_back(g.staging), g.staging = {};
    if (g.done) lane.events.push_back(g.done), g.done = nullptr;
  }

  // Moves the lane's groups on: issues the next when the one before it is
  // on the stream (NCCL takes a communicator's calls one group at a time),
  // puts an issued group's return copy and event on the stream once NCCL has
  // enqueued it, and lands the groups that are done, in order.
  void pump(int l) {
    Lane& lane = lanes_[std::size_t(l)];
    for (std::size_t i = 0; i < lane.groups.size(); ++i) {
      Group& g = lane.groups[i];
      if (g.state == Group::State::waiting) {
        if (i > 0 && lane.groups[i - 1].state != Group::State::enqueued) break;
        issue(lane, g, l);
      }
      if (g.state == Group::State::issued) {
        ncclResult_t state = ncclInProgress;
        api_.check(api_.async_error(lane.comm, &state), "ncclCommGetAsyncError", l);
        api_.check(state, "the group's launch", l);
        if (state == ncclInProgress) break;
        enqueue_return(lane, g, l);
      }
    }
    while (!lane.groups.empty() && lane.groups.front().state == Group::State::enqueued) {
      Group& g = lane.groups.front();
      const cudaError_t e = cudaEventQuery(g.done);
      if (e == cudaErrorNotReady) {
        ncclResult_t state = ncclSuccess;
        api_.check(api_.async_error(lane.comm, &state), "ncclCommGetAsyncError", l);
        api_.check(state, "a group in flight", l);
        break;
      }
      check_cuda(e, "cudaEventQuery", l);
      std::size_t at = g.send_bytes;
      for (const P2pBlock& b : g.receives) std::memcpy(b.data, g.staging.data + at, b.bytes), at += b.bytes;
      release(lane, g);
      lane.groups.pop_front();
      ++lane.completed;
    }
  }

  void issue(Lane& lane, Group& g, int l) {
    const std::size_t total = g.send_bytes + g.receive_bytes;
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&g.device), std::max<std::size_t>(total, 1), lane.stream),
               "cudaMallocAsync", l);
    if (g.send_bytes)
      check_cuda(cudaMemcpyAsync(g.device, g.staging.data, g.send_bytes, cudaMemcpyHostToDevice, lane.stream),
                 "cudaMemcpyAsync (sends to the GPU)", l);
    api_.check(api_.group_start(), "ncclGroupStart", l);
    std::size_t at = 0;
    for (const P2pBlock& b : g.sends)
      api_.check(api_.send(g.device + at, b.bytes, ncclInt8, b.peer, lane.comm, lane.stream), "ncclSend", l),
          at += b.bytes;
    for (const P2pBlock& b : g.receives)
      api_.check(api_.recv(g.device + at, b.bytes, ncclInt8, b.peer, lane.comm, lane.stream), "ncclRecv", l),
          at += b.bytes;
    api_.check(api_.group_end(), "ncclGroupEnd", l);
    g.state = Group::State::issued;
  }

  void enqueue_return(Lane& lane, Group& g, int l) {
    if (g.receive_bytes)
      check_cuda(cudaMemcpyAsync(g.staging.data + g.send_bytes, g.device + g.send_bytes, g.receive_bytes,
                                 cudaMemcpyDeviceToHost, lane.stream),
                 "cudaMemcpyAsync (receives to the host)", l);
    check_cuda(cudaFreeAsync(g.device, lane.stream), "cudaFreeAsync", l);
    g.device = nullptr;
    if (lane.events.empty()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", l);
      lane.events.push_back(e);
    }
    g.done = lane.events.back();
    lane.events.pop_back();
    check_cuda(cudaEventRecord(g.done, lane.stream), "cudaEventRecord", l);
    g.state = Group::State::enqueued;
  }

  void wait_ready(int l, Clock::time_point deadline, const char* what) {
    ncclResult_t state = ncclInProgress;
    while (true) {
      api_.check(api_.async_error(lanes_[std::size_t(l)].comm, &state), "ncclCommGetAsyncError", l);
      api_.check(state, what, l);
      if (state == ncclSuccess) return;
      if (Clock::now() > deadline)
        MOED_THROW(Runtime, "NCCL lane {}: {} not done by the deadline ([comm].timeout_ms)", l, what);
    }
  }

  // NCCL connects a pair of ranks on their first send and receive: one byte
  // each way between every pair on every lane, at start, so that no step's
  // group waits for a connection.
  void connect_every_peer(int rank, int size, Clock::time_point deadline) {
    std::vector<std::byte> out(std::size_t(size), std::byte{1}), in(std::size_t(size) * lanes_.size());
    std::vector<std::uint64_t> tickets(lanes_.size(), 0);
    for (std::size_t l = 0; l < lanes_.size(); ++l) {
      std::vector<P2pBlock> sends, receives;
      for (int p = 0; p < size; ++p)
        if (p != rank) sends.push_back({p, &out[std::size_t(p)], 1}),
                       receives.push_back({p, &in[l * std::size_t(size) + std::size_t(p)], 1});
      if (!sends.empty()) tickets[l] = launch(int(l), sends, receives);
    }
    for (std::size_t l = 0; l < lanes_.size(); ++l)
      while (tickets[l] && !complete(int(l), tickets[l]))
        if (Clock::now() > deadline)
          MOED_THROW(Runtime, "NCCL lane {}: connecting to every peer not done by the deadline "
                     "([comm].timeout_ms): {}", l, describe(int(l)));
  }

  const NcclApi& api_;
  const int device_;
  std::vector<Lane> lanes_;
  bool aborted_ = false;
};

// Where live migration's windows go: a host transport the ranks agree on.
std::unique_ptr<Transport> host_transport_for_windows(const CommConfig& config, Bootstrap& bootstrap) {
  const bool ucx = !ucx_unavailable(config, bootstrap);
  if (!bootstrap.all_max(ucx ? 0 : 1, "whether UCX carries the nccl transport's windows"))
    return create_ucx_transport(config, bootstrap);
  const bool mpi = !mpi_unavailable(config, bootstrap);
  if (!bootstrap.all_max(mpi ? 0 : 1, "whether MPI carries the nccl transport's windows"))
    return create_mpi_transport(config, bootstrap);
  return nullptr;
}

}  // namespace

bool nccl_transport_built() { return true; }

std::unique_ptr<Transport> create_nccl_transport(const CommConfig& config, Bootstrap& bootstrap) {
  auto groups = std::make_unique<CudaNcclGroups>(config, bootstrap);
  return create_nccl_transport_over(bootstrap.rank(), bootstrap.size(), std::chrono::milliseconds(config.timeout_ms),
                                    std::move(groups), host_transport_for_windows(config, bootstrap));
}

}  // namespace moed::comm
