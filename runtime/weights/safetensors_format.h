// What the safetensors reader and writer share: the dtypes moed loads, their
// conversions, and the pieces of the file layout both sides spell the same.
//
// File layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON header, then the
// data region. The header maps each tensor name to {"dtype", "shape", "data_offsets"}
// (offsets relative to the data region) and may hold a "__metadata__" string map.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moed::weights {

// The dtypes moed loads.
enum class DType { F32, BF16 };

const char* dtype_name(DType dtype);  // "F32", "BF16"
// "F32"/"BF16" (also "f32"/"bf16"); nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);
// Bytes per element.
std::uint64_t element_size(DType dtype);

// Bytes per element of a dtype as safetensors headers spell it ("F32", "BF16",
// "F8_E4M3", "U8", "I8", ...), nullopt for one whose size moed does not know. The
// reader checks every such tensor's byte span against it, the writer the bytes it
// is given to store as they are (SafetensorsWriter::add_raw).
std::optional<std::uint64_t> stored_dtype_size(std::string_view dtype);

float bf16_to_f32(std::uint16_t bits);
// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow becomes inf.
std::uint16_t f32_to_bf16(float value);

// The header key of the metadata string map (never a tensor's name).
inline constexpr const char* kMetadataKey = "__metadata__";

// Product of the dims, or nullopt when it does not fit in 64 bits.
std::optional<std::uint64_t> checked_numel(const std::vector<std::int64_t>& shape);
// "[2, 3]", for messages.
std::string shape_str(const std::vector<std::int64_t>& shape);

}  // namespace moed::weights
