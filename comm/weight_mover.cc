#include "comm/weight_mover.h"

#include "comm/transport.h"

namespace moed::comm {

namespace {

class RmaWeightMover final : public WeightMover {
 public:
  RmaWeightMover(Transport& transport, std::unique_ptr<RmaWindow> window)
      : transport_(transport), window_(std::move(window)) {}
  std::span<std::byte> local() override { return {window_->local(), window_->bytes()}; }
  void start_copy(int to, std::size_t offset, std::span<const std::byte> from) override {
    transport_.progress();
    window_->put(to, offset, from.data(), from.size());
  }
  void wait(const std::string& what) override { window_->flush(what); }

 private:
  Transport& transport_;
  std::unique_ptr<RmaWindow> window_;
};

}  // namespace

WeightMoverMaker rma_weight_movers(Transport& transport) {
  return [&transport](std::size_t bytes, const std::string& what) -> std::unique_ptr<WeightMover> {
    return std::make_unique<RmaWeightMover>(transport, transport.create_window(bytes, what));
  };
}

}  // namespace moed::comm
