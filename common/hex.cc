#include "common/hex.h"

#include "common/error.h"

namespace moed {

namespace {

int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (std::byte b : bytes) out += kDigits[int(b) >> 4], out += kDigits[int(b) & 15];
  return out;
}

std::vector<std::byte> from_hex(std::string_view text, std::string_view what) {
  if (text.size() % 2) MOED_THROW(Runtime, "{}: an odd number of hex digits", what);
  std::vector<std::byte> out(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) MOED_THROW(Runtime, "{}: \"{}\" is not lowercase hex", what, text.substr(2 * i, 2));
    out[i] = std::byte(hi << 4 | lo);
  }
  return out;
}

}  // namespace moed
