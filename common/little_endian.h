// Little-endian byte strings whatever the host, one byte at a time: the
// stats file and the messages ranks send each other are read back on any
// machine. The reader refuses to read past its end (an Input error naming
// what was read), so a short or cut message is an error, not a wild read.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moed {

class LittleEndianWriter {
 public:
  explicit LittleEndianWriter(std::size_t reserve = 0) { out_.reserve(reserve); }
  void u8(std::uint8_t v) { put(v, 1); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i32(std::int32_t v) { put(std::bit_cast<std::uint32_t>(v), 4); }
  void f64(double v) { put(std::bit_cast<std::uint64_t>(v), 8); }
  void bytes(std::string_view s) { out_ += s; }
  std::string& str() { return out_; }

 private:
  void put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

class LittleEndianReader {
 public:
  // `what` names the bytes in errors ("membership message").
  explicit LittleEndianReader(std::string_view in, std::string_view what = "bytes") : in_(in), what_(what) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(get(1)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::uint64_t u64() { return get(8); }
  std::int32_t i32() { return std::bit_cast<std::int32_t>(u32()); }
  double f64() { return std::bit_cast<double>(get(8)); }
  std::size_t remaining() const { return in_.size() - pos_; }

 private:
  std::uint64_t get(int n);
  std::string_view in_;
  std::string what_;
  std::size_t pos_ = 0;
};

}  // namespace moed
