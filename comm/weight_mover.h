// How live migration moves expert weights between ranks, whatever memory
// they sit in and whatever carries them. Every rank exposes a block of
// memory; a source starts copies of bytes into a destination's block at an
// offset, without the destination taking part, then waits until they have
// landed. Made collectively (every rank at once, each with its own block's
// size) and destroyed collectively.
//
// The one here is over a Transport's RMA window (host memory, UCX or MPI
// puts); another kind of memory (GPU memory over NCCL or a UCX memory handle)
// plugs in as another WeightMover and its maker.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace moed::comm {

class Transport;

class WeightMover {
 public:
  virtual ~WeightMover() = default;
  // This rank's block: where copies from other ranks land, and where a
  // source may stage what it sends (RMA copies fastest from registered memory).
  virtual std::span<std::byte> local() = 0;
  // Starts copying `from` (untouched until wait()) to `offset` in rank
  // `to`'s block.
  virtual void start_copy(int to, std::size_t offset, std::span<const std::byte> from) = 0;
  // Waits until every copy this rank started has landed at its destination
  // (under the deadline; `what` names them in the error).
  virtual void wait(const std::string& what) = 0;
};

// Makes a mover, collectively: this rank's block is `bytes` long.
using WeightMoverMaker = std::function<std::unique_ptr<WeightMover>(std::size_t bytes, const std::string& what)>;

// Movers over `transport`'s RMA windows: a copy is a put (after letting the
// transport progress, so that no peer's put waits on this rank), a wait is a
// flush. The transport must outlive the maker and its movers.
WeightMoverMaker rma_weight_movers(Transport& transport);

}  // namespace moed::comm
