// RAII for UCX (ucp) objects, and error checking that names the call.
//
// Each handle releases its object in its destructor; declare them in the
// order they are created (context, worker, endpoints, memory, keys) so that
// members are released in the reverse order, as UCX requires.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace moed::comm::ucx {

// Throws a Runtime error "call: ucs_status_string(status)" (with `detail`
// appended when given).
[[noreturn]] void throw_ucs(const char* call, ucs_status_t status, std::string_view detail = {});

// Whether an operation failed because its peer's connection is gone (the
// process ended, the link broke, or the endpoint timed out), as opposed to
// a misuse or a disagreement on sizes. An operation can report this before
// the peer's watch endpoint does.
bool connection_gone(ucs_status_t status);

inline void check_ucs(ucs_status_t status, const char* call) {
  if (status != UCS_OK) throw_ucs(call, status);
}

// A non-blocking call's result: NULL (done at once), an error, or a request.
// Throws on an error; returns the request (or nullptr).
inline void* check_request(ucs_status_ptr_t result, const char* call,
                           std::string_view detail = {}) {
  if (UCS_PTR_IS_ERR(result)) throw_ucs(call, UCS_PTR_STATUS(result), detail);
  return result;
}

struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
struct ContextDeleter {
  void operator()(ucp_context_h c) const { ucp_cleanup(c); }
};
struct WorkerDeleter {
  void operator()(ucp_worker_h w) const { ucp_worker_destroy(w); }
};
struct RkeyDeleter {
  void operator()(ucp_rkey_h k) const { ucp_rkey_destroy(k); }
};
struct PackedRkeyDeleter {
  void operator()(void* buffer) const { ucp_rkey_buffer_release(buffer); }
};

using Config = std::unique_ptr<ucp_config_t, ConfigDeleter>;
using Context = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter>;
using Worker = std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerDeleter>;
using Rkey = std::unique_ptr<std::remove_pointer_t<ucp_rkey_h>, RkeyDeleter>;

// ucp_init with TAG and RMA, reading the UCX_* environment (UCX_TLS, ...).
// `tls`, when given, replaces UCX_TLS (see tls_without_peer_memory_access).
Context make_context(std::size_t estimated_endpoints, const std::string& tls = {});

// UCX_TLS's value (`tls`, empty when unset) less cma, the transport that
// reads and writes a peer process's memory directly (the shared-memory
// aliases sm and shm become posix,sysv). On an endpoint without error
// handling UCX 1.13 ends the process when such a transfer meets a peer that
// is gone (measured: every survivor of a rank killed with its blocks
// announced); elastic serving ([comm].detect_lost_peers) must outlive it. A
// rendezvous then moves its data in fragments through shared memory.
// knem and xpmem would need the same; Debian's UCX has neither. Pure,
// unit-tested.
std::string tls_without_peer_memory_access(const std::string& tls);
// One worker for a single thread.
Worker make_worker(ucp_context_h context);

// A request handle from a non-blocking call; ucp_request_free on release.
// Freeing does not cancel: the operation goes on inside UCX unreported.
class Request {
 public:
  Request() = default;
  explicit Request(void* request) : request_(request) {}
  ~Request() { reset(); }
  Request(Request&& o) noexcept : request_(std::exchange(o.request_, nullptr)) {}
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      reset();
      request_ = std::exchange(o.request_, nullptr);
    }
    return *this;
  }
  void* get() const { return request_; }
  // UCS_OK when there is no request (completed at once).
  ucs_status_t status() const { return request_ ? ucp_request_check_status(request_) : UCS_OK; }
  bool done() const { return status() != UCS_INPROGRESS; }
  void reset() {
    if (request_) ucp_request_free(std::exchange(request_, nullptr));
  }

 private:
  void* request_ = nullptr;
};

// This worker's address, to hand to peers (ucp_worker_release_address on release).
class WorkerAddress {
 public:
  explicit WorkerAddress(ucp_worker_h worker);
  ~WorkerAddress() { ucp_worker_release_address(worker_, address_); }
  WorkerAddress(const WorkerAddress&) = delete;
  WorkerAddress& operator=(const WorkerAddress&) = delete;
  std::span<const std::byte> bytes() const {
    return {reinterpret_cast<const std::byte*>(address_), length_};
  }

 private:
  ucp_worker_h worker_;
  ucp_address_t* address_ = nullptr;
  std::size_t length_ = 0;
};

// An endpoint to a peer's worker. Closing it gracefully needs both sides to
// progress (the transport orchestrates that at teardown, then marks it
// closed); one still open at destruction is left to ucp_worker_destroy,
// which releases it without talking to the peer (the failure path, where the
// peer may be stuck or gone).
class Endpoint {
 public:
  Endpoint() = default;
  // With `on_error`, the endpoint reports a lost peer (UCX's error handling
  // mode PEER): on_error(arg, ep, status) runs inside a progress call, and
  // operations on the endpoint fail from then on.
  Endpoint(ucp_worker_h worker, std::span<const std::byte> remote_address, ucp_err_handler_cb_t on_error = nullptr,
           void* arg = nullptr);
  Endpoint(Endpoint&& o) noexcept : ep_(std::exchange(o.ep_, nullptr)) {}
  Endpoint& operator=(Endpoint&& o) noexcept {
    ep_ = std::exchange(o.ep_, nullptr);
    return *this;
  }
  ucp_ep_h get() const { return ep_; }
  explicit operator bool() const { return ep_ != nullptr; }
  // Starts the graceful close (flushing outstanding operations); the handle
  // no longer owns the endpoint. The returned request completes when closed.
  Request start_close();

 private:
  ucp_ep_h ep_ = nullptr;
};

// Memory allocated and registered by ucp_mem_map (ucp_mem_unmap on release).
class MappedMemory {
 public:
  MappedMemory(ucp_context_h context, std::size_t bytes);
  ~MappedMemory() { ucp_mem_unmap(context_, memh_); }
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;
  ucp_mem_h handle() const { return memh_; }
  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  ucp_context_h context_;
  ucp_mem_h memh_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A packed remote key of mapped memory, to send to peers.
class PackedRkey {
 public:
  PackedRkey(ucp_context_h context, const MappedMemory& memory);
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(buffer_.get()), length_};
  }

 private:
  std::unique_ptr<void, PackedRkeyDeleter> buffer_;
  std::size_t length_ = 0;
};

// A peer's packed key, unpacked for the endpoint to that peer.
Rkey unpack_rkey(ucp_ep_h ep, std::span<const std::byte> packed);

}  // namespace moed::comm::ucx
