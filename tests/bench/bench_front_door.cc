// The front door's benchmark client: it drives running moed daemons
// ([workload].kind = "ingress") through libmoed_client and prints what it
// measured. tests/bench/front_door.sh starts the daemons and compares.
//
//   bench_front_door --config C --dir DIR --ranks R --clients-per-rank N --rows 128 --seconds S
//                    [--mode sync|pingpong|single] [--attention-us A]
//
// Rows are the synthetic workload's tokens of the same config, so the engine
// serving that workload sees the same rows. sync: each client sends one
// layer's rows at a time and waits (the front door's round trip).
// pingpong: two micro-batches of `rows` in flight; per layer, each one's
// "attention" (a busy wait of A us on this thread) runs while the other's
// MoE is in moed. single: the same work as one micro-batch of 2 x rows,
// attention then MoE, in turn. Attention is a sleep: the model's work runs
// elsewhere (a GPU) and leaves this machine's cores to moed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "client/client.h"
#include "tests/bench/client_layer_loop.h"
#include "runtime/config/config.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/synthetic_model.h"
#include "runtime/workload/workload.h"

using namespace moed;
using Clock = std::chrono::steady_clock;

namespace {

struct Result {
  std::uint64_t forwards = 0, rows = 0;
  double seconds = 0;
  double moe_seconds = 0;  // sync and single: from writing the rows into the slot to the outputs
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_front_door: drives moed's front door"};
  std::string config_path, dir, mode = "sync";
  std::vector<std::string> overrides;
  int ranks = 1, per_rank = 1, rows = 128, attention_us = 0;
  double seconds = 5;
  app.add_option("-c,--config", config_path, "the daemons' config (shape, seed)");
  app.add_option("--set", overrides, "config override");
  app.add_option("--dir", dir, "[ingress].dir")->required();
  app.add_option("--ranks", ranks, "ranks of the daemons");
  app.add_option("--clients-per-rank", per_rank, "client threads per rank");
  app.add_option("--rows", rows, "rows per layer per client (per micro-batch)");
  app.add_option("--seconds", seconds, "how long to drive");
  app.add_option("--mode", mode, "sync, pingpong or single");
  app.add_option("--attention-us", attention_us, "pingpong/single: time per layer per micro-batch");
  CLI11_PARSE(app, argc, argv);
  try {
    const runtime::Config config = runtime::load_config(config_path, overrides);
    runtime::Config synthetic = config;
    synthetic.workload.kind = runtime::WorkloadKind::synthetic;
    const runtime::ModelShape shape = runtime::ModelShape::from(config.model);
    std::vector<float> gate0(std::size_t(shape.experts) * std::size_t(shape.hidden));
    runtime::SyntheticModel(shape, std::uint64_t(config.model.seed), *weights::parse_dtype(config.model.dtype)).gate(0, gate0.data());
    const auto workload = runtime::make_workload(synthetic, gate0.data());
    const std::size_t H = std::size_t(shape.hidden);
    const int micro = mode == "pingpong" ? 2 : 1, batch = mode == "single" ? 2 * rows : rows;

    const int n = ranks * per_rank;
    std::vector<Result> results(static_cast<std::size_t>(n));
    std::atomic<bool> go{false}, stop{false};
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        try {
          client::Options options;
          options.slots = std::uint32_t(micro + 1), options.max_rows = std::uint32_t(batch), options.timeout_ms = 120'000;
          client::Client c(fmt::format("{}/moed-ingress-{}.sock", dir, i % ranks), options);
          // This client's tokens: its own block of the synthetic workload's ids.
          std::vector<float> x(std::size_t(micro * batch) * H);
          workload->tokens(std::uint64_t(i) * std::uint64_t(micro * batch), std::size_t(micro * batch), x.data());
          std::vector<int> slot(static_cast<std::size_t>(micro));
          for (int m = 0; m < micro; ++m) {
            slot[std::size_t(m)] = c.acquire();
            for (int r = 0; r < batch; ++r)
              c.request_ids(slot[std::size_t(m)])[r] = std::uint64_t(i * micro + m), c.positions(slot[std::size_t(m)])[r] = std::uint32_t(r);
          }
          auto load = [&](int m) {
            std::memcpy(c.rows(slot[std::size_t(m)]), x.data() + std::size_t(m * batch) * H, std::size_t(batch) * H * sizeof(float));
          };
          while (!go) std::this_thread::yield();
          Result& res = results[std::size_t(i)];
          const auto start = Clock::now();
          const std::chrono::microseconds att(attention_us);
          bench::LayerCounts counts;
          bench::run_layers(c, slot, shape.layers, batch, micro, mode, att, stop, load,
                            [&](double s) { res.moe_seconds += s; }, counts);
          res.forwards += counts.forwards, res.rows += counts.rows;
          res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        } catch (const std::exception& e) {
          errors[std::size_t(i)] = e.what();
          stop = true;
        }
      });
    go = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (!e.empty()) throw std::runtime_error(e);
    Result all;
    for (const Result& r : results)
      all.forwards += r.forwards, all.rows += r.rows, all.seconds += r.seconds / n, all.moe_seconds += r.moe_seconds;
    // Wall time per layer per client, and tokens/s: rows over layers and time.
    fmt::print("{} client{} on {} rank{}, {}, {} rows per layer per {}: {:.3f} ms per layer per client, "
               "{:.0f} tokens/s ({} layer requests); submit to outputs {:.3f} ms (rows written into the slot included)\n",
               n, n == 1 ? "" : "s", ranks, ranks == 1 ? "" : "s", mode, batch,
               mode == "pingpong" ? "micro-batch" : "client", 1e3 * all.seconds * n / double(all.forwards) * micro,
               double(all.rows) / shape.layers / all.seconds, all.forwards,
               mode == "pingpong" ? 0.0 : 1e3 * all.moe_seconds / double(all.forwards));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_front_door: {}\n", e.what());
    return 1;
  }
}
