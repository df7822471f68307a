// Bytes as lowercase hex text, for the few binary values that travel in
// JSON (worker addresses, nonces, proofs).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moed {

std::string to_hex(std::span<const std::byte> bytes);
// Throws a Runtime error naming `what` unless `text` is lowercase hex digits in pairs.
std::vector<std::byte> from_hex(std::string_view text, std::string_view what);

}  // namespace moed
