#include "comm/ucx/ucx_core.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "comm/bootstrap.h"
#include "comm/transport.h"

namespace moed::comm::ucx {

Core::Core(Bootstrap& bootstrap, std::chrono::milliseconds timeout, bool detect_lost_peers, int join_slots)
    : bootstrap_(bootstrap),
      world_rank_(bootstrap.rank()),
      world_size_(bootstrap.size() + join_slots),
      rank_(world_rank_),
      timeout_(timeout),
      lost_(std::size_t(world_size_), 0),
      reported_lost_(std::size_t(world_size_), 0) {
  if (world_size_ >= (1 << kRankBits))
    MOED_THROW(Runtime, "UCX transport: {} ranks exceed the {} the message tags can name", world_size_,
               1 << kRankBits);
  for (int r = 0; r < world_size_; ++r) members_.push_back(r);

  std::string error;
  std::optional<ucx::WorkerAddress> address;
  try {
    // Elastic serving must outlive a peer: no transport that reads or writes
    // its memory directly (comm/ucx/ucx_handles.h).
    std::string tls;
    if (detect_lost_peers) {
      const char* set = std::getenv("UCX_TLS");
      tls = ucx::tls_without_peer_memory_access(set ? set : "");
      if (tls.empty())
        MOED_THROW(Usage, "UCX_TLS={} leaves no transport once cma, which reads a peer's memory, "
                   "is left out for [comm].detect_lost_peers", set);
    }
    context_ = ucx::make_context(std::size_t(world_size_), tls);
    worker_ = ucx::make_worker(context_.get());
    address.emplace(worker_.get());
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "start");

  addresses_ = bootstrap_.all_gather(address->bytes(), "UCX transport: the worker addresses");
  try {
    if (addresses_.size() > std::size_t(world_size_))
      MOED_THROW(Runtime, "{} worker addresses for {} world ranks", addresses_.size(), world_size_);
    addresses_.resize(std::size_t(world_size_));  // the join slots no process holds yet
    peer_handles_.reserve(std::size_t(world_size_));
    for (int peer = 0; peer < world_size_; ++peer) peer_handles_.push_back({this, peer});
    endpoints_.resize(std::size_t(world_size_));
    if (detect_lost_peers) watch_endpoints_.resize(std::size_t(world_size_));
    for (int peer = 0; peer < world_size_; ++peer)
      if (peer != world_rank_ && !addresses_[std::size_t(peer)].empty()) connect_endpoints(peer);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "connect");
}

void Core::connect_endpoints(int peer) {
  const std::vector<std::byte>& address = addresses_[std::size_t(peer)];
  endpoints_[std::size_t(peer)] = ucx::Endpoint(worker_.get(), address);
  if (!watch_endpoints_.empty())
    watch_endpoints_[std::size_t(peer)] =
        ucx::Endpoint(worker_.get(), address, on_endpoint_error, &peer_handles_[std::size_t(peer)]);
}

void Core::connect(int world_rank, std::span<const std::byte> address) {
  const char* why = world_rank < 0 || world_rank >= world_size_ || world_rank == world_rank_ ? "not a peer"
                    : endpoints_[std::size_t(world_rank)]                                     ? "reached already"
                    : address.empty()                                                        ? "no address"
                                                                                             : nullptr;
  if (why)
    MOED_THROW(Runtime, "UCX transport on world rank {}: cannot connect world rank {} of {}: {}", world_rank_,
               world_rank, world_size_, why);
  addresses_[std::size_t(world_rank)].assign(address.begin(), address.end());
  connect_endpoints(world_rank);
}

std::string Core::name(int rank) const {
  if (!without_some()) return fmt::format("rank {}", rank);
  return fmt::format("rank {} (world {})", rank, world_rank(rank));
}

void Core::continue_with(const std::vector<int>& world_members, std::uint64_t epoch) {
  MOED_CHECK(std::is_sorted(world_members.begin(), world_members.end()) &&
                 std::adjacent_find(world_members.begin(), world_members.end()) == world_members.end() &&
                 !world_members.empty() && world_members.front() >= 0 && world_members.back() < world_size_,
             "UCX transport: the members [{}] are not ascending world ranks", fmt::join(world_members, " "));
  const auto me = std::find(world_members.begin(), world_members.end(), world_rank_);
  MOED_CHECK(me != world_members.end(), "UCX transport: world rank {} goes on without itself", world_rank_);
  MOED_CHECK(epoch > epoch_, "UCX transport: epoch {} after epoch {}", epoch, epoch_);
  for (int member : world_members)
    if (member != world_rank_ && !endpoints_[std::size_t(member)])
      MOED_THROW(Runtime, "UCX transport on world rank {}: epoch {} has world rank {}, which this rank never "
                 "reached (it joined without this rank learning its address)", world_rank_, epoch, member);
  MOED_CHECK(open_ == 0, "UCX transport: {} exchanges or windows of epoch {} still open", open_, epoch_);
  // A member the endpoints found lost after the agreement decided: the
  // caller suspects it and agrees again (the transport stays as it was).
  std::vector<int> gone;
  for (int member : world_members)
    if (lost(member)) gone.push_back(member);
  if (!gone.empty())
    throw PeersUnreachable(gone,
                           fmt::format("UCX transport: world rank {} was to go on as epoch {} with world rank(s) [{}], "
                                       "lost since",
                                       world_rank_, epoch, fmt::join(gone, " ")),
                           __FILE__, __LINE__);
  members_ = world_members;
  rank_ = int(me - world_members.begin());
  const std::uint64_t previous = epoch_;
  epoch_ = epoch;
  next_sequence_ = 0;
  discard_stale_messages();
  // A peer's rendezvous whose message this rank dropped now completes; one
  // still on its way is dropped as it comes. Sends to ranks left out are
  // not waited for: a rank fenced may never read them.
  const auto unsettled_members = [&] {
    std::vector<int> peers;
    for (const auto& sends : abandoned_)
      for (int peer : sends->unsettled())
        if (std::binary_search(members_.begin(), members_.end(), peer)) peers.push_back(peer);
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    return peers;
  };
  progress_until(
      [&] {
        discard_stale_messages(previous);
        return unsettled_members().empty();
      },
      deadline(),
      [&] {
        const std::vector<int> peers = unsettled_members();
        throw PeersUnreachable(peers,
                               fmt::format("UCX transport on world rank {}: epoch {}: sends of an exchange cut short "
                                           "to world ranks [{}] did not complete within {} ms ([comm].timeout_ms)",
                                           world_rank_, epoch_, fmt::join(peers, ", "), timeout_.count()),
                               __FILE__, __LINE__);
      },
      /*hook=*/false);  // the caller's hook would see the agreement it is acting on
  // Receives still matched to a stalled sender keep their set, and the memory.
  std::erase_if(abandoned_, [](const auto& set) { return set->receiving_into() == 0; });
  if (!abandoned_.empty()) {
    std::size_t bytes = 0;
    for (const auto& set : abandoned_) bytes += set->receiving_into();
    spdlog::warn("UCX transport on world rank {}: epoch {}: {} exchanges cut short still have receives matched to a "
                 "sender that stalled mid-message; their {} bytes are kept until the data comes (or for good)",
                 world_rank_, epoch_, abandoned_.size(), bytes);
  }
  failed_ = false;  // the loss is behind: the members' exchanges and windows tear down together again
}

void Core::abandon(std::unique_ptr<AbandonedSends> sends) { abandoned_.push_back(std::move(sends)); }

void Core::keep_window_memory(std::unique_ptr<MappedMemory> memory) {
  std::size_t bytes = memory->bytes();
  for (const auto& kept : kept_windows_) bytes += kept->bytes();
  spdlog::warn("UCX transport on world rank {}: a window torn down without its peers keeps its {} bytes (a peer's "
               "puts may still arrive); {} bytes of such windows are kept in all",
               world_rank_, memory->bytes(), bytes);
  kept_windows_.push_back(std::move(memory));
}

void Core::discard_stale_messages(std::optional<std::uint64_t> only) {
  std::size_t discarded = 0;
  const auto discard_epoch = [&](std::uint64_t epoch) {
    const ucp_tag_t stale = exchange_tag(epoch, 0, 0);  // the epoch's bits alone
    ucp_tag_recv_info_t info{};
    while (ucp_tag_message_h message = ucp_tag_probe_nb(worker_.get(), stale, kPeerMessageBit | kEpochMask, 1, &info)) {
      // Received into nothing: UCX ends it as truncated without fetching its
      // data (a rendezvous sender is told, and its send completes).
      ucp_request_param_t param{};
      ucs_status_ptr_t result = ucp_tag_msg_recv_nbx(worker_.get(), nullptr, 0, message, &param);
      if (UCS_PTR_IS_ERR(result) && UCS_PTR_STATUS(result) != UCS_ERR_MESSAGE_TRUNCATED)
        ucx::throw_ucs("ucp_tag_msg_recv_nbx", UCS_PTR_STATUS(result), "discarding a stale message");
      if (!UCS_PTR_IS_ERR(result)) {
        ucx::Request request(result);
        const auto until = Clock::now() + std::chrono::seconds(1);
        while (!request.done() && Clock::now() < until) progress();
      }
      ++discarded;
    }
  };
  if (only) {
    discard_epoch(*only);
  } else {
    const ucp_tag_t current = exchange_tag(epoch_, 0, 0);
    for (std::uint64_t e = 0; e < (std::uint64_t{1} << kEpochBits); ++e)
      if (exchange_tag(e, 0, 0) != current) discard_epoch(e);
  }
  if (discarded)
    spdlog::info("UCX transport on world rank {}: epoch {}: discarded {} messages of exchanges cut short", world_rank_,
                 epoch_, discarded);
}

void Core::on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  const auto& handle = *static_cast<const PeerHandle*>(arg);
  if (!handle.core->lost(handle.peer))
    spdlog::warn("UCX transport on rank {}: the endpoint to rank {} failed ({}); rank {} is taken as lost",
                 handle.core->world_rank_, handle.peer, ucs_status_string(status), handle.peer);
  handle.core->mark_lost(handle.peer);
}

void Core::mark_lost(int world_rank) {
  if (lost_[std::size_t(world_rank)]) return;
  lost_[std::size_t(world_rank)] = 1;
  ++lost_count_;
  failed_ = true;
}

std::vector<int> Core::take_lost_peers() {
  std::vector<int> peers;
  for (int peer = 0; peer < world_size_; ++peer)
    if (lost_[std::size_t(peer)] && !reported_lost_[std::size_t(peer)]) {
      reported_lost_[std::size_t(peer)] = 1;
      peers.push_back(peer);
    }
  return peers;
}

void Core::agree(const std::string& local_error, const char* step) {
  const bool failed_somewhere =
      bootstrap_.all_max(local_error.empty() ? 0 : 1, fmt::format("UCX transport: whether every rank could {}", step));
  if (!failed_somewhere) return;
  failed_ = true;
  if (!local_error.empty()) MOED_THROW(Runtime, "UCX transport on rank {}: {}", world_rank_, local_error);
  MOED_THROW(Runtime, "UCX transport: failed to {} on another rank (see its error)", step);
}

bool Core::progressing_barrier(const char* what) {
  try {
    bootstrap_.barrier(fmt::format("UCX transport: {}", what), [this] { progress(); });
    return true;
  } catch (const Error&) {
    spdlog::warn("UCX transport: {}: not every rank arrived within {} ms; closing without them",
                 what, timeout_.count());
    failed_ = true;
    return false;
  }
}

void Core::close_endpoints() {
  std::vector<ucx::Request> closing;
  for (auto* endpoints : {&watch_endpoints_, &endpoints_})
    for (auto& endpoint : *endpoints)
      if (endpoint) closing.push_back(endpoint.start_close());
  const auto all_closed = [&] {
    for (const auto& request : closing)
      if (!request.done()) return false;
    return true;
  };
  try {
    progress_until(
        all_closed, deadline(),
        [&] { MOED_THROW(Runtime, "closing UCX endpoints took over {} ms", timeout_.count()); }, /*hook=*/false);
  } catch (const Error& e) {
    spdlog::warn("UCX transport: {}", e.what());
  }
}

Core::~Core() {
  // Graceful teardown, all ranks together: once every rank is here no more
  // data is in flight; close the endpoints (each close flushes and tells the
  // peer); and wait again so that no worker is destroyed while a peer still
  // needs it to finish closing. After a failure, or once a rank was lost
  // (the bootstrap's barriers include it), skip the peers: an endpoint
  // still open is released by the worker's destruction.
  try {
    if (!failed() && !without_some() && progressing_barrier("teardown")) {
      close_endpoints();
      progressing_barrier("teardown after closing endpoints");
    }
  } catch (const std::exception& e) {
    spdlog::warn("UCX transport teardown: {}", e.what());
  }
}

}  // namespace moed::comm::ucx
