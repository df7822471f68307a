// Writing a safetensors checkpoint (layout: safetensors_format.h) from fp32 data, or
// from bytes already in the stored format (the quantized expert formats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/weights/safetensors_format.h"

namespace moed::weights {

// Builds a safetensors file from fp32 data, stored in the dtype asked for (add), or from
// bytes already in their stored dtype (add_raw), and writes it atomically
// (common/atomic_file.h). Tensors are laid out in add order, the data region 8-byte aligned.
class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  void add(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape,
           const float* data);
  // Stores `size` bytes as given under the header dtype `dtype` ("F8_E4M3", "U8", "I8",
  // ...: one whose size moed knows, stored_dtype_size); size must be the shape's
  // element count times that size.
  void add_raw(const std::string& name, std::string_view dtype, const std::vector<std::int64_t>& shape,
               const void* bytes, std::size_t size);
  // An output path that cannot be created is an Input error naming it.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::string dtype;  // as the header spells it
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;  // already converted to dtype
  };
  // A new tensor's entry, its name and shape checked, with room for its bytes at
  // `element_size` bytes an element; add() and add_raw() fill the bytes and keep it.
  Entry make_entry(const std::string& name, std::string dtype, const std::vector<std::int64_t>& shape,
                   std::uint64_t element_size) const;
  void keep(Entry entry);
  std::string header() const;  // JSON, space-padded so the data region is 8-byte aligned

  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
  std::set<std::string> names_;
};

}  // namespace moed::weights
