#include "comm/ucx/ucx_handles.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace moed::comm::ucx {

void throw_ucs(const char* call, ucs_status_t status, std::string_view detail) {
  if (detail.empty()) MOED_THROW(Runtime, "{}: {}", call, ucs_status_string(status));
  MOED_THROW(Runtime, "{} ({}): {}", call, detail, ucs_status_string(status));
}

bool connection_gone(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
      return true;
    default:
      return false;
  }
}

std::string tls_without_peer_memory_access(const std::string& tls) {
  // knem and xpmem read a peer's memory too, but Debian's UCX has neither,
  // and naming a transport UCX lacks makes it warn at every start.
  constexpr std::string_view kDirect = "cma";
  const bool excluding = !tls.empty() && tls.front() == '^';
  const bool everything = tls.empty() || tls == "all";
  std::vector<std::string_view> kept;
  std::string_view rest = everything ? std::string_view() : std::string_view(tls).substr(excluding ? 1 : 0);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (name.empty() || name == kDirect) continue;
    if (!excluding && (name == "sm" || name == "shm")) {
      kept.insert(kept.end(), {"posix", "sysv"});
    } else {
      kept.push_back(name);
    }
  }
  if (!excluding && !everything) return fmt::format("{}", fmt::join(kept, ","));
  kept.push_back(kDirect);  // everything, less what was excluded already, less cma
  return fmt::format("^{}", fmt::join(kept, ","));
}

Context make_context(std::size_t estimated_endpoints, const std::string& tls) {
  ucp_config_t* raw_config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &raw_config), "ucp_config_read");
  Config config(raw_config);
  if (!tls.empty()) check_ucs(ucp_config_modify(config.get(), "TLS", tls.c_str()), "ucp_config_modify(TLS)");

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
  params.estimated_num_eps = estimated_endpoints;
  params.mt_workers_shared = 0;
  params.name = "moed";
  ucp_context_h context = nullptr;
  check_ucs(ucp_init(&params, config.get(), &context), "ucp_init");
  return Context(context);
}

Worker make_worker(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  check_ucs(ucp_worker_create(context, &params, &worker), "ucp_worker_create");
  return Worker(worker);
}

WorkerAddress::WorkerAddress(ucp_worker_h worker) : worker_(worker) {
  check_ucs(ucp_worker_get_address(worker, &address_, &length_), "ucp_worker_get_address");
}

Endpoint::Endpoint(ucp_worker_h worker, std::span<const std::byte> remote_address, ucp_err_handler_cb_t on_error,
                   void* arg) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  params.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
  if (on_error) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = arg;
  }
  check_ucs(ucp_ep_create(worker, &params, &ep_), "ucp_ep_create");
}

Request Endpoint::start_close() {
  ucp_request_param_t param{};  // no FORCE flag: flush, then close
  return Request(
      check_request(ucp_ep_close_nbx(std::exchange(ep_, nullptr), &param), "ucp_ep_close_nbx"));
}

MappedMemory::MappedMemory(ucp_context_h context, std::size_t bytes)
    : context_(context), bytes_(bytes) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.length = bytes;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  check_ucs(ucp_mem_map(context, &params, &memh_), "ucp_mem_map");
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(memh_, &attr); s != UCS_OK) {
    ucp_mem_unmap(context_, memh_);
    throw_ucs("ucp_mem_query", s);
  }
  data_ = static_cast<std::byte*>(attr.address);
}

PackedRkey::PackedRkey(ucp_context_h context, const MappedMemory& memory) {
  void* buffer = nullptr;
  check_ucs(ucp_rkey_pack(context, memory.handle(), &buffer, &length_), "ucp_rkey_pack");
  buffer_.reset(buffer);
}

Rkey unpack_rkey(ucp_ep_h ep, std::span<const std::byte> packed) {
  ucp_rkey_h rkey = nullptr;
  check_ucs(ucp_ep_rkey_unpack(ep, packed.data(), &rkey), "ucp_ep_rkey_unpack");
  return Rkey(rkey);
}

}  // namespace moed::comm::ucx
