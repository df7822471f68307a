// The weight mover over RMA windows: its block is the window, a copy is one
// put of the same bytes to the same place (after the transport progressed),
// a wait is a flush under the same label; the maker creates one window of
// the size asked, collectively (through create_window).
#include "comm/weight_mover.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/transport.h"

namespace moed::comm {
namespace {

// What a transport and its windows were asked to do, in order.
struct Calls {
  std::vector<std::string> log;
};

class RecordingWindow final : public RmaWindow {
 public:
  RecordingWindow(Calls& calls, std::size_t bytes) : calls_(calls), memory_(bytes) {}
  std::byte* local() override { return memory_.data(); }
  std::size_t bytes() const override { return memory_.size(); }
  void put(int target, std::size_t offset, const void* src, std::size_t bytes) override {
    const auto at = static_cast<const std::byte*>(src) - memory_.data();
    calls_.log.push_back("put " + std::to_string(target) + " " + std::to_string(offset) + " from " +
                         std::to_string(at) + " " + std::to_string(bytes));
  }
  void flush(const std::string& what) override { calls_.log.push_back("flush " + what); }

 private:
  Calls& calls_;
  std::vector<std::byte> memory_;
};

class RecordingTransport final : public Transport {
 public:
  explicit RecordingTransport(Calls& calls) : calls_(calls) {}
  const char* name() const override { return "recording"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::unique_ptr<Exchange> open_exchange(std::byte*, const std::vector<std::size_t>&,
                                          const std::vector<std::size_t>&, const std::string& what,
                                          ReceiveSizes) override {
    ADD_FAILURE() << "a mover opened an exchange: " << what;
    return nullptr;
  }
  std::unique_ptr<RmaWindow> create_window(std::size_t bytes, const std::string& what) override {
    calls_.log.push_back("create_window " + std::to_string(bytes) + " " + what);
    return std::make_unique<RecordingWindow>(calls_, bytes);
  }
  void progress() override { calls_.log.push_back("progress"); }

 private:
  Calls& calls_;
};

TEST(RmaWeightMover, CopiesArePutsOfTheWindowsBytesAndAWaitIsAFlush) {
  Calls calls;
  RecordingTransport transport(calls);
  const WeightMoverMaker make = rma_weight_movers(transport);
  std::unique_ptr<WeightMover> mover = make(4096, "window of migration 7");
  ASSERT_EQ(mover->local().size(), 4096u);
  mover->start_copy(1, 100, mover->local().subspan(1024, 512));
  mover->start_copy(0, 0, mover->local().subspan(2048, 8));
  mover->wait("transfer of migration 7");
  EXPECT_EQ(calls.log, (std::vector<std::string>{"create_window 4096 window of migration 7", "progress",
                                                 "put 1 100 from 1024 512", "progress", "put 0 0 from 2048 8",
                                                 "flush transfer of migration 7"}));
}

}  // namespace
}  // namespace moed::comm
