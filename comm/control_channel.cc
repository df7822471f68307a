#include "comm/control_channel.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "common/error.h"

namespace moed::comm {

ControlChannel::ControlChannel(std::unique_ptr<ControlLink> link) : link_(std::move(link)) {}

void ControlChannel::set_progress(std::function<void()> progress) {
  progress_ = std::move(progress);
  if (link_) link_->set_progress(progress_);
}

void ControlChannel::use(std::unique_ptr<ControlLink> link) {
  if (!link_ && link) {  // the first link of a channel made without one
    link_ = std::move(link);
    link_->set_progress(progress_);
    return;
  }
  MOED_CHECK(link != nullptr && link_ != nullptr && link->rank() == link_->rank() && link->size() <= link_->size(),
             "control link {} for rank {} of {}: this channel is rank {} of {}", link ? link->name() : "(none)",
             link ? link->rank() : -1, link ? link->size() : -1, link_ ? link_->rank() : -1, link_ ? link_->size() : -1);
  link_ = std::move(link);
  link_->set_progress(progress_);
}

void ControlChannel::broadcast_text(std::string& text, const std::string& what) {
  constexpr std::size_t kBlock = 256, kInline = kBlock - sizeof(std::uint64_t);
  std::array<char, kBlock> block{};
  std::uint64_t size = rank() == 0 ? text.size() : 0;
  if (rank() == 0) {
    std::memcpy(block.data(), &size, sizeof size);
    std::memcpy(block.data() + sizeof size, text.data(), std::min<std::size_t>(text.size(), kInline));
  }
  broadcast(block.data(), kBlock, what);
  std::memcpy(&size, block.data(), sizeof size);
  if (rank() != 0) text.assign(block.data() + sizeof size, std::min<std::size_t>(size, kInline));
  if (size <= kInline) return;
  text.resize(size);
  broadcast(text.data() + kInline, size - kInline, what);
}

}  // namespace moed::comm
