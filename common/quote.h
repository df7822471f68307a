// User input shown in a message: quoted, with control and non-UTF-8 bytes
// escaped (a NUL byte no longer cuts the message, raw binary never reaches a
// terminal or a log), and cut to a bounded length (a 50 MB value is not
// printed whole, once per rank).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace moed {

inline constexpr std::size_t kQuoteMaxBytes = 80;

// "text" with \" \\ \n \t \xNN escapes; longer input is cut after max_bytes
// bytes and ends with ..." (N bytes).
std::string quote_input(std::string_view text, std::size_t max_bytes = kQuoteMaxBytes);
// The same escapes and cut, without the quotes: for names (a key, a
// section) that messages already frame.
std::string sanitize_input(std::string_view text, std::size_t max_bytes = kQuoteMaxBytes);

}  // namespace moed
