// The front door's wire protocol between a model process (libmoed_client)
// and one moed rank, over a Unix stream socket; token rows travel in shared
// memory, never through the socket.
//
// Every message is a frame: a 16-byte header (u32 magic "MOED", u16 version,
// u16 type, u32 payload bytes, u32 zero) and its payload, little-endian.
//
//   client -> daemon   hello    {u32 slots, u32 max_rows}: what the client asks for
//   daemon -> client   welcome  {the layout below; the shared memory's fd
//                                travels with it (SCM_RIGHTS)}
//   client -> daemon   submit   {u64 tag, u32 slot, u32 layer, u32 rows, u32 dtype}:
//                               the slot holds `rows` rows, their request ids and
//                               positions; serve them at `layer`
//   daemon -> client   done     {u64 tag, u32 slot, u32 rows}: the slot's rows now
//                               hold the layer's outputs, in the same dtype
//   daemon -> client   error    {u64 tag, u32 slot, u32 status, u32 bytes, text}:
//                               that submit failed (slot kNoSlot: the connection)
//
// Over the network (UCX active messages, runtime/ingress/network_door.h) the
// same frames travel as each message's header, and the rows as its data. A
// client proves it holds the cluster's key before it may send rows:
//
//   daemon -> client   challenge {u8[32] nonce}: fresh for each connection
//   client -> daemon   login     {u32 slots, u32 max_rows, u8[32] client nonce,
//                                 u8[32] proof}: proof = HMAC-SHA-256 of the
//                                 key over both nonces and the hello (auth.h)
//   daemon -> client   accepted  {u8[32] proof}: the daemon's over both nonces,
//                                 so the client knows it reached the cluster;
//                                 a welcome follows (no shared memory)
//   daemon -> client   ping      {}: to a client it has not heard from for a
//                                 while ([ingress].ping_interval_ms)
//   client -> daemon   pong      {}: the answer, sent when the client next
//                                 runs (in any call); a client silent past
//                                 [ingress].silence_timeout_ms is let go
//
// A network submit carries its slot's request ids, positions and rows as
// its data, packed in that order ([ids u64 x rows][positions u32 x rows]
// [rows]); the staged layout keeps room for the ids and positions just
// before the rows, so that the three go out as one contiguous block. A
// network done carries the outputs (rows x hidden, in the submit's dtype).
//
// The shared memory is the daemon's: a sealed memfd (it cannot shrink) of
// `slots` slots of slot_bytes each. A slot holds max_rows request ids (u64),
// then max_rows positions (u32), then max_rows rows of `hidden` values (fp32,
// or bf16 in the first half), each part 64-byte aligned. A client has at
// most one submit in flight per slot.
//
// Pure: encoding, decoding and validation only; no sockets.
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace moed::wire {

inline constexpr std::uint32_t kMagic = 0x44454f4d;  // "MOED" in little-endian bytes
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 16;
inline constexpr std::size_t kMaxPayload = 4096;
inline constexpr std::uint32_t kNoSlot = 0xffffffff;

enum class Type : std::uint16_t {
  hello = 1, welcome = 2, submit = 3, done = 4, error = 5, challenge = 6, login = 7, accepted = 8, ping = 9, pong = 10
};
enum class DType : std::uint32_t { f32 = 0, bf16 = 1 };

// Why a submit (or the connection) failed.
enum class Status : std::uint32_t {
  bad_request = 1,       // a field out of range: layer, rows, slot, dtype
  busy = 2,              // the slot already has a submit in flight
  not_finite = 3,        // a row holds NaN or Inf
  too_many_clients = 4,  // the rank serves [ingress].max_clients already
  forbidden = 5,         // the peer's uid may not use this daemon
  shutting_down = 6,     // the daemon stops; the request was not served
  internal = 7,          // a bug in moed
};
std::string to_string(Status status);

struct Hello {
  std::uint32_t slots = 0, max_rows = 0;
};

inline constexpr std::size_t kNonceBytes = 32;
using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Proof = std::array<std::uint8_t, 32>;  // an HMAC-SHA-256

struct Challenge {
  Nonce nonce{};
};

struct Login {
  Hello hello;
  Nonce client_nonce{};
  Proof proof{};
};

struct Accepted {
  Proof proof{};
};

// Where things are in the shared memory (all offsets in bytes).
struct Layout {
  std::uint32_t hidden = 0, max_rows = 0, slots = 0;
  std::uint64_t ids_offset = 0, positions_offset = 0, rows_offset = 0;  // within a slot
  std::uint64_t slot_bytes = 0;                                          // page-aligned
  std::uint64_t region_bytes() const { return slot_bytes * slots; }
  // Where a network submit of `rows` rows starts in its slot: its ids and
  // positions, packed, end where the rows begin (staged layouts only).
  std::uint64_t packed_offset(std::uint32_t rows) const { return rows_offset - std::uint64_t(rows) * 12; }
  // The bytes a network submit of `rows` rows carries, and its answer.
  std::uint64_t row_bytes(std::uint32_t rows, DType dtype) const {
    return std::uint64_t(rows) * hidden * (dtype == DType::bf16 ? 2 : 4);
  }
  std::uint64_t packed_bytes(std::uint32_t rows, DType dtype) const { return std::uint64_t(rows) * 12 + row_bytes(rows, dtype); }
};
// The layout for `slots` slots of `max_rows` rows of `hidden` values; a
// staged one (network clients) keeps 12 bytes a row before the rows.
Layout make_layout(std::uint32_t hidden, std::uint32_t max_rows, std::uint32_t slots, bool staged = false);

struct Welcome {
  std::uint32_t rank = 0, ranks = 0, layers = 0;
  Layout layout;
};

struct Submit {
  std::uint64_t tag = 0;
  std::uint32_t slot = 0, layer = 0, rows = 0;
  DType dtype = DType::f32;
};

struct Done {
  std::uint64_t tag = 0;
  std::uint32_t slot = 0, rows = 0;
};

struct ErrorReply {
  std::uint64_t tag = 0;
  std::uint32_t slot = kNoSlot;
  Status status = Status::internal;
  std::string message;  // at most kMaxPayload - 20 bytes travel
};

std::vector<std::byte> encode(const Hello& m);
std::vector<std::byte> encode(const Welcome& m);
std::vector<std::byte> encode(const Submit& m);
std::vector<std::byte> encode(const Done& m);
std::vector<std::byte> encode(const ErrorReply& m);
std::vector<std::byte> encode(const Challenge& m);
std::vector<std::byte> encode(const Login& m);
std::vector<std::byte> encode(const Accepted& m);
std::vector<std::byte> encode_ping();
std::vector<std::byte> encode_pong();

struct Frame {
  Type type = Type::hello;
  std::vector<std::byte> payload;
};

// Accumulates bytes from a stream and cuts them into frames. A header with a
// wrong magic, version or type, or a payload over kMaxPayload, is an error:
// the stream cannot be resynchronised, so the connection must end.
class FrameReader {
 public:
  void feed(std::span<const std::byte> bytes);
  // The next whole frame, if one has arrived; sets `error` (and returns
  // nullopt) when the stream is broken.
  std::optional<Frame> next(std::string& error);
  std::size_t buffered() const { return buffer_.size() - start_; }

 private:
  std::vector<std::byte> buffer_;
  std::size_t start_ = 0;
};

// Payload decoders: nullopt and `error` set when the payload has the wrong
// size or a field is impossible (an unknown dtype or status).
std::optional<Hello> decode_hello(std::span<const std::byte> payload, std::string& error);
std::optional<Welcome> decode_welcome(std::span<const std::byte> payload, std::string& error);
std::optional<Submit> decode_submit(std::span<const std::byte> payload, std::string& error);
std::optional<Done> decode_done(std::span<const std::byte> payload, std::string& error);
std::optional<ErrorReply> decode_error(std::span<const std::byte> payload, std::string& error);
std::optional<Challenge> decode_challenge(std::span<const std::byte> payload, std::string& error);
std::optional<Login> decode_login(std::span<const std::byte> payload, std::string& error);
std::optional<Accepted> decode_accepted(std::span<const std::byte> payload, std::string& error);
// One whole frame (a network message's header), nullopt and `error` set
// when it is not exactly one valid frame.
std::optional<Frame> decode_frame(std::span<const std::byte> bytes, std::string& error);

// bf16 <-> fp32: widening is exact; narrowing rounds to nearest even (NaN stays NaN).
float bf16_to_float(std::uint16_t v);
std::uint16_t float_to_bf16(float v);

}  // namespace moed::wire
