// Writing a safetensors checkpoint (layout: safetensors_format.h) from fp32 data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/weights/safetensors_format.h"

namespace moed::weights {

// Builds a safetensors file from fp32 data, stored in the dtype asked for, and writes it
// atomically (common/atomic_file.h). Tensors are laid out in add() order, the data region
// 8-byte aligned.
class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  void add(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape,
           const float* data);
  // An output path that cannot be created is an Input error naming it.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;  // already converted to dtype
  };
  std::string header() const;  // JSON, space-padded so the data region is 8-byte aligned

  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
  std::set<std::string> names_;
};

}  // namespace moed::weights
