#include "comm/ucx/ucx_messenger.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <deque>
#include <list>
#include <utility>

#include "comm/transport.h"
#include "comm/ucx/ucx_core.h"

namespace moed::comm {

namespace {

// Receives kept posted: messages that land while all are full wait in UCX's
// unexpected queue until one is re-posted.
constexpr std::size_t kPostedReceives = 4;
// Sends UCX still holds; more means a peer takes none of them for long.
constexpr std::size_t kMaxPendingSends = 4096;

class UcxMessenger final : public PeerMessenger {
 public:
  explicit UcxMessenger(std::shared_ptr<ucx::Core> core) : core_(std::move(core)) {
    for (Slot& slot : slots_) {
      slot.owner = this;
      slot.buffer.resize(kPeerMessageMaxBytes);
      post_receive(slot);
    }
  }
  ~UcxMessenger() override {
    // Receives: cancelled (one already matched completes as its data lands);
    // sends: waited for. Both at most kCancelGrace, as an exchange's teardown.
    for (Slot& slot : slots_)
      if (slot.request && !slot.done) ucp_request_cancel(core_->worker(), slot.request);
    const auto busy = [&] {
      reap_sends();
      return !sends_.empty() ||
             std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.request && !s.done; });
    };
    const auto until = ucx::Clock::now() + kCancelGrace;
    IdleBackoff backoff;
    while (busy() && ucx::Clock::now() < until) {
      if (core_->progress() != 0)
        backoff.reset();
      else
        backoff.idle();
    }
    for (Slot& slot : slots_)
      if (slot.request) ucp_request_free(slot.request);
    // A send UCX still holds past the grace keeps its buffer: the job is
    // ending, and freeing it would let UCX read released memory.
    for (Send& send : sends_) {
      ucp_request_free(send.request);
      static_cast<void>(send.bytes.release());
    }
  }
  UcxMessenger(const UcxMessenger&) = delete;
  UcxMessenger& operator=(const UcxMessenger&) = delete;

  int rank() const override { return core_->world_rank(); }
  int size() const override { return core_->world_size(); }

  void post(int dest, std::span<const std::byte> bytes) override {
    MOED_CHECK(dest >= 0 && dest < size() && dest != rank(), "peer message from rank {} to rank {} of {}", rank(), dest,
               size());
    MOED_CHECK(bytes.size() <= kPeerMessageMaxBytes, "peer message of {} bytes, at most {}", bytes.size(),
               kPeerMessageMaxBytes);
    reap_sends();
    if (core_->lost(dest)) return;
    if (sends_.size() >= kMaxPendingSends)
      MOED_THROW(Runtime, "rank {}: {} peer messages not yet taken by their ranks; the peers are not progressing",
                 rank(), sends_.size());
    auto copy = std::make_unique<std::byte[]>(std::max<std::size_t>(bytes.size(), 1));
    std::copy(bytes.begin(), bytes.end(), copy.get());
    ucp_request_param_t param{};
    ucs_status_ptr_t result =
        ucp_tag_send_nbx(core_->message_endpoint(dest), copy.get(), bytes.size(), ucx::peer_message_tag(rank()), &param);
    if (UCS_PTR_IS_ERR(result)) return lose(dest, UCS_PTR_STATUS(result), "sending a peer message");
    if (result) sends_.push_back(Send{dest, std::move(copy), result});
  }

  std::optional<PeerMessage> poll() override {
    core_->progress();
    reap_sends();
    while (!completed_.empty()) {
      Slot& slot = *completed_.front();
      completed_.pop_front();
      std::optional<PeerMessage> message = take(slot);
      post_receive(slot);
      if (message) return message;
    }
    return std::nullopt;
  }

  std::vector<int> take_lost_peers() override { return core_->take_lost_peers(); }

 private:
  struct Slot {
    UcxMessenger* owner = nullptr;
    std::vector<std::byte> buffer;
    void* request = nullptr;
    bool done = false;
    ucs_status_t status = UCS_OK;
    std::size_t length = 0;
    ucp_tag_t tag = 0;
  };
  struct Send {
    int dest;
    std::unique_ptr<std::byte[]> bytes;
    void* request;
  };

  void post_receive(Slot& slot) {
    if (slot.request) ucp_request_free(std::exchange(slot.request, nullptr));
    slot.done = false;
    ucp_request_param_t param{};
    // No immediate completion, as in the exchanges: the callback reports the
    // sender's tag and the length.
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = on_receive;
    param.user_data = &slot;
    slot.request = ucx::check_request(ucp_tag_recv_nbx(core_->worker(), slot.buffer.data(), slot.buffer.size(),
                                                       ucx::kPeerMessageBit, ucx::kPeerMessageBit, &param),
                                      "ucp_tag_recv_nbx", "a peer message");
  }

  static void on_receive(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
    Slot& slot = *static_cast<Slot*>(user_data);
    slot.done = true;
    slot.status = status;
    slot.length = info ? info->length : 0;
    slot.tag = info ? info->sender_tag : 0;
    if (status != UCS_ERR_CANCELED) slot.owner->completed_.push_back(&slot);
  }

  // The message a completed receive holds; nullopt (with a warning) for one
  // that failed or came truncated.
  std::optional<PeerMessage> take(const Slot& slot) const {
    const int from = ucx::tag_sender(slot.tag);
    if (slot.status != UCS_OK || from >= size()) {
      spdlog::warn("rank {}: a peer message from rank {} was dropped: {}", rank(), from,
                   slot.status == UCS_ERR_MESSAGE_TRUNCATED
                       ? fmt::format("longer than {} bytes", kPeerMessageMaxBytes)
                       : std::string(ucs_status_string(slot.status)));
      return std::nullopt;
    }
    return PeerMessage{from, std::vector<std::byte>(slot.buffer.begin(), slot.buffer.begin() + std::ptrdiff_t(slot.length))};
  }

  void reap_sends() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      const ucs_status_t status = ucp_request_check_status(it->request);
      if (status == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(it->request);
      if (status != UCS_OK) lose(it->dest, status, "a peer message");
      it = sends_.erase(it);
    }
  }

  void lose(int peer, ucs_status_t status, const char* what) {
    if (!core_->lost(peer))
      spdlog::warn("rank {}: {} to rank {} failed ({}); rank {} is taken as lost", rank(), what, peer,
                   ucs_status_string(status), peer);
    core_->mark_lost(peer);
  }

  std::shared_ptr<ucx::Core> core_;  // declared first: the worker outlives the requests
  std::array<Slot, kPostedReceives> slots_;
  std::deque<Slot*> completed_;  // receives completed and not yet taken, in completion order
  std::list<Send> sends_;
};

}  // namespace

std::unique_ptr<PeerMessenger> make_ucx_messenger(std::shared_ptr<ucx::Core> core) {
  return std::make_unique<UcxMessenger>(std::move(core));
}

}  // namespace moed::comm
