#include "client/ucx_am.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>
#include <utility>

namespace moed::netio {

namespace {

constexpr unsigned kFrameMessage = 17;  // the active message id every frame travels under

void check(ucs_status_t status, const char* call) {
  if (status != UCS_OK) throw UcxError(call, status);
}

// UCX 1.13 (Debian 12's) keys its asynchronous event handlers by file
// descriptor, process-wide, and queues an event that came while its worker
// was busy ("missed") by that key alone. A worker that closes a socket with
// such an event queued leaves the key behind until its next progress
// drains the queue. If another worker of the process registers a socket
// that reuses the number meanwhile, the first one's progress finds the
// other's handler, and UCX aborts ("Assertion `handler->async == async'";
// fixed upstream in 2024, openucx/ucx#9942). Every client link is a worker
// of its own, and a client failing over closes and opens sockets on several
// at once: the front-door tests aborted so, once in many runs. So a worker
// registers sockets (creating itself, an endpoint or a listener) alone, and
// progresses and closes under the shared side of this lock, draining the
// queue after a close (of an endpoint or a listener): a number it frees is
// out of its queue before any worker here can take it. (A listener's
// accepts register from UCX's own thread, outside the lock: a process with
// a listener and other workers, the daemon's door, keeps that window.)
//
// Writers first: glibc's default read-write lock lets a stream of progress
// calls keep a connect waiting; this one holds new readers back once a
// registration waits. No thread takes it twice.
class RegistrationLock {
 public:
  RegistrationLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  RegistrationLock(const RegistrationLock&) = delete;
  RegistrationLock& operator=(const RegistrationLock&) = delete;
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

RegistrationLock& socket_registration() {
  static RegistrationLock lock;  // never destroyed before the workers: static, and its destructor does nothing
  return lock;
}

}  // namespace

UcxError::UcxError(const std::string& call, ucs_status_t status)
    : std::runtime_error(call + ": " + ucs_status_string(status)), status_(status) {}

std::string SocketAddress::text() const {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (storage.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (storage.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

SocketAddress resolve(const std::string& host_port) {
  const std::size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon + 1 == host_port.size())
    throw std::runtime_error("\"" + host_port + "\" is not HOST:PORT");
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) > 65535)
    throw std::runtime_error("\"" + host_port + "\": the port must be a number from 0 to 65535");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  SocketAddress out;
  if (host == "*") {
    auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(std::uint16_t(std::stoi(port)));
    out.length = sizeof(sockaddr_in);
    return out;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int r = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); r != 0 || !found)
    throw std::runtime_error("cannot resolve \"" + host + "\": " + ::gai_strerror(r));
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

struct AmWorker::Impl {
  Place place;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  struct Listener {
    Impl* impl;
    ucp_listener_h handle = nullptr;
  };
  std::vector<std::unique_ptr<Listener>> listeners;
  int efd = -1;
  std::unordered_set<ucp_ep_h> open;    // endpoints whose events are still wanted
  std::unordered_set<ucp_ep_h> failed;  // open endpoints UCX reported an error on
  std::deque<Event> events;
  std::vector<void*> closing;         // ucp_ep_close_nbx requests
  std::size_t sends = 0, receives = 0;

  struct SendOp {
    Impl* impl;
    ucp_ep_h ep;
    std::vector<std::byte> header;  // UCX reads it until the send completes
    std::shared_ptr<void> keep;
  };
  struct ReceiveOp {
    Impl* impl;
    ucp_ep_h ep;
    wire::Frame frame;
    std::size_t bytes;
    std::shared_ptr<void> keep;
  };

  void lost(ucp_ep_h ep, const std::string& why) {
    if (!open.count(ep)) return;
    Event e;
    e.kind = Event::Kind::lost, e.ep = ep, e.error = why;
    events.push_back(std::move(e));
  }
  void arrived(ucp_ep_h ep, wire::Frame frame, bool ok, std::size_t bytes, std::string error = {}) {
    if (!open.count(ep)) return;
    Event e;
    e.ep = ep, e.frame = std::move(frame), e.data_ok = ok, e.data_bytes = bytes, e.error = std::move(error);
    events.push_back(std::move(e));
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* impl = static_cast<Impl*>(arg);
    if (impl->open.count(ep)) impl->failed.insert(ep);
    impl->lost(ep, ucs_status_string(status));
  }
  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* listener = static_cast<Listener*>(arg);
    Event e;
    e.kind = Event::Kind::connection, e.request = request, e.listener = listener->handle;
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      std::memcpy(&e.peer.storage, &attr.client_address, sizeof attr.client_address);
      e.peer.length = attr.client_address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    }
    listener->impl->events.push_back(std::move(e));
  }
  static void on_sent(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    if (status != UCS_OK && status != UCS_ERR_CANCELED) op->impl->lost(op->ep, ucs_status_string(status));
    --op->impl->sends;
    delete op;
    ucp_request_free(request);
  }
  static void on_received(void* request, ucs_status_t status, std::size_t, void* user_data) {
    auto* op = static_cast<ReceiveOp*>(user_data);
    op->impl->arrived(op->ep, std::move(op->frame), status == UCS_OK, op->bytes);
    --op->impl->receives;
    delete op;
    ucp_request_free(request);
  }
  static ucs_status_t on_message(void* arg, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<Impl*>(arg)->message(header, header_length, data, length, param);
  }

  ucs_status_t message(const void* header, std::size_t header_length, void* data, std::size_t length,
                       const ucp_am_recv_param_t* param) {
    // Only our own peers send with a reply endpoint; anything else is dropped.
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
    ucp_ep_h ep = param->reply_ep;
    if (!open.count(ep)) return UCS_OK;
    std::string error;
    auto frame = wire::decode_frame({static_cast<const std::byte*>(header), header_length}, error);
    if (!frame) {
      arrived(ep, {}, false, length, "a message that is not a moed frame: " + error);
      return UCS_OK;
    }
    if (length == 0) {
      arrived(ep, std::move(*frame), true, 0);
      return UCS_OK;
    }
    Placement to = place(ep, *frame, length);
    if (!to.at) {
      arrived(ep, std::move(*frame), false, length, std::move(to.refusal));
      return UCS_OK;  // UCX drops the data (rendezvous data is never fetched)
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      std::memcpy(to.at, data, length);
      arrived(ep, std::move(*frame), true, length);
      return UCS_OK;
    }
    auto* op = new ReceiveOp{this, ep, std::move(*frame), length, std::move(to.keep)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv_am = &on_received;
    p.user_data = op;
    ++receives;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker, data, to.at, length, &p);
    if (UCS_PTR_IS_ERR(r)) {
      --receives;
      arrived(ep, std::move(op->frame), false, length, ucs_status_string(UCS_PTR_STATUS(r)));
      delete op;
    }
    return UCS_OK;
  }

  ucp_ep_h create_endpoint(ucp_ep_params_t& params) {
    std::unique_lock registering(socket_registration());
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &on_ep_error;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    check(ucp_ep_create(worker, &params, &ep), "ucp_ep_create");
    open.insert(ep);
    return ep;
  }

  void destroy_listeners() {
    for (auto& l : listeners) ucp_listener_destroy(l->handle);
    listeners.clear();
  }

  void reap_closes() {
    std::erase_if(closing, [](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      return true;
    });
  }
};

AmWorker::AmWorker(const std::string& name, const std::string& transports, Place place)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.place = std::move(place);
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucs_status_t status = UCS_OK;
  if (!transports.empty()) status = ucp_config_modify(config, "TLS", transports.c_str());
  // Eager sends, unless UCX_RNDV_THRESH says otherwise: over TCP, UCX's
  // rendezvous made an upload and a download on one connection take turns,
  // so two micro-batches in flight gained nothing (tests/bench/
  // front_door_network.sh). Eager data is copied once out of UCX's buffer.
  if (status == UCS_OK && !std::getenv("UCX_RNDV_THRESH")) status = ucp_config_modify(config, "RNDV_THRESH", "inf");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = name.c_str();
  std::unique_lock registering(socket_registration());
  if (status == UCS_OK) status = ucp_init(&params, config, &m.context);
  ucp_config_release(config);
  check(status, transports.empty() ? "ucp_init" : ("ucp_init (UCX_TLS " + transports + ")").c_str());
  try {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(m.context, &wp, &m.worker), "ucp_worker_create");
    check(ucp_worker_get_efd(m.worker, &m.efd), "ucp_worker_get_efd");
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = kFrameMessage;
    h.cb = &Impl::on_message;
    h.arg = &m;
    check(ucp_worker_set_am_recv_handler(m.worker, &h), "ucp_worker_set_am_recv_handler");
  } catch (...) {
    if (m.worker) ucp_worker_destroy(m.worker);
    ucp_cleanup(m.context);
    throw;
  }
}

AmWorker::~AmWorker() {
  Impl& m = *impl_;
  for (ucp_ep_h ep : std::vector<ucp_ep_h>(m.open.begin(), m.open.end())) close(ep, false);
  std::shared_lock progressing(socket_registration());
  m.destroy_listeners();  // the progress below drains their queued events
  // Forced closes end every send and receive (cancelled); their callbacks free them.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while ((!m.closing.empty() || m.sends || m.receives) && std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(m.worker);
    m.reap_closes();
  }
  // Forced closes end at once, unless the peer is going away meanwhile: a
  // close UCX has not finished then is let go (the worker releases it with
  // the endpoint), so that a client failing over does not wait on it.
  for (void* r : m.closing) ucp_request_free(r);

  ucp_worker_destroy(m.worker);
  ucp_cleanup(m.context);
}

int AmWorker::listen(const SocketAddress& address) {
  Impl& m = *impl_;
  std::unique_lock registering(socket_registration());
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.storage);
  p.sockaddr.addrlen = address.length;
  auto listener = std::make_unique<Impl::Listener>(Impl::Listener{&m});
  p.conn_handler.cb = &Impl::on_connection;
  p.conn_handler.arg = listener.get();
  check(ucp_listener_create(m.worker, &p, &listener->handle), ("ucp_listener_create on " + address.text()).c_str());
  m.listeners.push_back(std::move(listener));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  check(ucp_listener_query(m.listeners.back()->handle, &attr), "ucp_listener_query");
  if (attr.sockaddr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
}

void AmWorker::stop_listening() {
  std::shared_lock progressing(socket_registration());
  impl_->destroy_listeners();
  ucp_worker_progress(impl_->worker);  // drains the events queued for the sockets it closed
}

ucp_ep_h AmWorker::accept(ucp_conn_request_h request) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = request;
  return impl_->create_endpoint(p);
}

void AmWorker::reject(const Event& connection) { ucp_listener_reject(connection.listener, connection.request); }

ucp_ep_h AmWorker::connect(const SocketAddress& address) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.storage);
  p.sockaddr.addrlen = address.length;
  return impl_->create_endpoint(p);
}

void AmWorker::close(ucp_ep_h ep, bool flush) {
  Impl& m = *impl_;
  if (!m.open.erase(ep)) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  std::shared_lock progressing(socket_registration());
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  ucp_worker_progress(m.worker);  // drains the events queued for the sockets it closed
  const bool peer_gone = m.failed.erase(ep) > 0;
  if (!r || UCS_PTR_IS_ERR(r)) return;
  // Closing an endpoint whose peer is gone can wait on a disconnect that
  // never comes: let UCX finish it alone (released with the worker at last).
  if (peer_gone)
    ucp_request_free(r);
  else
    m.closing.push_back(r);
}

void AmWorker::send(ucp_ep_h ep, std::vector<std::byte> frame, const void* data, std::size_t bytes,
                    std::shared_ptr<void> keep) {
  Impl& m = *impl_;
  if (!m.open.count(ep)) return;
  auto* op = new Impl::SendOp{&m, ep, std::move(frame), std::move(keep)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  p.cb.send = &Impl::on_sent;
  p.user_data = op;
  ++m.sends;
  std::shared_lock progressing(socket_registration());
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, kFrameMessage, op->header.data(), op->header.size(), data, bytes, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {  // done at once (no callback), or failed
    --m.sends;
    if (UCS_PTR_IS_ERR(r)) m.lost(ep, ucs_status_string(UCS_PTR_STATUS(r)));
    delete op;
  }
}

bool AmWorker::progress() {
  Impl& m = *impl_;
  bool any = false;
  std::shared_lock progressing(socket_registration());
  while (ucp_worker_progress(m.worker) != 0) any = true;
  m.reap_closes();
  return any || !m.events.empty();
}

std::deque<Event> AmWorker::take_events() { return std::exchange(impl_->events, {}); }

void AmWorker::wait(int timeout_ms) {
  if (!arm()) return;  // something to progress already
  pollfd p{impl_->efd, POLLIN, 0};
  while (::poll(&p, 1, timeout_ms) < 0 && errno == EINTR) {
  }
}

void AmWorker::signal() { ucp_worker_signal(impl_->worker); }

bool AmWorker::arm() {
  if (!impl_->events.empty()) return false;
  std::shared_lock progressing(socket_registration());
  const ucs_status_t armed = ucp_worker_arm(impl_->worker);
  if (armed == UCS_ERR_BUSY) return false;
  check(armed, "ucp_worker_arm");
  return true;
}

int AmWorker::fd() const { return impl_->efd; }

std::size_t AmWorker::outstanding() const { return impl_->sends + impl_->receives + impl_->closing.size(); }
std::size_t AmWorker::endpoints() const { return impl_->open.size(); }

}  // namespace moed::netio
