// The network front door's benchmark client: it drives running moed daemons
// ([workload].kind = "ingress") through libmoed_client, over their network
// doors (ucx://, with the cluster's key) or their Unix sockets, and prints
// what it measured as one line of key=value figures.
// tests/bench/front_door_network.sh runs it on the emulated cluster's hosts
// and compares.
//
//   bench_front_door_network --config C [--set K=V]... --dir DIR --ranks R
//       [--key-file K] [--clients N] [--first-client I] [--homes one|spread]
//       [--spread round_robin|least_loaded] [--rows 128] [--seconds S]
//       [--mode sync|pingpong|single] [--attention-us A] [--start-at-ms T]
//       [--idle-seconds S]
//
// Client i (counting from --first-client) has home rank i % R, or with
// --homes spread all R ranks. The doors: with --key-file, the first address
// each rank lists in DIR/moed-ingress-<rank>.ucx; without, its socket
// DIR/moed-ingress-<rank>.sock. Rows are the synthetic workload's tokens of
// the same config, a block of its own per client.
//
// sync: each client sends one layer's rows at a time and waits: the per-layer
// latency (from writing the rows into the slot to the outputs in it).
// pingpong: two micro-batches of `rows` in flight; per layer, each one's
// "attention" (a sleep of A us: the model's work runs elsewhere) overlaps the
// other's MoE. single: the same work as one micro-batch of 2 x rows,
// attention then MoE in turn. --start-at-ms: the clients connect, then start
// at this wall-clock time (ms since the epoch), so that clients in several
// processes (hosts) measure the same window.
// --idle-seconds S: each client connects and serves one layer, prints
// "connected N" once all have, then holds its connection idle for S seconds
// (the daemons' idle CPU with clients connected).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
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
  std::vector<double> moe_ms;  // sync and single: per forward, rows written into the slot to outputs
  std::uint64_t hash = 0;      // sync: the outputs of the first forward (layer 0)
};

std::string door_of(const std::string& dir, int rank, bool network) {
  const std::string base = dir + "/moed-ingress-" + std::to_string(rank);
  if (!network) return "unix://" + base + ".sock";
  std::ifstream listed(base + ".ucx");
  std::string address;
  if (!std::getline(listed, address) || address.empty())
    throw std::runtime_error(base + ".ucx lists no network address (is [ingress].listen set?)");
  return address;
}

std::uint64_t fnv1a(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(std::llround(q * double(v.size() - 1))))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_front_door_network: drives moed's front door, over the network or the Unix socket"};
  std::string config_path, dir, mode = "sync", key_file, homes = "one", spread = "round_robin";
  std::vector<std::string> overrides;
  int ranks = 1, clients = 1, first = 0, rows = 128, attention_us = 0;
  double seconds = 5, idle_seconds = 0;
  long long start_at_ms = 0;
  app.add_option("-c,--config", config_path, "the daemons' config (shape, seed)")->required();
  app.add_option("--set", overrides, "config override");
  app.add_option("--dir", dir, "[ingress].dir")->required();
  app.add_option("--ranks", ranks, "ranks of the daemons");
  app.add_option("--key-file", key_file, "through the network doors, proving this key");
  app.add_option("--clients", clients, "client threads");
  app.add_option("--first-client", first, "index of the first client (its home and its tokens)");
  app.add_option("--homes", homes, "one (rank i % R) or spread (all ranks)");
  app.add_option("--spread", spread, "round_robin or least_loaded (--homes spread)");
  app.add_option("--rows", rows, "rows per layer per client (per micro-batch)");
  app.add_option("--seconds", seconds, "how long to drive");
  app.add_option("--mode", mode, "sync, pingpong or single");
  app.add_option("--attention-us", attention_us, "pingpong/single: time per layer per micro-batch");
  app.add_option("--start-at-ms", start_at_ms, "start at this wall-clock time (ms since the epoch)");
  app.add_option("--idle-seconds", idle_seconds, "connect, serve one layer, then hold the connections idle");
  CLI11_PARSE(app, argc, argv);
  try {
    if (mode != "sync" && mode != "pingpong" && mode != "single") throw std::runtime_error("--mode: sync, pingpong or single");
    if (homes != "one" && homes != "spread") throw std::runtime_error("--homes: one or spread");
    if (homes == "spread" && key_file.empty()) throw std::runtime_error("--homes spread needs --key-file (network homes)");
    const runtime::Config config = runtime::load_config(config_path, overrides);
    runtime::Config synthetic = config;
    synthetic.workload.kind = runtime::WorkloadKind::synthetic;
    const runtime::ModelShape shape = runtime::ModelShape::from(config.model);
    std::vector<float> gate0(std::size_t(shape.experts) * std::size_t(shape.hidden));
    runtime::SyntheticModel(shape, std::uint64_t(config.model.seed), *weights::parse_dtype(config.model.dtype))
        .gate(0, gate0.data());
    const auto workload = runtime::make_workload(synthetic, gate0.data());
    const std::size_t H = std::size_t(shape.hidden);
    const bool idle = idle_seconds > 0;
    const int micro = mode == "pingpong" ? 2 : 1, batch = mode == "single" ? 2 * rows : rows;

    std::vector<Result> results(static_cast<std::size_t>(clients));
    std::vector<std::string> errors(static_cast<std::size_t>(clients));
    std::atomic<int> connected{0};
    std::atomic<bool> go{false}, stop{false};
    std::mutex connecting;  // one handshake at a time: the doors bound those in progress per peer
    std::vector<std::thread> threads;
    for (int t = 0; t < clients; ++t)
      threads.emplace_back([&, t] {
        const int i = first + t;
        try {
          client::Options options;
          options.slots = std::uint32_t(micro + 1), options.max_rows = std::uint32_t(batch);
          options.timeout_ms = 120'000, options.key_file = key_file;
          options.spread = spread == "least_loaded" ? client::Spread::least_loaded : client::Spread::round_robin;
          std::unique_ptr<client::Client> owned;
          {
            std::lock_guard lock(connecting);
            if (homes == "spread") {
              std::vector<std::string> all;
              for (int r = 0; r < ranks; ++r) all.push_back(door_of(dir, (i + r) % ranks, true));
              owned = std::make_unique<client::Client>(all, options);
            } else {
              owned = std::make_unique<client::Client>(door_of(dir, i % ranks, !key_file.empty()), options);
            }
          }
          client::Client& c = *owned;
          std::vector<float> x(std::size_t(micro * batch) * H);
          workload->tokens(std::uint64_t(i) * std::uint64_t(micro * batch), std::size_t(micro * batch), x.data());
          std::vector<int> slot(static_cast<std::size_t>(micro));
          auto fill = [&](int m) {
            const int s = slot[std::size_t(m)];
            for (int r = 0; r < batch; ++r)
              c.request_ids(s)[r] = std::uint64_t(i * micro + m), c.positions(s)[r] = std::uint32_t(r);
            std::memcpy(c.rows(s), x.data() + std::size_t(m * batch) * H, std::size_t(batch) * H * sizeof(float));
          };
          for (int m = 0; m < micro; ++m) slot[std::size_t(m)] = c.acquire();
          Result& res = results[std::size_t(t)];
          // One layer served before the clock starts (and the bits of its outputs).
          fill(0);
          c.submit(slot[0], 0, std::uint32_t(batch));
          c.wait(slot[0]);
          res.hash = fnv1a(c.rows(slot[0]), std::size_t(batch) * H * sizeof(float));
          ++connected;
          if (idle) {
            const auto until = Clock::now() + std::chrono::duration<double>(idle_seconds);
            while (!stop && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            return;
          }
          while (!go) std::this_thread::sleep_for(std::chrono::microseconds(200));
          const auto start = Clock::now();
          const std::chrono::microseconds att(attention_us);
          bench::LayerCounts counts;
          bench::run_layers(c, slot, shape.layers, batch, micro, mode, att, stop, fill,
                            [&](double s) { res.moe_ms.push_back(1e3 * s); }, counts);
          res.forwards += counts.forwards, res.rows += counts.rows;
          res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        } catch (const std::exception& e) {
          errors[std::size_t(t)] = e.what();
          ++connected;
          stop = true;
        }
      });
    while (connected < clients && !stop) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (idle && !stop) {
      fmt::print("connected {}\n", clients);
      std::fflush(stdout);
    }
    if (!idle) {
      if (start_at_ms > 0) {
        const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(start_at_ms));
        if (std::chrono::system_clock::now() > at)
          fmt::print(stderr, "bench_front_door_network: connected {} ms after --start-at-ms\n",
                     std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now() - at).count());
        std::this_thread::sleep_until(at);
      }
      go = true;
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      stop = true;
    }
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (!e.empty()) throw std::runtime_error(e);
    if (idle) return 0;
    Result all;
    double secs = 0;
    for (const Result& r : results) {
      all.forwards += r.forwards, all.rows += r.rows, secs += r.seconds / clients;
      all.moe_ms.insert(all.moe_ms.end(), r.moe_ms.begin(), r.moe_ms.end());
    }
    double mean = 0;
    for (double v : all.moe_ms) mean += v / double(all.moe_ms.size());
    // tokens/s: rows through every layer, per second, over all clients.
    fmt::print("clients={} mode={} rows={} forwards={} tokens_per_s={:.1f} layer_ms_p50={:.3f} layer_ms_mean={:.3f} "
               "layer_ms_p90={:.3f} hash={:016x}\n",
               clients, mode, batch, all.forwards, double(all.rows) / shape.layers / secs,
               percentile(all.moe_ms, 0.5), mean, percentile(all.moe_ms, 0.9), results[0].hash);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_front_door_network: {}\n", e.what());
    return 1;
  }
}
