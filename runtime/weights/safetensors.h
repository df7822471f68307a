// Safetensors checkpoints: reading (memory-mapped, validated up front) and writing.
//
// File layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON header, then the
// data region. The header maps each tensor name to {"dtype", "shape", "data_offsets"}
// (offsets relative to the data region) and may hold a "__metadata__" string map.
// Every defect of a file is reported as an Input error naming the file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"

namespace moed::weights {

// The dtypes moed loads.
enum class DType { F32, BF16 };

const char* dtype_name(DType dtype);  // "F32", "BF16"
// "F32"/"BF16" (also "f32"/"bf16"); nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);

float bf16_to_f32(std::uint16_t bits);
// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow becomes inf.
std::uint16_t f32_to_bf16(float value);

struct TensorInfo {
  std::string name;
  std::string dtype;  // as written in the header, e.g. "F32", "F16"
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // absolute byte offsets in the file
};

// One .safetensors file, memory-mapped; the header is fully validated at construction.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  std::vector<std::string> names() const;                  // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies the tensor, converted to fp32, into out (numel floats). Checks that it
  // exists, that its dtype is `expected` and that its shape equals `expected_shape`.
  void read_f32(const std::string& name, DType expected,
                const std::vector<std::int64_t>& expected_shape, float* out) const;

 private:
  void parse_header();

  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a single .safetensors file, a Hugging Face "*.safetensors.index.json"
// (its "weight_map" names each tensor's shard, relative to the index's directory), or a
// directory holding one of those. Shards are opened only when a tensor of theirs is read,
// so each rank maps only the files holding its own tensors.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);

  bool contains(const std::string& name) const;
  void read_f32(const std::string& name, DType expected,
                const std::vector<std::int64_t>& expected_shape, float* out) const;
  const std::string& path() const { return path_; }

 private:
  void load_index(const std::string& index_path);
  const SafetensorsFile& shard(const std::string& shard_path) const;

  std::string path_;    // as given
  std::string source_;  // the .safetensors file or index.json actually used
  std::map<std::string, std::string> weight_map_;  // tensor name -> shard path
  // Shards opened so far; the mutex (boxed so Checkpoint stays movable) guards the
  // map, the files themselves are immutable once opened.
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

// Builds a safetensors file from fp32 data, stored in the dtype asked for, and writes it
// atomically (to "<path>.tmp.<pid>", fsync, rename). Tensors are laid out in add() order.
class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  void add(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape,
           const float* data);
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
