#include "common/quote.h"

#include <fmt/format.h>

namespace moed {

namespace {

// Bytes of a valid UTF-8 sequence starting at text[i], or 0.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t n = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 && lead < 0xE0 ? 2 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// The escaped form of text's first bytes, up to max_bytes of input; `used`
// gets how many input bytes it covers.
std::string escape_prefix(std::string_view text, std::size_t max_bytes, std::size_t& used) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && i < max_bytes;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
    } else if (c >= 0x80) {
      const std::size_t n = utf8_length(text, i);
      if (n == 0) {
        out += fmt::format("\\x{:02X}", c);
      } else {
        out.append(text.substr(i, n));
        i += n;
        continue;
      }
    } else {
      out += char(c);
    }
    ++i;
  }
  used = i;
  return out;
}

}  // namespace

std::string sanitize_input(std::string_view text, std::size_t max_bytes) {
  std::size_t used = 0;
  std::string out = escape_prefix(text, max_bytes, used);
  if (used < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

std::string quote_input(std::string_view text, std::size_t max_bytes) {
  std::size_t used = 0;
  const std::string inner = escape_prefix(text, max_bytes, used);
  if (used < text.size()) return fmt::format("\"{}...\" ({} bytes)", inner, text.size());
  return "\"" + inner + "\"";
}

}  // namespace moed
