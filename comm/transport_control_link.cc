#include "comm/transport_control_link.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace moed::comm {
namespace {

class TransportControlLink final : public ControlLink {
 public:
  // Rank and size are the transport's at each call: after continue_with()
  // the survivors' (comm/transport.h).
  explicit TransportControlLink(Transport& t) : t_(t) {}

  const char* name() const override { return "transport"; }
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  void set_progress(std::function<void()>) override {}  // the exchanges progress the transport

  // Rank 0's block to every other rank, through the blocking exchange,
  // which receives into memory of its own (Transport::exchange).
  void broadcast(void* data, std::size_t bytes, const std::string& what) override {
    ExchangeLayout layout;
    layout.send_bytes.assign(std::size_t(size()), 0);
    layout.recv_bytes.assign(std::size_t(size()), 0);
    layout.send_offsets.assign(std::size_t(size()), 0);  // the same block to every rank
    layout.recv_offsets.assign(std::size_t(size()), 0);
    if (rank() == 0)
      std::fill(layout.send_bytes.begin() + 1, layout.send_bytes.end(), bytes);
    else
      layout.recv_bytes[0] = bytes;
    const std::byte* block = rank() == 0 ? outgoing(data, bytes) : nullptr;
    t_.exchange(block, layout, static_cast<std::byte*>(data), what);
  }

  void reduce(std::span<double> values, Op op, const std::string& what) override { fold(values, op, what); }
  void reduce(std::span<std::uint64_t> values, Op op, const std::string& what) override { fold(values, op, what); }

  int all_max(int value, const std::string& what) override {
    const std::vector<std::byte> all =
        from_every_rank(&value, sizeof value, std::vector<std::size_t>(std::size_t(size()), sizeof value), what);
    for (int r = 0; r < size(); ++r) {
      int v;
      std::memcpy(&v, all.data() + std::size_t(r) * sizeof v, sizeof v);
      value = std::max(value, v);
    }
    return value;
  }

  std::vector<std::byte> gather(const void* data, std::size_t bytes, bool equal, const std::string& what) override {
    std::vector<std::size_t> sizes(std::size_t(size()), bytes);
    if (!equal) {
      const std::uint64_t mine = bytes;
      const std::vector<std::byte> all = gather_blocks(&mine, std::vector<std::size_t>(std::size_t(size()), sizeof mine),
                                                       "the sizes of " + what);
      if (rank() == 0)
        for (std::size_t r = 0; r < sizes.size(); ++r) std::memcpy(&sizes[r], all.data() + r * sizeof mine, sizeof mine);
    }
    return gather_blocks(data, sizes, what);
  }

  std::vector<std::string> all_gather_strings(const std::string& mine, const std::string& what) override {
    // Every rank's length to every rank, then every rank's string.
    const std::uint64_t length = mine.size();
    const std::vector<std::byte> all = from_every_rank(
        &length, sizeof length, std::vector<std::size_t>(std::size_t(size()), sizeof length), "the lengths of " + what);
    std::vector<std::size_t> lengths(static_cast<std::size_t>(size()));
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      std::uint64_t n;
      std::memcpy(&n, all.data() + r * sizeof n, sizeof n);
      lengths[r] = std::size_t(n);
    }
    const std::vector<std::byte> text = from_every_rank(mine.data(), mine.size(), lengths, what);
    std::vector<std::string> out;
    std::size_t at = 0;
    for (std::size_t n : lengths) out.emplace_back(reinterpret_cast<const char*>(text.data()) + at, n), at += n;
    return out;
  }

 private:
  // What this rank sends, copied into a buffer the link keeps: an exchange
  // cut short by a lost peer unwinds the caller's buffer while UCX may still
  // be sending from it, and continue_with() waits for those sends to end
  // before the next collective replaces it (comm/transport.h).
  const std::byte* outgoing(const void* data, std::size_t bytes) {
    outbox_.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + bytes);
    return outbox_.data();
  }

  // Rank r's `sizes[r]` bytes at `data`, on rank 0 in rank order (rank 0
  // must know every size; the others only their own).
  std::vector<std::byte> gather_blocks(const void* data, const std::vector<std::size_t>& sizes,
                                       const std::string& what) {
    std::vector<std::size_t> recv(std::size_t(size()), 0), offsets(std::size_t(size()), 0);
    std::vector<std::byte> out;
    if (rank() == 0) {
      recv = sizes;
      offsets = ExchangeLayout::prefix_offsets(recv);
      out.resize(offsets.back() + recv.back());
    }
    auto exchange = t_.open_exchange(out.empty() ? &unused_ : out.data(), recv, offsets, what, ReceiveSizes::exact);
    finish_or_keep(*exchange, out, [&] {
      const std::size_t mine = sizes[std::size_t(rank())];
      const std::byte* block = outgoing(data, mine);
      // Every other rank gets an empty block: an exchange may start once it has them all (nccl).
      for (int r = 0; r < size(); ++r)
        if (r == 0 || r != rank()) exchange->send(r, block, r == 0 ? mine : 0);
    });
    return out;
  }

  // `mine` bytes at `data` to every rank (itself included); returns every
  // rank's block, `sizes[r]` bytes from rank r, in rank order.
  std::vector<std::byte> from_every_rank(const void* data, std::size_t mine, const std::vector<std::size_t>& sizes,
                                         const std::string& what) {
    const std::vector<std::size_t> offsets = ExchangeLayout::prefix_offsets(sizes);
    std::vector<std::byte> out(offsets.back() + sizes.back());
    auto exchange = t_.open_exchange(out.empty() ? &unused_ : out.data(), sizes, offsets, what, ReceiveSizes::exact);
    finish_or_keep(*exchange, out, [&] {
      const std::byte* block = outgoing(data, mine);
      for (int r = 0; r < size(); ++r) exchange->send(r, block, mine);
    });
    return out;
  }

  // Rank 0's values become the fold of every rank's, in rank order.
  template <class T>
  void fold(std::span<T> values, Op op, const std::string& what) {
    const std::vector<std::byte> all = gather(values.data(), values.size_bytes(), true, what);
    if (rank() != 0) return;
    std::vector<T> from(values.size());
    for (int r = 1; r < size(); ++r) {
      std::memcpy(from.data(), all.data() + std::size_t(r) * values.size_bytes(), values.size_bytes());
      for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = op == Op::max ? std::max(values[i], from[i]) : T(values[i] + from[i]);
    }
  }

  Transport& t_;
  std::vector<std::byte> outbox_;
  std::byte unused_{};  // a receive buffer for exchanges that receive nothing here
};

}  // namespace

std::unique_ptr<ControlLink> transport_control_link(Transport& transport) {
  return std::make_unique<TransportControlLink>(transport);
}

}  // namespace moed::comm
