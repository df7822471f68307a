// Elastic serving over UCX, two ranks as threads: a sender that stalls in
// the middle of a rendezvous (stopped, or cut off past [comm].timeout_ms),
// is left out by the survivors, and then runs on. UCX still writes its
// block into the receive it matched, which no cancel can stop: the memory
// must be the transport's by then, never the survivor's next epoch's. The
// survivor's exchange gave up at its deadline and was abandoned as the
// engine abandons a step (Exchange::keep_until_received); its teardown
// waited kCancelGrace for the receive already matched; the survivors went
// on (continue_with), and allocated their next memory.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/transport.h"
#include "comm/transport_control_link.h"
#include "common/error.h"
#include "tests/unit/comm/run_ranks.h"
#include "tests/unit/comm/ucx_environment.h"

namespace moed::comm {
namespace {

constexpr std::size_t kBytes = 1 << 20;  // far past UCX's rendezvous threshold
constexpr std::byte kPoison{0xAB}, kSent{0x5A};

// What each thread has done; the other waits for it.
enum Stage : int { kStarted, kSenderPosted, kSurvivorWentOn, kSenderDone };

void wait_for(const std::atomic<int>& stage, int wanted, Transport* progressing = nullptr) {
  while (stage.load() < wanted) {
    if (progressing)
      progressing->progress();
    else
      std::this_thread::yield();
  }
}

std::unique_ptr<Transport> elastic_transport(Bootstrap& bootstrap, std::int64_t timeout_ms) {
  CommConfig config;
  config.backend = comm::Backend::ucx;
  config.elastic = true;
  config.timeout_ms = timeout_ms;
  return create_transport(config, bootstrap);
}

// The bytes of the survivor's next allocation that the stalled sender
// wrote into. `receive` is the survivor's side of the message: it gives
// up at the deadline (300 ms) and leaves the exchange cut short.
std::size_t written_after_leaving_out_a_stalled_sender(int sender, const std::function<void(Transport&)>& receive) {
  std::atomic<int> stage{kStarted};
  std::size_t written_late = 0;
  test::run_ranks(2, [&](Bootstrap& bootstrap) {
    const int me = bootstrap.rank(), other = 1 - me;
    // The survivor gives up on the stalled sender at once; the sender,
    // once it runs again, waits as long as its send needs.
    std::unique_ptr<Transport> t = elastic_transport(bootstrap, me == sender ? 10000 : 300);
    // A step served together first: the endpoints are wired up, so that the
    // stalled send's first message leaves at once.
    {
      ExchangeLayout layout;
      layout.send_bytes = layout.recv_bytes = {kBytes, kBytes};
      layout.send_offsets = layout.recv_offsets = ExchangeLayout::prefix_offsets(layout.send_bytes);
      std::vector<std::byte> send(2 * kBytes, kSent), recv(2 * kBytes);
      t->exchange(send.data(), layout, recv.data(), "a step served together");
    }
    if (me == sender) {
      const std::vector<std::size_t> none{0, 0};
      const std::vector<std::byte> data(kBytes, kSent);
      auto exchange = t->open_exchange(nullptr, none, none, "a block to the survivor", ReceiveSizes::exact);
      exchange->send(other, data.data(), kBytes);  // the rendezvous starts
      stage = kSenderPosted;
      wait_for(stage, kSurvivorWentOn);  // stalled: it does not progress UCX
      try {
        exchange->finish();  // delivered, or refused by the survivor
      } catch (const Error&) {
      }
      exchange.reset();
      t->continue_with({me}, 1);  // alone, so that neither teardown waits for the other
      stage = kSenderDone;
      return;
    }
    wait_for(stage, kSenderPosted);
    receive(*t);
    t->continue_with({me}, 1);
    // The next epoch's memory: blocks of the same size, where the freed
    // ones were (the receive's, and the caller's where they differ).
    std::vector<std::vector<std::byte>> fresh(4, std::vector<std::byte>(kBytes, kPoison));
    stage = kSurvivorWentOn;
    wait_for(stage, kSenderDone, t.get());
    for (int i = 0; i < 10000; ++i) t->progress();  // whatever the sender sent reaches this worker
    for (const auto& block : fresh)
      for (std::byte b : block) written_late += b != kPoison;
  });
  return written_late;
}

TEST(UcxLeftOutPeer, CannotWriteIntoAReceiveBlockReleasedUnfinished) {
  const std::size_t written = written_after_leaving_out_a_stalled_sender(1, [](Transport& t) {
    std::vector<std::byte> block(kBytes, kPoison);
    const std::vector<std::size_t> bytes{0, kBytes}, offsets{0, 0};
    auto exchange = t.open_exchange(block.data(), bytes, offsets, "a block from a stalled sender", ReceiveSizes::exact);
    EXPECT_THROW(exchange->finish(), PeersUnreachable);
    exchange->keep_until_received(std::move(block));  // as the engine abandons a step
  });  // cancelled, and given up past the grace
  EXPECT_EQ(written, 0u) << "the left-out sender wrote into memory the survivor had released";
}

// The blocking exchanges (Transport::exchange, all_gather), which the
// router candidates and the expert census use: the caller's block is freed
// as the error unwinds.
TEST(UcxLeftOutPeer, CannotWriteIntoABlockingExchangeCutShort) {
  const std::size_t written = written_after_leaving_out_a_stalled_sender(1, [](Transport& t) {
    std::vector<std::byte> block(kBytes, kPoison);
    ExchangeLayout layout;
    layout.send_bytes = layout.send_offsets = layout.recv_offsets = {0, 0};
    layout.recv_bytes = {0, kBytes};
    EXPECT_THROW(t.exchange(nullptr, layout, block.data(), "a block from a stalled sender"), PeersUnreachable);
  });
  EXPECT_EQ(written, 0u) << "the left-out sender wrote into memory the survivor had released";
}

// The control channel's collectives over the transport: a broadcast from a
// root that stalled mid-message.
TEST(UcxLeftOutPeer, CannotWriteIntoAControlBroadcastCutShort) {
  const std::size_t written = written_after_leaving_out_a_stalled_sender(0, [](Transport& t) {
    std::vector<std::byte> block(kBytes, kPoison);
    const std::unique_ptr<ControlLink> link = transport_control_link(t);
    EXPECT_THROW(link->broadcast(block.data(), kBytes, "a broadcast from a stalled root"), PeersUnreachable);
  });
  EXPECT_EQ(written, 0u) << "the left-out root wrote into memory the survivor had released";
}

// The same for a window (live migration's): a rank tears its window down
// alone after a loss (an exception unwinds), while a peer's puts into it
// are still on their way. Over tcp this rank's worker writes each put
// where its sender aimed it, whenever it arrives: the memory must still
// be the window's.
TEST(UcxLeftOutPeer, CannotPutIntoAWindowTornDownAlone) {
  test::UcxEnvironment env({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}});
  constexpr std::size_t kWindow = 8 << 20;  // more than the sockets hold: the puts go on after the teardown
  std::atomic<int> stage{kStarted};
  std::size_t written_late = 0;
  test::run_ranks(2, [&](Bootstrap& bootstrap) {
    std::unique_ptr<Transport> t = elastic_transport(bootstrap, 10000);
    std::unique_ptr<RmaWindow> window = t->create_window(kWindow, "a migration's window");
    const auto tear_down_alone = [&] {
      try {
        const std::unique_ptr<RmaWindow> going = std::move(window);
        throw std::runtime_error("a loss");
      } catch (const std::runtime_error&) {
      }
    };
    if (bootstrap.rank() == 1) {
      const std::vector<std::byte> data(kWindow, kSent);
      window->put(0, 0, data.data(), kWindow);
      stage = kSenderPosted;
      wait_for(stage, kSurvivorWentOn);  // stalled: it does not progress UCX
      window->flush("the puts into rank 0");
      tear_down_alone();
      stage = kSenderDone;
      return;
    }
    wait_for(stage, kSenderPosted);
    tear_down_alone();
    std::vector<std::byte> fresh(kWindow, kPoison);  // where the window was, were it unmapped
    stage = kSurvivorWentOn;
    wait_for(stage, kSenderDone, t.get());
    for (int i = 0; i < 10000; ++i) t->progress();
    for (std::byte b : fresh) written_late += b != kPoison;
  });
  EXPECT_EQ(written_late, 0u) << "a peer's puts landed in memory the window had released";
}

}  // namespace
}  // namespace moed::comm
