#include "runtime/weights/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "common/error.h"

namespace moed::weights {

// Tensor data is copied out of the mapping as-is: the file is little-endian.
static_assert(std::endian::native == std::endian::little, "moed assumes a little-endian host");

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSupported = "F32, BF16";

// A JSON value for an error message, cut short so a hostile header cannot flood the log.
std::string brief(const json& value) {
  std::string s = value.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Bytes per element of the dtypes whose size is known; nullopt for the others.
std::optional<std::uint64_t> dtype_size(std::string_view dtype) {
  if (auto size = stored_dtype_size(dtype)) return size;
  if (auto d = parse_dtype(dtype)) return element_size(*d);  // lower-case spellings
  return std::nullopt;
}

// One element of "shape" or "data_offsets": a JSON integer in [0, max].
std::uint64_t header_uint(const std::string& path, const std::string& name, const char* field,
                          std::size_t index, const json& value, std::uint64_t max) {
  if (!value.is_number_integer())
    MOED_THROW(Input, "{}: tensor '{}': {}[{}] is {}, expected a non-negative integer", path, name,
               field, index, brief(value));
  if (!value.is_number_unsigned())
    MOED_THROW(Input, "{}: tensor '{}': {}[{}] is {}, expected a non-negative integer", path, name,
               field, index, value.get<std::int64_t>());
  auto v = value.get<std::uint64_t>();
  if (v > max)
    MOED_THROW(Input, "{}: tensor '{}': {}[{}] is {}, expected at most {}", path, name, field, index,
               v, max);
  return v;
}

const json& header_field(const std::string& path, const std::string& name, const json& entry,
                         const char* field, const char* expected) {
  auto it = entry.find(field);
  if (it == entry.end())
    MOED_THROW(Input, "{}: tensor '{}' has no \"{}\" in the header, expected {}", path, name, field,
               expected);
  return *it;
}

// Validates one header entry on its own; data_size is the size of the data region.
TensorInfo parse_entry(const std::string& path, const std::string& name, const json& entry,
                       std::uint64_t data_start, std::uint64_t data_size) {
  if (!entry.is_object())
    MOED_THROW(Input, "{}: tensor '{}': header entry is {}, expected an object with dtype, shape "
               "and data_offsets", path, name, brief(entry));
  TensorInfo info;
  info.name = name;

  const json& dtype = header_field(path, name, entry, "dtype", "a string such as \"F32\"");
  if (!dtype.is_string())
    MOED_THROW(Input, "{}: tensor '{}': dtype is {}, expected a string such as \"F32\"", path, name,
               brief(dtype));
  info.dtype = dtype.get<std::string>();

  const json& shape = header_field(path, name, entry, "shape", "an array of integers");
  if (!shape.is_array())
    MOED_THROW(Input, "{}: tensor '{}': shape is {}, expected an array of integers", path, name,
               brief(shape));
  constexpr auto kMaxDim = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < shape.size(); ++i)
    info.shape.push_back(
        static_cast<std::int64_t>(header_uint(path, name, "shape", i, shape[i], kMaxDim)));
  auto numel = checked_numel(info.shape);
  if (!numel)
    MOED_THROW(Input, "{}: tensor '{}': shape {} has more elements than fit in 64 bits", path, name,
               shape_str(info.shape));

  const json& offsets = header_field(path, name, entry, "data_offsets", "[begin, end]");
  if (!offsets.is_array() || offsets.size() != 2)
    MOED_THROW(Input, "{}: tensor '{}': data_offsets is {}, expected [begin, end]", path, name,
               brief(offsets));
  constexpr auto kMaxOffset = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t begin = header_uint(path, name, "data_offsets", 0, offsets[0], kMaxOffset);
  std::uint64_t end = header_uint(path, name, "data_offsets", 1, offsets[1], kMaxOffset);
  if (begin > end)
    MOED_THROW(Input, "{}: tensor '{}': data_offsets [{}, {}] has begin after end, expected begin <= "
               "end", path, name, begin, end);
  if (end > data_size)
    MOED_THROW(Input, "{}: tensor '{}': data_offsets [{}, {}] ends beyond the data region of {} "
               "bytes (file truncated?)", path, name, begin, end, data_size);

  if (auto size = dtype_size(info.dtype)) {
    std::uint64_t bytes = 0;
    if (__builtin_mul_overflow(*numel, *size, &bytes))
      MOED_THROW(Input, "{}: tensor '{}': shape {} of {} needs more bytes than fit in 64 bits",
                 path, name, shape_str(info.shape), info.dtype);
    if (end - begin != bytes)
      MOED_THROW(Input, "{}: tensor '{}': data_offsets [{}, {}] span {} bytes, expected {} ({} "
                 "elements of {} at {} bytes)", path, name, begin, end, end - begin, bytes, *numel,
                 info.dtype, *size);
  }
  info.begin = data_start + begin;
  info.end = data_start + end;
  return info;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& value) {
  if (!value.is_object())
    MOED_THROW(Input, "{}: {} is {}, expected an object of strings", path, kMetadataKey,
               brief(value));
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string())
      MOED_THROW(Input, "{}: {} key '{}' is {}, expected a string", path, kMetadataKey, key,
                 brief(v));
    out.emplace(key, v.get<std::string>());
  }
  return out;
}

// Tensors may leave gaps between them but must not share bytes.
void check_no_overlap(const std::string& path, const std::map<std::string, TensorInfo>& tensors) {
  std::vector<const TensorInfo*> sorted;
  for (const auto& [name, info] : tensors)
    if (info.end > info.begin) sorted.push_back(&info);  // empty tensors occupy nothing
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  const TensorInfo* furthest = nullptr;  // the tensor reaching furthest so far
  for (const TensorInfo* t : sorted) {
    if (furthest && t->begin < furthest->end)
      MOED_THROW(Input, "{}: tensors '{}' and '{}' overlap in the data region (file bytes [{}, {}) "
                 "and [{}, {})), expected disjoint data_offsets", path, furthest->name, t->name,
                 furthest->begin, furthest->end, t->begin, t->end);
    if (!furthest || t->end > furthest->end) furthest = t;
  }
}

// JSON text, with every key of an object required to be unique: nlohmann::json keeps
// the last of two equal keys, so a header naming a tensor twice would load whichever
// entry came last without a word. `top_key` names what the top object's keys are.
json parse_json(const std::string& path, const char* what, const char* top_key, const std::byte* data,
                std::size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  struct Open {
    std::string key;  // the key this object is the value of ("" at the top)
    std::set<std::string> seen;
  };
  std::vector<Open> open;
  std::string last_key;
  auto unique_keys = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open.push_back({std::exchange(last_key, {}), {}});
        break;
      case json::parse_event_t::object_end:
        open.pop_back();
        break;
      case json::parse_event_t::key: {
        last_key = parsed.get<std::string>();
        if (open.back().seen.insert(last_key).second) break;
        if (open.size() == 1)
          MOED_THROW(Input, "{}: {} '{}' appears twice in {}, expected each once (the second entry "
                     "would silently replace the first)", path, top_key, last_key, what);
        MOED_THROW(Input, "{}: {} has the key '{}' twice in '{}', expected each key once", path, what,
                   last_key, open.back().key);
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, text + size, unique_keys);
  } catch (const json::exception& e) {
    MOED_THROW(Input, "{}: {} is not valid JSON: {}", path, what, e.what());
  }
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The file a directory checkpoint stands for: model.safetensors.index.json, else its only
// *.safetensors.index.json, else its only *.safetensors.
std::string resolve_directory(const std::string& dir) {
  fs::path preferred = fs::path(dir) / "model.safetensors.index.json";
  if (fs::is_regular_file(preferred)) return preferred.string();
  std::vector<std::string> indexes, files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    std::string name = entry.path().filename().string();
    if (ends_with(name, ".safetensors.index.json")) indexes.push_back(name);
    if (ends_with(name, ".safetensors")) files.push_back(name);
  }
  if (ec) MOED_THROW(Input, "{}: cannot list the checkpoint directory: {}", dir, ec.message());
  std::sort(indexes.begin(), indexes.end());
  std::sort(files.begin(), files.end());
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  if (indexes.size() == 1) return (fs::path(dir) / indexes[0]).string();
  if (indexes.size() > 1)
    MOED_THROW(Input, "{}: several index files ({}), expected one or model.safetensors.index.json",
               dir, list(indexes));
  if (files.size() == 1) return (fs::path(dir) / files[0]).string();
  if (files.empty())
    MOED_THROW(Input, "{}: no checkpoint in this directory, expected model.safetensors.index.json "
               "or a single *.safetensors file", dir);
  MOED_THROW(Input, "{}: several .safetensors files ({}) but no model.safetensors.index.json to "
             "say which tensor is where, expected one file or an index", dir, list(files));
}

}  // namespace

// ---- SafetensorsFile ----------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) { parse_header(); }

void SafetensorsFile::parse_header() {
  const std::string& p = path();
  const std::uint64_t size = file_.size();
  if (size < 8)
    MOED_THROW(Input, "{}: file is {} bytes, too short for a safetensors file (expected an 8-byte "
               "header length, then the header)", p, size);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > size - 8)
    MOED_THROW(Input, "{}: header length {} exceeds the {} bytes after the length field (file "
               "truncated or not a safetensors file)", p, header_len, size - 8);

  json header = parse_json(p, "the header", "tensor", file_.data() + 8, static_cast<std::size_t>(header_len));
  if (!header.is_object())
    MOED_THROW(Input, "{}: header is a JSON {}, expected an object mapping tensor names to entries",
               p, header.type_name());

  const std::uint64_t data_start = 8 + header_len;
  const std::uint64_t data_size = size - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey)
      metadata_ = parse_metadata(p, entry);
    else
      tensors_.emplace(name, parse_entry(p, name, entry, data_start, data_size));
  }
  check_no_overlap(p, tensors_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);  // std::map: already sorted
  return out;
}

std::optional<std::string> SafetensorsFile::dtype_of(const std::string& name) const {
  const TensorInfo* info = find(name);
  return info ? std::optional<std::string>(info->dtype) : std::nullopt;
}

const TensorInfo& SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) MOED_THROW(Input, "{}: no tensor named '{}'", path(), name);
  return *info;
}

std::span<const std::byte> SafetensorsFile::slice(const TensorInfo& info,
                                                  const std::vector<std::int64_t>& expected_shape,
                                                  std::uint64_t element_size, std::int64_t first,
                                                  std::int64_t count) const {
  if (info.shape != expected_shape)
    MOED_THROW(Input, "{}: tensor '{}' has shape {}, expected {}", path(), info.name, shape_str(info.shape),
               shape_str(expected_shape));

  // The header check already guarantees this; repeated as the last guard before the copy.
  const std::uint64_t numel = *checked_numel(info.shape);
  MOED_CHECK(info.end - info.begin == numel * element_size && info.end <= file_.size(), "{}: tensor '{}' byte range",
             path(), info.name);
  const std::byte* src = file_.data() + info.begin;
  std::uint64_t wanted = numel;
  if (count >= 0) {  // entries [first, first + count) of the leading dimension
    const std::int64_t lead = info.shape.empty() ? 1 : info.shape[0];
    MOED_CHECK(first >= 0 && first + count <= lead, "{}: tensor '{}': entries [{}, {}) of {}", path(), info.name, first,
               first + count, lead);
    const std::uint64_t per = lead ? numel / std::uint64_t(lead) : 0;
    src += std::uint64_t(first) * per * element_size;
    wanted = std::uint64_t(count) * per;
  }
  return {src, static_cast<std::size_t>(wanted * element_size)};
}

void SafetensorsFile::read_f32(const std::string& name, DType expected, const std::vector<std::int64_t>& expected_shape,
                               float* out, std::int64_t first, std::int64_t count) const {
  const TensorInfo& info = tensor(name);
  // Only these two convert to fp32; the quantized dtypes are read_raw's, for the kernels.
  auto dtype = parse_dtype(info.dtype);
  if (!dtype)
    MOED_THROW(Input, "{}: tensor '{}' has dtype {}, which moed cannot convert to fp32 (supported dtypes: {}; "
               "expected {})", path(), name, info.dtype, kSupported, dtype_name(expected));
  if (*dtype != expected)
    MOED_THROW(Input, "{}: tensor '{}' has dtype {}, expected {}", path(), name, info.dtype, dtype_name(expected));
  const std::span<const std::byte> src = slice(info, expected_shape, element_size(*dtype), first, count);
  if (*dtype == DType::F32) {
    if (!src.empty()) std::memcpy(out, src.data(), src.size());  // src may be unaligned
    return;
  }
  for (std::size_t i = 0; i < src.size() / 2; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, src.data() + 2 * i, 2);
    out[i] = bf16_to_f32(bits);
  }
}

void SafetensorsFile::read_raw(const std::string& name, std::string_view expected_dtype,
                               const std::vector<std::int64_t>& expected_shape, std::byte* out, std::int64_t first,
                               std::int64_t count) const {
  // The caller names the dtype it decodes: one of unknown size is a bug, not the file's.
  const auto size = stored_dtype_size(expected_dtype);
  MOED_CHECK(size.has_value(), "read_raw of '{}' as {}: a dtype of unknown size", name, expected_dtype);
  const TensorInfo& info = tensor(name);
  // Compared as spelled: the bytes are handed on undecoded, so only the exact format will do.
  if (info.dtype != expected_dtype)
    MOED_THROW(Input, "{}: tensor '{}' has dtype {}, expected {}", path(), name, info.dtype, expected_dtype);
  const std::span<const std::byte> src = slice(info, expected_shape, *size, first, count);
  if (!src.empty()) std::memcpy(out, src.data(), src.size());
}

// ---- Checkpoint ---------------------------------------------------------------------------

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (!fs::exists(status)) MOED_THROW(Input, "{}: checkpoint path does not exist", path);
  source_ = fs::is_directory(status) ? resolve_directory(path) : path;
  if (ends_with(source_, ".json")) {
    load_index(source_);
    return;
  }
  // A single file: open it now, its header is the weight map.
  auto file = std::make_unique<SafetensorsFile>(source_);
  for (const auto& name : file->names()) weight_map_.emplace(name, source_);
  shards_.emplace(source_, std::move(file));
}

void Checkpoint::load_index(const std::string& index_path) {
  MappedFile file(index_path);
  json index = parse_json(index_path, "the index", "key", file.data(), file.size());
  if (!index.is_object())
    MOED_THROW(Input, "{}: index is a JSON {}, expected an object with a \"weight_map\"",
               index_path, index.type_name());
  auto it = index.find("weight_map");
  if (it == index.end())
    MOED_THROW(Input, "{}: index has no \"weight_map\", expected {{\"weight_map\": {{tensor name: "
               "shard file}}}}", index_path);
  if (!it->is_object())
    MOED_THROW(Input, "{}: \"weight_map\" is {}, expected an object of tensor name -> shard file",
               index_path, brief(*it));

  const fs::path dir = fs::path(index_path).parent_path();
  std::set<std::string> checked;
  for (const auto& [name, shard] : it->items()) {
    if (!shard.is_string() || shard.get<std::string>().empty())
      MOED_THROW(Input, "{}: weight_map entry for tensor '{}' is {}, expected a shard file name",
                 index_path, name, brief(shard));
    std::string shard_path = (dir / shard.get<std::string>()).string();
    // Only existence is checked here: the shard is opened and validated when first read.
    if (checked.insert(shard_path).second && !fs::is_regular_file(shard_path))
      MOED_THROW(Input, "{}: tensor '{}' is in shard {}, which does not exist", index_path, name,
                 shard_path);
    weight_map_.emplace(name, std::move(shard_path));
  }
}

bool Checkpoint::contains(const std::string& name) const { return weight_map_.count(name) > 0; }

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = weight_map_.find(name);
  return it == weight_map_.end() ? source_ : it->second;
}

const SafetensorsFile& Checkpoint::shard(const std::string& shard_path) const {
  std::lock_guard lock(*mutex_);
  auto& slot = shards_[shard_path];
  if (!slot) {
    try {
      slot = std::make_unique<SafetensorsFile>(shard_path);
    } catch (...) {
      shards_.erase(shard_path);  // leave no empty slot behind
      throw;
    }
  }
  return *slot;  // map nodes are stable: safe to use after the lock is released
}

const SafetensorsFile& Checkpoint::file_holding(const std::string& name) const {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) MOED_THROW(Input, "{}: no tensor named '{}'", source_, name);
  const SafetensorsFile& file = shard(it->second);
  if (!file.find(name))
    MOED_THROW(Input, "{}: no tensor named '{}' (the index {} says it is in this shard)",
               it->second, name, source_);
  return file;
}

std::optional<std::string> Checkpoint::dtype_of(const std::string& name) const {
  if (!contains(name)) return std::nullopt;
  // A shard that lacks what the index places in it stays an error, not an absent tensor.
  return file_holding(name).dtype_of(name);
}

void Checkpoint::read_f32(const std::string& name, DType expected, const std::vector<std::int64_t>& expected_shape,
                          float* out, std::int64_t first, std::int64_t count) const {
  file_holding(name).read_f32(name, expected, expected_shape, out, first, count);
}

void Checkpoint::read_raw(const std::string& name, std::string_view expected_dtype,
                          const std::vector<std::int64_t>& expected_shape, std::byte* out, std::int64_t first,
                          std::int64_t count) const {
  file_holding(name).read_raw(name, expected_dtype, expected_shape, out, first, count);
}

}  // namespace moed::weights
