// Which queued submits a step takes: expert-level dynamic batching over the
// clients of one rank. Pure: no sockets, no threads.
//
// Each client's submits wait in its own FIFO. A step takes them round-robin,
// one submit per client per round, starting one client further each step,
// while the submit's layer still has room in the step's per-layer budget of
// rows. A client whose next submit does not fit waits for the next step (its
// later submits keep their order), and does not stop the others: a client
// that floods its queue gets one turn per round like everyone else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace moed::runtime::ingress {

struct QueuedSubmit {
  std::size_t client = 0;  // set by take_fair: the queue it came from
  std::uint32_t layer = 0, rows = 0;
  std::uint64_t ticket = 0;  // the caller's handle on the submit
};

// Pops the submits taken from `queues` (queue i holds client i's submits, in
// order) and returns them in the order taken. `budget[layer]` is the rows
// left for that layer this step; it is decreased by what is taken. `start`
// is the client that has the first turn.
std::vector<QueuedSubmit> take_fair(std::vector<std::deque<QueuedSubmit>>& queues, std::size_t start,
                                    std::vector<std::size_t>& budget);

}  // namespace moed::runtime::ingress
