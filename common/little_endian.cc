#include "common/little_endian.h"

#include <fmt/format.h>

#include "common/error.h"

namespace moed {

std::uint64_t LittleEndianReader::get(int n) {
  const auto count = static_cast<std::size_t>(n);
  if (count > remaining())
    MOED_THROW(Input, "{}: {} bytes long, a {}-byte field at byte {} runs past the end", what_, in_.size(), n, pos_);
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < count; ++i) v |= std::uint64_t{static_cast<unsigned char>(in_[pos_ + i])} << (8 * i);
  pos_ += count;
  return v;
}

}  // namespace moed
