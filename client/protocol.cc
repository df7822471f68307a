#include "client/protocol.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace moed::wire {

namespace {

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kAlign = 64;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

// Little-endian fields in order (this project builds for x86-64 and other
// little-endian hosts only: the daemon refuses others at compile time).
static_assert(std::endian::native == std::endian::little, "moed's wire format assumes a little-endian host");

class Writer {
 public:
  explicit Writer(Type type) : out_(kHeaderBytes) { type_ = type; }
  template <class T>
  Writer& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof v);
    return *this;
  }
  Writer& put_bytes(const std::string& s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
    return *this;
  }
  std::vector<std::byte> finish() {
    const std::uint32_t length = std::uint32_t(out_.size() - kHeaderBytes), zero = 0;
    const std::uint16_t version = kVersion, type = std::uint16_t(type_);
    std::memcpy(out_.data(), &kMagic, 4);
    std::memcpy(out_.data() + 4, &version, 2);
    std::memcpy(out_.data() + 6, &type, 2);
    std::memcpy(out_.data() + 8, &length, 4);
    std::memcpy(out_.data() + 12, &zero, 4);
    return std::move(out_);
  }

 private:
  Type type_;
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <class T>
  T get() {
    T v{};
    if (at_ + sizeof v <= in_.size()) std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string get_bytes(std::size_t n) {
    std::string s;
    if (at_ + n <= in_.size()) s.assign(reinterpret_cast<const char*>(in_.data() + at_), n);
    at_ += n;
    return s;
  }
  // True when exactly the whole payload was read.
  bool whole(const char* what, std::string& error) const {
    if (at_ == in_.size()) return true;
    error = std::string(what) + " payload of " + std::to_string(in_.size()) + " bytes, expected " +
            std::to_string(at_);
    return false;
  }

 private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

bool known_dtype(std::uint32_t v) { return v <= std::uint32_t(DType::bf16); }
bool known_status(std::uint32_t v) { return v >= 1 && v <= std::uint32_t(Status::internal); }

}  // namespace

std::string to_string(Status status) {
  switch (status) {
    case Status::bad_request: return "bad_request";
    case Status::busy: return "busy";
    case Status::not_finite: return "not_finite";
    case Status::too_many_clients: return "too_many_clients";
    case Status::forbidden: return "forbidden";
    case Status::shutting_down: return "shutting_down";
    case Status::internal: return "internal";
  }
  return "unknown";
}

Layout make_layout(std::uint32_t hidden, std::uint32_t max_rows, std::uint32_t slots, bool staged) {
  Layout l;
  l.hidden = hidden, l.max_rows = max_rows, l.slots = slots;
  l.ids_offset = 0;
  l.positions_offset = round_up(std::uint64_t(max_rows) * 8, kAlign);
  l.rows_offset = l.positions_offset + round_up(std::uint64_t(max_rows) * 4, kAlign) +
                  (staged ? round_up(std::uint64_t(max_rows) * 12, kAlign) : 0);
  l.slot_bytes = round_up(l.rows_offset + std::uint64_t(max_rows) * hidden * 4, kPage);
  return l;
}

std::vector<std::byte> encode(const Hello& m) { return Writer(Type::hello).put(m.slots).put(m.max_rows).finish(); }

std::vector<std::byte> encode(const Welcome& m) {
  const Layout& l = m.layout;
  return Writer(Type::welcome)
      .put(m.rank).put(m.ranks).put(m.layers).put(l.hidden).put(l.max_rows).put(l.slots)
      .put(l.ids_offset).put(l.positions_offset).put(l.rows_offset).put(l.slot_bytes)
      .finish();
}

std::vector<std::byte> encode(const Submit& m) {
  return Writer(Type::submit).put(m.tag).put(m.slot).put(m.layer).put(m.rows).put(std::uint32_t(m.dtype)).finish();
}

std::vector<std::byte> encode(const Done& m) {
  return Writer(Type::done).put(m.tag).put(m.slot).put(m.rows).finish();
}

std::vector<std::byte> encode(const ErrorReply& m) {
  const std::string text = m.message.substr(0, kMaxPayload - 20);
  return Writer(Type::error)
      .put(m.tag).put(m.slot).put(std::uint32_t(m.status)).put(std::uint32_t(text.size())).put_bytes(text)
      .finish();
}

// Nonces and proofs are byte arrays: put and get copy them whole.
std::vector<std::byte> encode(const Challenge& m) { return Writer(Type::challenge).put(m.nonce).finish(); }

std::vector<std::byte> encode(const Login& m) {
  return Writer(Type::login).put(m.hello.slots).put(m.hello.max_rows).put(m.client_nonce).put(m.proof).finish();
}

std::vector<std::byte> encode(const Accepted& m) { return Writer(Type::accepted).put(m.proof).finish(); }

std::vector<std::byte> encode_ping() { return Writer(Type::ping).finish(); }
std::vector<std::byte> encode_pong() { return Writer(Type::pong).finish(); }

void FrameReader::feed(std::span<const std::byte> bytes) {
  if (start_ > 0 && start_ == buffer_.size()) buffer_.clear(), start_ = 0;
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

std::optional<Frame> FrameReader::next(std::string& error) {
  if (buffered() < kHeaderBytes) return std::nullopt;
  const std::byte* h = buffer_.data() + start_;
  std::uint32_t magic, length;
  std::uint16_t version, type;
  std::memcpy(&magic, h, 4);
  std::memcpy(&version, h + 4, 2);
  std::memcpy(&type, h + 6, 2);
  std::memcpy(&length, h + 8, 4);
  if (magic != kMagic) {
    error = "not a moed front-door frame (bad magic)";
    return std::nullopt;
  }
  if (version != kVersion) {
    error = "protocol version " + std::to_string(version) + "; this side speaks " + std::to_string(kVersion);
    return std::nullopt;
  }
  if (type < std::uint16_t(Type::hello) || type > std::uint16_t(Type::pong)) {
    error = "unknown frame type " + std::to_string(type);
    return std::nullopt;
  }
  if (length > kMaxPayload) {
    error = "frame payload of " + std::to_string(length) + " bytes (at most " + std::to_string(kMaxPayload) + ")";
    return std::nullopt;
  }
  if (buffered() < kHeaderBytes + length) return std::nullopt;
  Frame f;
  f.type = Type(type);
  f.payload.assign(h + kHeaderBytes, h + kHeaderBytes + length);
  start_ += kHeaderBytes + length;
  if (start_ > 64 * 1024) {  // keep the buffer from creeping
    buffer_.erase(buffer_.begin(), buffer_.begin() + std::ptrdiff_t(start_));
    start_ = 0;
  }
  return f;
}

std::optional<Hello> decode_hello(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Hello m;
  m.slots = r.get<std::uint32_t>();
  m.max_rows = r.get<std::uint32_t>();
  if (!r.whole("hello", error)) return std::nullopt;
  return m;
}

std::optional<Welcome> decode_welcome(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Welcome m;
  Layout& l = m.layout;
  m.rank = r.get<std::uint32_t>(), m.ranks = r.get<std::uint32_t>(), m.layers = r.get<std::uint32_t>();
  l.hidden = r.get<std::uint32_t>(), l.max_rows = r.get<std::uint32_t>(), l.slots = r.get<std::uint32_t>();
  l.ids_offset = r.get<std::uint64_t>(), l.positions_offset = r.get<std::uint64_t>();
  l.rows_offset = r.get<std::uint64_t>(), l.slot_bytes = r.get<std::uint64_t>();
  if (!r.whole("welcome", error)) return std::nullopt;
  auto same = [&](const Layout& want) {
    return l.ids_offset == want.ids_offset && l.positions_offset == want.positions_offset &&
           l.rows_offset == want.rows_offset && l.slot_bytes == want.slot_bytes;
  };
  if (!same(make_layout(l.hidden, l.max_rows, l.slots)) && !same(make_layout(l.hidden, l.max_rows, l.slots, true))) {
    error = "welcome: the shared-memory layout is not the one this client computes";
    return std::nullopt;
  }
  return m;
}

std::optional<Submit> decode_submit(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Submit m;
  m.tag = r.get<std::uint64_t>();
  m.slot = r.get<std::uint32_t>(), m.layer = r.get<std::uint32_t>(), m.rows = r.get<std::uint32_t>();
  const auto dtype = r.get<std::uint32_t>();
  if (!r.whole("submit", error)) return std::nullopt;
  if (!known_dtype(dtype)) {
    error = "submit: unknown dtype " + std::to_string(dtype) + " (0 = f32, 1 = bf16)";
    return std::nullopt;
  }
  m.dtype = DType(dtype);
  return m;
}

std::optional<Done> decode_done(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Done m;
  m.tag = r.get<std::uint64_t>();
  m.slot = r.get<std::uint32_t>(), m.rows = r.get<std::uint32_t>();
  if (!r.whole("done", error)) return std::nullopt;
  return m;
}

std::optional<ErrorReply> decode_error(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  ErrorReply m;
  m.tag = r.get<std::uint64_t>();
  m.slot = r.get<std::uint32_t>();
  const auto status = r.get<std::uint32_t>(), bytes = r.get<std::uint32_t>();
  if (payload.size() < 20 || bytes > payload.size() - 20) {
    error = "error payload of " + std::to_string(payload.size()) + " bytes cannot hold its text";
    return std::nullopt;
  }
  m.message = r.get_bytes(bytes);
  if (!r.whole("error", error)) return std::nullopt;
  if (!known_status(status)) {
    error = "error: unknown status " + std::to_string(status);
    return std::nullopt;
  }
  m.status = Status(status);
  return m;
}

std::optional<Challenge> decode_challenge(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Challenge m;
  m.nonce = r.get<Nonce>();
  if (!r.whole("challenge", error)) return std::nullopt;
  return m;
}

std::optional<Login> decode_login(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Login m;
  m.hello.slots = r.get<std::uint32_t>();
  m.hello.max_rows = r.get<std::uint32_t>();
  m.client_nonce = r.get<Nonce>();
  m.proof = r.get<Proof>();
  if (!r.whole("login", error)) return std::nullopt;
  return m;
}

std::optional<Accepted> decode_accepted(std::span<const std::byte> payload, std::string& error) {
  Reader r(payload);
  Accepted m;
  m.proof = r.get<Proof>();
  if (!r.whole("accepted", error)) return std::nullopt;
  return m;
}

std::optional<Frame> decode_frame(std::span<const std::byte> bytes, std::string& error) {
  FrameReader reader;
  reader.feed(bytes);
  auto f = reader.next(error);
  if (!f) {
    if (error.empty()) error = "a message header of " + std::to_string(bytes.size()) + " bytes is not a whole frame";
    return std::nullopt;
  }
  if (reader.buffered() != 0) {
    error = "a message header holds " + std::to_string(reader.buffered()) + " bytes after its frame";
    return std::nullopt;
  }
  return f;
}

float bf16_to_float(std::uint16_t v) {
  const std::uint32_t bits = std::uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40);  // NaN stays a (quiet) NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return std::uint16_t(bits >> 16);
}

}  // namespace moed::wire
