// Checks every Transport backend that can run here, under mpirun with any
// number of ranks:
//   - exchange of random-sized messages (0 bytes, a 64 MiB one, sizes around
//     the eager/rendezvous thresholds) delivers the exact bytes from every
//     peer, at the layout's offsets, without touching the gaps between blocks;
//   - exchange_sizes and all_gather, many times in a row;
//   - open exchanges (the non-blocking API): several open at once, their
//     blocks sent in a different order on each rank (reversed, shuffled
//     across exchanges) with a blocking exchange_sizes in between; each
//     source is reported exactly once, by next_arrival(false) while sending
//     or next_arrival(true) after, and only once its bytes are exact; one of
//     them receives into capacities larger than the blocks (ReceiveSizes::
//     at_most) and must report each block's true length;
//   - 0-byte blocks: their sources are reported right after the open, before
//     anything is sent;
//   - a window: every rank puts a pattern into every rank's window at its own
//     offset, flushes, and after a barrier each rank checks its window;
//   - UCX's wait hook runs on a next_arrival(false) that finds nothing new,
//     as on a blocking wait's idle polls.
// Exit 0 when all pass; 1 with "FAIL [backend] rank R: check: ..." lines.
//   mpirun -np 4 transport_check [--backend ucx|mpi]... [--timeout-ms N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <numeric>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_bootstrap.h"
#include "comm/mpi/mpi_session.h"
#include "comm/transport.h"
#include "common/error.h"

namespace {

using namespace moed;
using comm::ExchangeLayout;
using comm::Transport;

constexpr std::size_t kBig = std::size_t(64) << 20;
constexpr std::size_t kGap = 16;  // unwritten bytes between receive blocks
constexpr std::byte kPoison{0xAB};

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
std::uint64_t key(std::uint64_t round, int src, int dst) {
  return mix(mix(mix(round) ^ std::uint64_t(src)) ^ (std::uint64_t(dst) << 20));
}

// The bytes rank src sends to rank dst in a round: a stream only they make.
void fill(std::byte* out, std::size_t bytes, std::uint64_t k) {
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t w = mix(k + i);
    std::memcpy(out + i, &w, 8);
  }
  if (i < bytes) {
    const std::uint64_t w = mix(k + i);
    std::memcpy(out + i, &w, bytes - i);
  }
}

// The size of the message src sends to dst in a round (known to every rank).
std::size_t message_bytes(int round, int src, int dst, int ranks) {
  if (round == 0) return 0;  // an exchange of nothing but empty messages
  if (round == 1 && src == 0 && dst == ranks - 1) return kBig;
  const std::uint64_t h = key(round, src, dst);
  switch (h % 5) {
    case 0:
      return 0;
    case 1:
      return h % 64;  // tiny (eager short)
    case 2:
      return 4096 + h % 16384;  // around the eager/rendezvous threshold
    default:
      return h % 300000;  // rendezvous
  }
}

class Checker {
 public:
  Checker(Transport& t, std::string backend) : t_(t), backend_(std::move(backend)) {}
  int failures() const { return failures_; }

  void exchange_rounds(int rounds) {
    const int n = t_.size(), me = t_.rank();
    for (int round = 0; round < rounds; ++round) {
      ExchangeLayout layout;
      for (int peer = 0; peer < n; ++peer) {
        layout.send_bytes.push_back(message_bytes(round, me, peer, n));
        layout.recv_bytes.push_back(message_bytes(round, peer, me, n));
      }
      layout.send_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
      layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.recv_bytes);
      for (int peer = 0; peer < n; ++peer)
        layout.recv_offsets[peer] += kGap * std::size_t(peer + 1);

      std::vector<std::byte> send(layout.send_total());
      for (int dst = 0; dst < n; ++dst)
        fill(send.data() + layout.send_offsets[dst], layout.send_bytes[dst], key(round, me, dst));
      std::vector<std::byte> recv(layout.recv_total() + kGap * std::size_t(n + 1), kPoison);
      t_.exchange(send.data(), layout, recv.data(), fmt::format("check exchange round {}", round));

      std::vector<std::byte> expected;
      for (int src = 0; src < n; ++src) {
        expected.resize(layout.recv_bytes[src]);
        fill(expected.data(), expected.size(), key(round, src, me));
        const std::byte* got = recv.data() + layout.recv_offsets[src];
        compare(
            got, expected.data(), expected.size(),
            fmt::format("exchange round {}: {} bytes from rank {}", round, expected.size(), src));
        for (std::size_t g = 0; g < kGap; ++g)
          if (got[-std::ptrdiff_t(kGap) + std::ptrdiff_t(g)] != kPoison) {
            fail(fmt::format("exchange round {}: the gap before rank {}'s block was written", round,
                             src));
            break;
          }
      }
    }
  }

  void sizes_and_gathers(int repeats) {
    const int n = t_.size(), me = t_.rank();
    for (int rep = 0; rep < repeats; ++rep) {
      std::vector<std::uint64_t> send(n), recv(n, ~0ull);
      for (int dst = 0; dst < n; ++dst) send[dst] = key(1000 + rep, me, dst);
      t_.exchange_sizes(send.data(), recv.data(), "check exchange_sizes");
      for (int src = 0; src < n; ++src)
        if (recv[src] != key(1000 + rep, src, me))
          fail(fmt::format("exchange_sizes {}: value from rank {} is {}, expected {}", rep, src,
                           recv[src], key(1000 + rep, src, me)));

      constexpr std::size_t kBytes = 40;
      std::vector<std::byte> mine(kBytes), all(kBytes * n, kPoison), expected(kBytes);
      fill(mine.data(), kBytes, key(2000 + rep, me, 0));
      t_.all_gather(mine.data(), kBytes, all.data(), "check all_gather");
      for (int src = 0; src < n; ++src) {
        fill(expected.data(), kBytes, key(2000 + rep, src, 0));
        compare(all.data() + src * kBytes, expected.data(), kBytes,
                fmt::format("all_gather {}: block of rank {}", rep, src));
      }
    }
  }

  // kOpen exchanges open at once; this rank sends its blocks in its own
  // order, polling for arrivals between sends, then waits for the rest.
  void open_exchanges(int rounds) {
    constexpr int kOpen = 3;
    const int n = t_.size();
    for (int round = 0; round < rounds; ++round) {
      std::vector<Open> open;
      // The second of the three receives into capacities.
      for (int k = 0; k < kOpen; ++k) open.push_back(open_one(100 + round * kOpen + k, k == 1));

      const auto order = send_order(kOpen, round);
      for (std::size_t i = 0; i < order.size(); ++i) {
        const auto [k, dest] = order[i];
        Open& x = open[k];
        x.exchange->send(dest, x.send.data() + x.layout.send_offsets[dest], x.layout.send_bytes[dest]);
        // Collective in the same order on every rank, whatever each has sent.
        if (i == order.size() / 2) sizes_and_gathers(1);
        for (Open& y : open) drain(y, false);
      }
      // Wait on the last opened first: exchanges complete independently.
      for (int k = kOpen - 1; k >= 0; --k) drain(open[k], true);
      for (Open& x : open) {
        x.exchange->finish();
        if (x.exchange->next_arrival(false) != comm::Exchange::kAllArrived)
          fail(fmt::format("open exchange {}: next_arrival after finish is not kAllArrived", x.round));
        for (int src = 0; src < n; ++src) {
          if (x.reported[src] != 1)
            fail(fmt::format("open exchange {}: rank {} reported {} times", x.round, src, x.reported[src]));
          check_gap(x, src);
        }
      }
    }
  }

  // Blocks of 0 bytes (from every odd rank, and from everyone in the second
  // round) are reported at the open, before anyone sends.
  void empty_blocks() {
    const int n = t_.size(), me = t_.rank();
    for (int round = 0; round < 2; ++round) {
      const auto bytes = [&](int src, int dst) -> std::size_t {
        return round == 1 || src % 2 == 1 ? 0 : 100 + std::size_t(src) * 7 + std::size_t(dst);
      };
      Open x = open_one(200 + round, bytes);
      drain(x, false);
      for (int src = 0; src < n; ++src)
        if (x.layout.recv_bytes[src] == 0 && x.reported[src] != 1)
          fail(fmt::format("empty blocks {}: rank {}'s 0-byte block not reported at the open", round, src));
      for (int i = n; i >= 1; --i) {  // from the farthest peer to self
        const int dest = (me + i) % n;
        x.exchange->send(dest, x.send.data() + x.layout.send_offsets[dest], x.layout.send_bytes[dest]);
      }
      drain(x, true);
      x.exchange->finish();
      for (int src = 0; src < n; ++src)
        if (x.reported[src] != 1)
          fail(fmt::format("empty blocks {}: rank {} reported {} times", round, src, x.reported[src]));
    }
  }

  // Rank s writes its region [s * kRegion, s * kRegion + length(s)) of every
  // rank's window; windows differ in size (the tail past the regions).
  // Last (it leaves the transport failed), over UCX (the backend with a wait
  // hook): rank 0 polls an exchange by next_arrival(false) while rank 1's
  // block to it is never sent. Once nothing new has landed, the poll runs
  // the wait hook, whose throw abandons the exchange; without it rank 0
  // would poll until the deadline, deaf to an agreement under way.
  void polled_wait_runs_hook() {
    if (backend_ != "ucx" || t_.size() < 2) return;
    struct HookFired {};
    Open x = open_one(300, [](int src, int dst) -> std::size_t { return src == 1 && dst == 0 ? 64 : 0; });
    if (t_.rank() != 0) return;  // its exchange goes unfinished: rank 0 abandons its end too
    t_.set_wait_hook([] { throw HookFired{}; });
    try {
      while (x.exchange->next_arrival(false) != comm::Exchange::kAllArrived) {
      }
      fail("polled wait: every block reported, though rank 1 sent none");
    } catch (const HookFired&) {
    } catch (const Error& e) {
      fail(fmt::format("polled wait: the wait hook never ran; the poll ended with: {}", e.what()));
    }
    t_.set_wait_hook({});
  }

  void window() {
    constexpr std::size_t kRegion = std::size_t(1) << 20;
    const int n = t_.size(), me = t_.rank();
    const auto length = [](int src) { return kRegion - 8 * std::size_t(src); };
    auto win = t_.create_window(n * kRegion + 64 * std::size_t(me), "check window");
    if (win->bytes() != n * kRegion + 64 * std::size_t(me)) fail("window: wrong size");
    std::memset(win->local(), 0, win->bytes());
    barrier("check window: zeroed");

    std::vector<std::vector<std::byte>> sources(n);  // must live until the flush
    for (int dst = 0; dst < n; ++dst) {
      const int target = (me + dst) % n;  // every rank starts with a different target
      sources[target].resize(length(me));
      fill(sources[target].data(), length(me), key(3000, me, target));
      win->put(target, me * kRegion, sources[target].data(), length(me));
    }
    win->flush("check window flush");
    barrier("check window: flushed");

    std::vector<std::byte> expected(kRegion, std::byte{0});
    for (int src = 0; src < n; ++src) {
      std::fill(expected.begin(), expected.end(), std::byte{0});
      fill(expected.data(), length(src), key(3000, src, me));
      compare(win->local() + src * kRegion, expected.data(), kRegion,
              fmt::format("window: region written by rank {}", src));
    }
    for (std::size_t i = n * kRegion; i < win->bytes(); ++i)
      if (win->local()[i] != std::byte{0}) {
        fail(fmt::format("window: byte {} past the regions was written", i));
        break;
      }
  }

 private:
  // An open exchange with its buffers and what it has reported.
  struct Open {
    int round;
    ExchangeLayout layout;       // recv_bytes: what comes (the capacities are in `capacity`)
    std::vector<std::size_t> capacity;
    std::vector<std::byte> send, recv;
    std::unique_ptr<comm::Exchange> exchange;
    std::vector<int> reported;  // by source
  };

  // Opens the exchange of `round`, with gaps between its receive blocks.
  // at_most: receives are posted with room to spare (a capacity of 0 only
  // for an empty block), and each must report its true length.
  template <class Bytes>
  Open open_one(int round, Bytes bytes, bool at_most = false) {
    const int n = t_.size(), me = t_.rank();
    Open x{round, {}, {}, {}, {}, nullptr, std::vector<int>(n, 0)};
    for (int peer = 0; peer < n; ++peer) {
      x.layout.send_bytes.push_back(bytes(me, peer));
      x.layout.recv_bytes.push_back(bytes(peer, me));
    }
    x.capacity = x.layout.recv_bytes;
    if (at_most)
      for (int peer = 0; peer < n; ++peer)
        if (x.capacity[peer]) x.capacity[peer] += key(round, peer, me) % 3000;
    x.layout.send_offsets = ExchangeLayout::prefix_offsets(x.layout.send_bytes);
    x.layout.recv_offsets = ExchangeLayout::prefix_offsets(x.capacity);
    for (int peer = 0; peer < n; ++peer) x.layout.recv_offsets[peer] += kGap * std::size_t(peer + 1);
    x.send.resize(x.layout.send_total());
    for (int dst = 0; dst < n; ++dst)
      fill(x.send.data() + x.layout.send_offsets[dst], x.layout.send_bytes[dst], key(round, me, dst));
    const std::size_t room = std::accumulate(x.capacity.begin(), x.capacity.end(), std::size_t{0});
    x.recv.assign(room + kGap * std::size_t(n + 1), kPoison);
    x.exchange = t_.open_exchange(x.recv.data(), x.capacity, x.layout.recv_offsets,
                                  fmt::format("check open exchange {}", round),
                                  at_most ? comm::ReceiveSizes::at_most : comm::ReceiveSizes::exact);
    return x;
  }
  Open open_one(int round, bool at_most = false) {
    const int n = t_.size();
    return open_one(round, [&](int src, int dst) { return message_bytes(round, src, dst, n); }, at_most);
  }

  // (exchange, destination) pairs in this rank's order: even ranks send
  // everything in reverse, odd ranks shuffle across the exchanges.
  std::vector<std::pair<int, int>> send_order(int exchanges, int round) const {
    const int n = t_.size(), me = t_.rank();
    std::vector<std::pair<int, int>> order;
    for (int k = exchanges - 1; k >= 0; --k)
      for (int dest = n - 1; dest >= 0; --dest) order.emplace_back(k, dest);
    if (me % 2 == 1)
      for (std::size_t i = order.size() - 1; i > 0; --i)
        std::swap(order[i], order[mix(key(round, me, int(i))) % (i + 1)]);
    return order;
  }

  // Takes what has arrived (everything, with `block`), checking each
  // source's bytes as it is reported.
  void drain(Open& x, bool block) {
    const int n = t_.size(), me = t_.rank();
    for (;;) {
      const int src = x.exchange->next_arrival(block);
      if (src == comm::Exchange::kAllArrived || src == comm::Exchange::kNoneYet) {
        if (block && src == comm::Exchange::kNoneYet)
          fail(fmt::format("open exchange {}: next_arrival(true) returned kNoneYet", x.round));
        return;
      }
      if (src < 0 || src >= n) {
        fail(fmt::format("open exchange {}: next_arrival returned {}", x.round, src));
        return;
      }
      if (++x.reported[src] > 1) fail(fmt::format("open exchange {}: rank {} reported again", x.round, src));
      if (x.exchange->received_bytes(src) != x.layout.recv_bytes[src])
        fail(fmt::format("open exchange {}: rank {}'s block reported as {} bytes, {} were sent", x.round, src,
                         x.exchange->received_bytes(src), x.layout.recv_bytes[src]));
      std::vector<std::byte> expected(x.layout.recv_bytes[src]);
      fill(expected.data(), expected.size(), key(x.round, src, me));
      compare(x.recv.data() + x.layout.recv_offsets[src], expected.data(), expected.size(),
              fmt::format("open exchange {}: {} bytes from rank {} when reported", x.round,
                          expected.size(), src));
    }
  }

  void check_gap(const Open& x, int src) {
    const std::byte* block = x.recv.data() + x.layout.recv_offsets[src];
    for (std::size_t g = 1; g <= kGap; ++g)
      if (block[-std::ptrdiff_t(g)] != kPoison) {
        fail(fmt::format("open exchange {}: the gap before rank {}'s block was written", x.round, src));
        return;
      }
  }

  void barrier(const std::string& what) {
    std::vector<std::uint64_t> all(t_.size());
    std::uint64_t one = 1;
    t_.all_gather(&one, sizeof one, all.data(), what);
  }

  void compare(const std::byte* got, const std::byte* expected, std::size_t bytes,
               const std::string& what) {
    if (std::memcmp(got, expected, bytes) == 0) return;
    std::size_t i = 0;
    while (got[i] == expected[i]) ++i;
    fail(fmt::format("{} differ at offset {} (got 0x{:02x}, expected 0x{:02x})", what, i,
                     unsigned(got[i]), unsigned(expected[i])));
  }

  void fail(const std::string& what) {
    ++failures_;
    std::cerr << fmt::format("FAIL [{}] rank {}: {}\n", backend_, t_.rank(), what);
  }

  Transport& t_;
  std::string backend_;
  int failures_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession mpi(&argc, &argv);
  std::vector<std::string> wanted;
  comm::CommConfig config;
  config.timeout_ms = 60000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      wanted.emplace_back(argv[++i]);
    } else if (arg == "--timeout-ms" && i + 1 < argc) {
      config.timeout_ms = std::stoll(argv[++i]);
    } else {
      if (mpi.rank() == 0)
        std::cerr << "usage: transport_check [--backend NAME]... [--timeout-ms N]\n";
      return 2;
    }
  }
  const bool explicit_list = !wanted.empty();
  if (!explicit_list) wanted = comm::transport_backend_names();

  int failures = 0, checked = 0;
  comm::MpiBootstrap bootstrap(mpi.world(), std::chrono::milliseconds(config.timeout_ms));
  try {
    for (const std::string& backend : wanted) {
      std::unique_ptr<Transport> transport;
      try {
        config.backend = comm::kBackendNames.parse(backend, "--backend");
        transport = comm::create_transport(config, bootstrap);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Usage) throw;
        // The same on every rank: create_transport agrees before it throws.
        if (mpi.rank() == 0) std::cerr << fmt::format("skip [{}]: {}\n", backend, e.what());
        if (explicit_list) ++failures;
        continue;
      }
      Checker check(*transport, backend);
      check.exchange_rounds(8);
      check.sizes_and_gathers(20);
      check.open_exchanges(6);
      check.empty_blocks();
      check.window();
      check.polled_wait_runs_hook();
      failures += check.failures();
      ++checked;
      transport.reset();
      int mine = check.failures(), all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, mpi.world());
      if (mpi.rank() == 0)
        std::cout << fmt::format(
            "{} [{}] on {} ranks: exchange, exchange_sizes, all_gather, open exchanges, window\n",
            all == 0 ? "ok" : "FAILED", backend, mpi.size());
    }
  } catch (const Error& e) {
    std::cerr << fmt::format("FAIL rank {}: {}\n", mpi.rank(), e.describe());
    mpi.abort(1);
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, mpi.world());
  if (total == 0 && checked == 0) {
    if (mpi.rank() == 0) std::cerr << "FAIL: no backend could run\n";
    return 1;
  }
  return total == 0 ? 0 : 1;
}
