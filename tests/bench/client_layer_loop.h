// What a front-door bench client does once started, as a model process
// drives its layers (bench_front_door and bench_front_door_network share
// it): "pingpong" keeps two micro-batches in flight, the model's attention
// (a sleep: it runs elsewhere) between them; any other mode sends one
// micro-batch at a time, "single" after twice the attention, and passes
// each layer's time at the client (rows into the slot to outputs) to
// `timed`. Runs until `stop`; counts forwards and rows.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"

namespace moed::bench {

// Stands in for the model's own work per layer (attention), done elsewhere
// (a GPU): the client sleeps, and leaves this machine's cores to moed.
inline void attention(std::chrono::microseconds t) {
  if (t.count() > 0) std::this_thread::sleep_for(t);
}

struct LayerCounts {
  std::uint64_t forwards = 0, rows = 0;
};

// fill(m) writes micro-batch m's rows into slot[m]; timed(seconds) takes a
// single layer's time.
template <class Fill, class Timed>
void run_layers(client::Client& c, const std::vector<int>& slot, int layers, int batch, int micro,
                const std::string& mode, std::chrono::microseconds attention_per_batch,
                const std::atomic<bool>& stop, Fill fill, Timed timed, LayerCounts& counts) {
  for (int layer = 0; !stop; layer = (layer + 1) % layers) {
    if (mode == "pingpong") {
      for (int m = 0; m < 2; ++m) {
        if (layer > 0) c.wait(slot[std::size_t(m)]);
        attention(attention_per_batch);
        fill(m);
        c.submit(slot[std::size_t(m)], layer, std::uint32_t(batch));
      }
      if (layer == layers - 1)
        for (int m = 0; m < 2; ++m) c.wait(slot[std::size_t(m)]);
    } else {
      attention(mode == "single" ? 2 * attention_per_batch : std::chrono::microseconds(0));
      const auto t0 = std::chrono::steady_clock::now();
      fill(0);
      c.submit(slot[0], layer, std::uint32_t(batch));
      c.wait(slot[0]);
      timed(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    counts.forwards += std::uint64_t(micro);
    counts.rows += std::uint64_t(micro * batch);
  }
}

}  // namespace moed::bench
