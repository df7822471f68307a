#include "comm/membership_wire.h"

#include <fmt/format.h>

#include <cstdint>

#include "common/error.h"
#include "common/little_endian.h"

namespace moed::comm {

namespace {

constexpr std::uint8_t kVersion = 1;
constexpr std::size_t kFixedBytes = 1 + 1 + 4 + 4 + 8 + (8 + 4) + (8 + 4) + 4 + 4;
constexpr const char* kWhat = "membership message";

void write_ballot(LittleEndianWriter& w, const Ballot& b) {
  w.u64(b.round);
  w.i32(b.rank);
}

// A rank of the world, or (allow_none) -1.
int read_rank(LittleEndianReader& r, int ranks, const char* field, bool allow_none) {
  const int rank = r.i32();
  if (rank >= ranks || rank < (allow_none ? -1 : 0))
    MOED_THROW(Input, "{}: {} {} is not a rank of {}{}", kWhat, field, rank, ranks, allow_none ? " (or -1)" : "");
  return rank;
}

Ballot read_ballot(LittleEndianReader& r, int ranks, const char* field) {
  Ballot b;
  b.round = r.u64();
  b.rank = read_rank(r, ranks, field, true);
  return b;
}

}  // namespace

std::string encode(const MembershipMessage& m) {
  LittleEndianWriter w(kFixedBytes + 4 * m.members.size());
  w.u8(kVersion);
  w.u8(static_cast<std::uint8_t>(m.kind));
  w.i32(m.from);
  w.i32(m.to);
  w.u64(m.epoch);
  write_ballot(w, m.ballot);
  write_ballot(w, m.accepted_ballot);
  w.i32(m.suspected);
  w.u32(static_cast<std::uint32_t>(m.members.size()));
  for (int rank : m.members) w.i32(rank);
  return std::move(w.str());
}

MembershipMessage decode_membership_message(std::string_view bytes, int ranks) {
  LittleEndianReader r(bytes, kWhat);
  MembershipMessage m;
  if (const std::uint8_t version = r.u8(); version != kVersion)
    MOED_THROW(Input, "{}: version {}, this moed reads version {}", kWhat, version, kVersion);
  const std::uint8_t kind = r.u8();
  if (kind > static_cast<std::uint8_t>(MembershipMessage::Kind::decide))
    MOED_THROW(Input, "{}: unknown kind {}", kWhat, kind);
  m.kind = static_cast<MembershipMessage::Kind>(kind);
  m.from = read_rank(r, ranks, "sender", false);
  m.to = read_rank(r, ranks, "receiver", false);
  if (m.from == m.to) MOED_THROW(Input, "{}: rank {} sent it to itself", kWhat, m.from);
  m.epoch = r.u64();
  m.ballot = read_ballot(r, ranks, "ballot's rank");
  m.accepted_ballot = read_ballot(r, ranks, "accepted ballot's rank");
  m.suspected = read_rank(r, ranks, "suspected rank", m.kind != MembershipMessage::Kind::suspect);
  const std::uint32_t count = r.u32();
  if (count > std::uint32_t(ranks)) MOED_THROW(Input, "{}: {} members in a world of {} ranks", kWhat, count, ranks);
  if (r.remaining() != 4 * std::size_t(count))
    MOED_THROW(Input, "{}: {} members need {} bytes after the header, {} are there", kWhat, count, 4 * count,
               r.remaining());
  m.members.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const int rank = read_rank(r, ranks, "member", false);
    if (!m.members.empty() && rank <= m.members.back())
      MOED_THROW(Input, "{}: member {} after {}: members must be ascending and distinct", kWhat, rank,
                 m.members.back());
    m.members.push_back(rank);
  }
  return m;
}

}  // namespace moed::comm
