#include "runtime/weights/safetensors_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"

namespace moed::weights {

// Tensor data and the header length are written as the host holds them: the file is
// little-endian.
static_assert(std::endian::native == std::endian::little, "moed assumes a little-endian host");

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::add(const std::string& name, DType dtype,
                            const std::vector<std::int64_t>& shape, const float* data) {
  MOED_CHECK(!name.empty() && name != kMetadataKey, "bad tensor name '{}'", name);
  MOED_CHECK(names_.insert(name).second, "tensor '{}' added twice", name);
  MOED_CHECK(std::all_of(shape.begin(), shape.end(), [](std::int64_t d) { return d >= 0; }),
             "tensor '{}' has negative dims {}", name, shape_str(shape));
  auto numel = checked_numel(shape);
  MOED_CHECK(numel && *numel <= std::numeric_limits<std::size_t>::max() / 4,
             "tensor '{}' shape {} too large", name, shape_str(shape));
  MOED_CHECK(data || *numel == 0, "tensor '{}' has no data", name);

  Entry entry{name, dtype, shape, std::vector<std::byte>(*numel * element_size(dtype))};
  if (dtype == DType::F32) {
    if (*numel) std::memcpy(entry.bytes.data(), data, entry.bytes.size());
  } else {
    for (std::uint64_t i = 0; i < *numel; ++i) {
      std::uint16_t bits = f32_to_bf16(data[i]);
      std::memcpy(entry.bytes.data() + 2 * i, &bits, 2);
    }
  }
  entries_.push_back(std::move(entry));
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
    header[e.name] = {{"dtype", dtype_name(e.dtype)},
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
