#include "comm/survivor_agreement.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <string_view>

#include "comm/idle_backoff.h"
#include "comm/membership_wire.h"
#include "comm/peer_messenger.h"
#include "common/error.h"

namespace moed::comm {

SurvivorAgreement::SurvivorAgreement(PeerMessenger& messenger, View current, std::chrono::milliseconds round,
                                     bool spare, Now now)
    : messenger_(messenger),
      membership_(messenger.rank(), std::move(current), spare),
      round_(round),
      now_(std::move(now)),
      epoch_seen_(membership_.view().epoch) {}

void SurvivorAgreement::carry(const std::vector<MembershipMessage>& messages) {
  for (const MembershipMessage& message : messages) {
    const std::string bytes = encode(message);
    messenger_.post(message.to, std::as_bytes(std::span(bytes.data(), bytes.size())));
  }
  track_rounds();
}

bool SurvivorAgreement::leading() const {
  return membership_.agreeing() && membership_.leader() == messenger_.rank();
}

std::chrono::milliseconds SurvivorAgreement::patience() const { return leading() ? round_ : 2 * round_; }

void SurvivorAgreement::track_rounds() {
  const bool agreeing = membership_.agreeing();
  const int awaited = agreeing ? membership_.leader() : -1;
  if ((agreeing && !was_agreeing_) || awaited != awaited_leader_ || membership_.view().epoch != epoch_seen_)
    round_deadline_ = now_() + patience();
  was_agreeing_ = agreeing;
  awaited_leader_ = awaited;
  epoch_seen_ = membership_.view().epoch;
}

void SurvivorAgreement::suspect(int rank) { carry(membership_.suspect(rank)); }

bool SurvivorAgreement::admit(const std::vector<int>& ranks) {
  carry(membership_.admit(ranks));
  return membership_.agreeing();
}

bool SurvivorAgreement::poll() {
  for (int lost : messenger_.take_lost_peers()) {
    lost_.insert(lost);
    suspect(lost);
  }
  while (std::optional<PeerMessage> arrived = messenger_.poll()) {
    try {
      const MembershipMessage message = decode_membership_message(
          std::string_view(reinterpret_cast<const char*>(arrived->bytes.data()), arrived->bytes.size()),
          messenger_.size());
      if (message.from != arrived->from)
        MOED_THROW(Input, "it names rank {} as its sender", message.from);
      carry(membership_.receive(message));
    } catch (const Error& e) {
      ++dropped_;
      spdlog::warn("rank {}: a membership message from rank {} was dropped: {}", messenger_.rank(), arrived->from,
                   e.what());
    }
  }
  if (membership_.agreeing() && now_() > round_deadline_) {
    round_deadline_ = now_() + patience();  // restarted by carry() where the timeout changes this rank's role
    carry(membership_.timeout());
  }
  return membership_.agreeing();
}

const View& SurvivorAgreement::agree(std::chrono::milliseconds limit) {
  const Clock::time_point give_up = Clock::now() + limit;
  IdleBackoff backoff;
  const std::uint64_t from_epoch = membership_.view().epoch;
  while (poll() && !membership_.fenced()) {
    if (Clock::now() > give_up)
      MOED_THROW(Runtime,
                 "rank {}: no agreement on the members after epoch {} within {} ms: members [{}], suspected [{}]; "
                 "fewer than a majority answer, and only a restart brings the job back",
                 messenger_.rank(), from_epoch, limit.count(), fmt::join(membership_.view().members, " "),
                 fmt::join(membership_.suspected(), " "));
    backoff.idle();
  }
  return membership_.view();
}

}  // namespace moed::comm
