#include "runtime/weights/safetensors_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"

namespace moed::weights {

// Tensor data and the header length are written as the host holds them: the file is
// little-endian.
static_assert(std::endian::native == std::endian::little, "moed assumes a little-endian host");

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

SafetensorsWriter::Entry SafetensorsWriter::make_entry(const std::string& name, std::string dtype,
                                                       const std::vector<std::int64_t>& shape,
                                                       std::uint64_t element_size) const {
  MOED_CHECK(!name.empty() && name != kMetadataKey, "bad tensor name '{}'", name);
  MOED_CHECK(!names_.count(name), "tensor '{}' added twice", name);
  MOED_CHECK(std::all_of(shape.begin(), shape.end(), [](std::int64_t d) { return d >= 0; }),
             "tensor '{}' has negative dims {}", name, shape_str(shape));
  auto numel = checked_numel(shape);
  MOED_CHECK(numel && *numel <= std::numeric_limits<std::size_t>::max() / element_size,
             "tensor '{}' shape {} too large", name, shape_str(shape));
  return Entry{name, std::move(dtype), shape, std::vector<std::byte>(*numel * element_size)};
}

void SafetensorsWriter::keep(Entry entry) {
  names_.insert(entry.name);
  entries_.push_back(std::move(entry));
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape,
                            const float* data) {
  Entry entry = make_entry(name, dtype_name(dtype), shape, element_size(dtype));
  const std::size_t numel = entry.bytes.size() / element_size(dtype);
  MOED_CHECK(data || numel == 0, "tensor '{}' has no data", name);
  if (dtype == DType::F32) {
    if (numel) std::memcpy(entry.bytes.data(), data, entry.bytes.size());
  } else {
    for (std::size_t i = 0; i < numel; ++i) {
      std::uint16_t bits = f32_to_bf16(data[i]);
      std::memcpy(entry.bytes.data() + 2 * i, &bits, 2);
    }
  }
  keep(std::move(entry));
}

void SafetensorsWriter::add_raw(const std::string& name, std::string_view dtype, const std::vector<std::int64_t>& shape,
                                const void* bytes, std::size_t size) {
  // Only a dtype the reader knows the size of: it checks each tensor's span against it.
  const auto element = stored_dtype_size(dtype);
  MOED_CHECK(element.has_value(), "tensor '{}': dtype {} is not one moed stores", name, dtype);
  Entry entry = make_entry(name, std::string(dtype), shape, *element);
  MOED_CHECK(size == entry.bytes.size(), "tensor '{}': {} bytes for shape {} of {}, expected {}", name, size,
             shape_str(shape), dtype, entry.bytes.size());
  MOED_CHECK(bytes || size == 0, "tensor '{}' has no data", name);
  if (size) std::memcpy(entry.bytes.data(), bytes, size);
  keep(std::move(entry));
}

std::string SafetensorsWriter::header() const {
  // ordered_json keeps the header in add() order, which is also the data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    auto& meta = header[kMetadataKey] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata_) meta[key] = value;
  }
  std::uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not UTF-8
    MOED_THROW(Internal, "cannot encode the safetensors header: {}", e.what());
  }
  // The data region starts at 8 + N; trailing spaces are valid JSON padding.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string text = header();
  // The tensors go out one by one: a checkpoint need not fit in memory twice.
  AtomicFileWriter out(path, ErrorKind::Input);
  const std::uint64_t header_len = text.size();
  out.append(&header_len, 8);
  out.append(text);
  for (const Entry& e : entries_) out.append(e.bytes.data(), e.bytes.size());
  out.commit();
}

}  // namespace moed::weights
