// Reading safetensors checkpoints (layout: safetensors_format.h), memory-mapped and
// validated up front; writing them is safetensors_writer.h.
// Every defect of a file is reported as an Input error naming the file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "runtime/weights/safetensors_format.h"

namespace moed::weights {

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
  // The dtype the header gives tensor `name` ("F8_E4M3", "BF16", ...); nullopt if absent.
  std::optional<std::string> dtype_of(const std::string& name) const;

  // Copies the tensor, converted to fp32, into out (numel floats). Checks that it
  // exists, that its dtype is `expected` and that its shape equals `expected_shape`.
  // With count >= 0, only entries [first, first + count) of its leading
  // dimension (one expert of a fused [experts, ...] tensor).
  void read_f32(const std::string& name, DType expected, const std::vector<std::int64_t>& expected_shape,
                float* out, std::int64_t first = 0, std::int64_t count = -1) const;
  // Copies the tensor's bytes as stored, unconverted, into out (numel elements of
  // expected_dtype's size): the quantized formats (fp8 weights, MXFP4 blocks and scales)
  // the kernels decode themselves. Checks as read_f32 does, the dtype being the header's
  // string, e.g. "F8_E4M3", "U8" (one whose size moed knows: stored_dtype_size).
  void read_raw(const std::string& name, std::string_view expected_dtype,
                const std::vector<std::int64_t>& expected_shape, std::byte* out, std::int64_t first = 0,
                std::int64_t count = -1) const;

 private:
  void parse_header();
  // The tensor `name`; an Input error naming the file when there is none.
  const TensorInfo& tensor(const std::string& name) const;
  // The stored bytes of `info` (elements of `element_size` bytes), entries [first,
  // first + count) of its leading dimension when count >= 0, after checking that its
  // shape is `expected_shape`: what read_f32 and read_raw copy out.
  std::span<const std::byte> slice(const TensorInfo& info, const std::vector<std::int64_t>& expected_shape,
                                   std::uint64_t element_size, std::int64_t first, std::int64_t count) const;

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
  // The file holding tensor `name` (the shard, with an index); the checkpoint's path if unknown.
  const std::string& file_of(const std::string& name) const;
  // The tensor's header dtype (opening its shard); nullopt when the checkpoint has no such tensor.
  std::optional<std::string> dtype_of(const std::string& name) const;
  // SafetensorsFile's, on the shard holding the tensor.
  void read_f32(const std::string& name, DType expected, const std::vector<std::int64_t>& expected_shape,
                float* out, std::int64_t first = 0, std::int64_t count = -1) const;
  void read_raw(const std::string& name, std::string_view expected_dtype,
                const std::vector<std::int64_t>& expected_shape, std::byte* out, std::int64_t first = 0,
                std::int64_t count = -1) const;
  const std::string& path() const { return path_; }

 private:
  void load_index(const std::string& index_path);
  const SafetensorsFile& shard(const std::string& shard_path) const;
  // The shard holding tensor `name`, opened; an Input error when the weight map has no
  // such tensor or the shard it names lacks it.
  const SafetensorsFile& file_holding(const std::string& name) const;

  std::string path_;    // as given
  std::string source_;  // the .safetensors file or index.json actually used
  std::map<std::string, std::string> weight_map_;  // tensor name -> shard path
  // Shards opened so far; the mutex (boxed so Checkpoint stays movable) guards the
  // map, the files themselves are immutable once opened.
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

}  // namespace moed::weights
