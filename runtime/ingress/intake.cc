#include "runtime/ingress/intake.h"

namespace moed::runtime::ingress {

std::vector<QueuedSubmit> take_fair(std::vector<std::deque<QueuedSubmit>>& queues, std::size_t start,
                                    std::vector<std::size_t>& budget) {
  std::vector<QueuedSubmit> taken;
  const std::size_t n = queues.size();
  std::vector<bool> blocked(n, false);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t turn = 0; turn < n; ++turn) {
      const std::size_t c = (start + turn) % n;
      if (blocked[c] || queues[c].empty()) continue;
      const QueuedSubmit& next = queues[c].front();
      if (next.layer >= budget.size() || next.rows > budget[next.layer]) {
        blocked[c] = true;  // keeps its order: nothing behind it goes first
        continue;
      }
      budget[next.layer] -= next.rows;
      taken.push_back(next);
      taken.back().client = c;
      queues[c].pop_front();
      progress = true;
    }
  }
  return taken;
}

}  // namespace moed::runtime::ingress
