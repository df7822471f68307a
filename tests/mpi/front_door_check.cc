// A test client of the front door: serves a fixed set of requests through
// moed's ranks in one of several ways and writes every request's outputs,
// in request order, to a file. Runs that serve the same requests must write
// the same bytes, however the requests were batched.
//
//   front_door_check --dir DIR --ranks R --mode serial|concurrent|shuffled --out FILE
//                    [--requests N] [--seed S] [--clients-per-rank C]
//                    [--pause-after N --resume-file F] [--first-layer L] [--latencies FILE] [--rounds K]
//   front_door_check --dir DIR --ranks R --mode decode --positions P --out FILE [--drift D]
//   front_door_check --dir DIR --mode hold      (submits, then waits to be killed)
//   front_door_check --dir DIR --ranks R --mode workload --config C [--set K=V]... --out FILE
//
// --latencies FILE (serial): one line per request as it is answered: its
// start (seconds since the epoch, wall clock) and how long it took (ms),
// for a benchmark that looks at the latencies around an event. --rounds K
// (serial): the requests served K times over, one at a time.
//
// --key-file K: through the ranks' network doors (the addresses each rank
// lists in DIR/moed-ingress-<rank>.ucx), proving key K. --all-homes (with
// --key-file): every client has every rank's door as a home, its own rank's
// first, and fails over to the others when one is lost; a door that lists
// no address (its rank left, elastic serving) is left out of the homes.
//
// Request r has 1 + (hash % 48) rows at a layer from hash among the model's
// layers L .. (--first-layer L, 0 by default: a model whose first layers are
// dense sends moed only the MoE layers after them), with request id
// r and positions 0.., values from a counter-based generator. serial: one
// client on rank 0, one request at a time. concurrent: C clients per rank,
// each on its own thread, request r on client r mod (C x R), as many in
// flight as the client has slots. shuffled: the same, each client's requests
// in a shuffled order. --pause-after N: once N requests are answered in all,
// every client stops before its next wait, with its submits in flight; when
// all have stopped, "paused" is printed, and they go on once the file F
// exists. A test acts there (kills a rank) mid-run by construction.
//
// decode: every request is a sequence of P positions, and position p of a
// request goes through every layer before its position p + 1, as a model
// decodes. C clients per rank each submit their requests' rows of one
// position and layer together. A position's row is its request's own
// direction plus a share D (the drift) of a direction of its own, so that a
// request's consecutive positions mostly route alike: what the router's
// smoothing works on, through the request ids and positions of the rows.
// The file holds request by request, position by position, layer by layer.
//
// workload: the tokens of moed's own workload ([workload] of config C, with
// the --set overrides moed is given), each step's through every MoE layer in
// turn, step s on client s mod (C x R), the clients on threads. The file is
// what `moed --dump-output` writes for that config, so that the built-in
// workload and either door compare with cmp.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "client/client.h"
#include "common/rng.h"
#include "runtime/config/config.h"
#include "runtime/daemon/output_dump.h"
#include "runtime/weights/model.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/synthetic_model.h"
#include "runtime/workload/workload.h"

namespace {

using moed::client::Client;

struct Request {
  std::uint32_t layer = 0, rows = 0;
  std::vector<float> x, y;
};

std::vector<Request> make_requests(int count, std::uint64_t seed, int first_layer, int layers, int hidden) {
  std::vector<Request> out(static_cast<std::size_t>(count));
  for (int r = 0; r < count; ++r) {
    const std::uint64_t h = moed::hash_combine(seed, std::uint64_t(r));
    Request& q = out[std::size_t(r)];
    q.layer = std::uint32_t(first_layer) + std::uint32_t(h % std::uint64_t(layers - first_layer));
    q.rows = 1 + std::uint32_t((h >> 20) % 48);
    q.x.resize(std::size_t(q.rows) * std::size_t(hidden));
    const moed::CounterRng rng(h);
    for (std::size_t i = 0; i < q.x.size(); ++i) q.x[i] = rng.normalish(i);
    q.y.resize(q.x.size());
  }
  return out;
}

// The pause point of --pause-after (above), shared by the client threads.
class Pause {
 public:
  Pause(int after, std::string resume_file, int clients)
      : after_(after), resume_file_(std::move(resume_file)), active_(clients) {}
  void answered() { ++answered_; }
  // Before each wait: blocks while the run is paused.
  void point() {
    if (after_ < 0 || answered_ < after_) return;
    std::unique_lock lock(mu_);
    if (resumed_) return;
    ++stopped_;
    resume_when_all_stopped();
    resumed_cv_.wait(lock, [&] { return resumed_; });
  }
  // One client's part, for its whole run: when it ends (its share done, or
  // failed), the others do not wait for it.
  class Member {
   public:
    explicit Member(Pause& pause) : pause_(pause) {}
    ~Member() {
      std::unique_lock lock(pause_.mu_);
      --pause_.active_;
      pause_.resume_when_all_stopped();
    }

   private:
    Pause& pause_;
  };

 private:
  // With mu_ held: the last client to stop says so and waits for the file.
  void resume_when_all_stopped() {
    if (resumed_ || stopped_ == 0 || stopped_ < active_) return;
    std::cout << "paused after " << answered_ << " requests" << std::endl;
    while (!std::filesystem::exists(resume_file_)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    resumed_ = true;
    resumed_cv_.notify_all();
  }

  const int after_;
  const std::string resume_file_;
  std::atomic<int> answered_{0};
  std::mutex mu_;
  std::condition_variable resumed_cv_;
  int active_, stopped_ = 0;
  bool resumed_ = false;
};

// One client serving its share, keeping up to its slots in flight.
void serve(Client& c, std::vector<Request>& requests, const std::vector<int>& mine, Pause& pause) {
  std::vector<int> in_slot(std::size_t(c.slots()), -1);
  std::size_t next = 0, done = 0;
  while (done < mine.size()) {
    for (int s = 0; s < c.slots() && next < mine.size(); ++s) {
      if (in_slot[std::size_t(s)] >= 0) continue;
      const int r = mine[next++];
      Request& q = requests[std::size_t(r)];
      const int slot = c.acquire();
      std::memcpy(c.rows(slot), q.x.data(), q.x.size() * sizeof(float));
      for (std::uint32_t i = 0; i < q.rows; ++i) c.request_ids(slot)[i] = std::uint64_t(r), c.positions(slot)[i] = i;
      c.submit(slot, int(q.layer), q.rows);
      in_slot[std::size_t(slot)] = r;
    }
    pause.point();
    for (int s = 0; s < c.slots(); ++s) {
      const int r = in_slot[std::size_t(s)];
      if (r < 0) continue;
      c.wait(s);
      std::memcpy(requests[std::size_t(r)].y.data(), c.rows(s), requests[std::size_t(r)].y.size() * sizeof(float));
      c.release(s);
      in_slot[std::size_t(s)] = -1;
      ++done;
      pause.answered();
      break;  // refill before waiting again: keep the slots busy
    }
  }
}

// The row of request r's position p at layer l (decode mode).
void decode_row(std::uint64_t seed, int r, std::uint32_t p, int l, float drift, int hidden, float* row) {
  const std::uint64_t own = moed::hash_combine(seed, moed::hash_combine(std::uint64_t(r), std::uint64_t(l)));
  const moed::CounterRng base(own), step(moed::hash_combine(own, 0x9e3779b9ull + p));
  const float keep = std::sqrt(1.0f - drift * drift);
  for (int i = 0; i < hidden; ++i) row[i] = keep * base.normalish(std::uint64_t(i)) + drift * step.normalish(std::uint64_t(i));
}

// One client decoding its requests (decode mode): out holds every request's
// positions x layers x hidden.
void decode(Client& c, const std::vector<int>& mine, int positions, std::uint64_t seed, float drift,
            std::vector<float>& out) {
  const int L = c.layers(), H = c.hidden();
  const std::size_t per_request = std::size_t(positions) * std::size_t(L) * std::size_t(H);
  for (int p = 0; p < positions; ++p)
    for (int l = 0; l < L; ++l) {
      const int slot = c.acquire();
      float* rows = static_cast<float*>(c.rows(slot));
      for (std::size_t i = 0; i < mine.size(); ++i) {
        decode_row(seed, mine[i], std::uint32_t(p), l, drift, H, rows + i * std::size_t(H));
        c.request_ids(slot)[i] = std::uint64_t(mine[i]);
        c.positions(slot)[i] = std::uint32_t(p);
      }
      c.submit(slot, l, std::uint32_t(mine.size()));
      c.wait(slot);
      for (std::size_t i = 0; i < mine.size(); ++i)
        std::memcpy(out.data() + std::size_t(mine[i]) * per_request + (std::size_t(p) * L + l) * H,
                    rows + i * std::size_t(H), std::size_t(H) * sizeof(float));
      c.release(slot);
    }
}

// Layer 0's router [experts, hidden], from which the synthetic workload aims its tokens.
std::vector<float> first_gate(const moed::runtime::Config& c, const moed::runtime::ModelShape& s) {
  using namespace moed::runtime;
  const int layer = s.spec.model_layer(0);
  const moed::weights::DType dtype = *moed::weights::parse_dtype(c.model.dtype);
  std::vector<float> gate(std::size_t(s.experts) * std::size_t(s.hidden));
  if (c.model.weights.empty())
    SyntheticModel(s, std::uint64_t(c.model.seed), dtype).gate(layer, gate.data());
  else
    moed::weights::Checkpoint(c.model.weights)
        .read_f32(TensorNames(s.spec.family).gate(layer), dtype, gate_shape(s), gate.data());
  return gate;
}

// Runs work(i) for every client i on its own thread; rethrows the first error.
template <class Work>
void on_threads(int n, Work work) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        work(i);
      } catch (const std::exception& e) {
        errors[std::size_t(i)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
}

// Rank `rank`'s front door: its socket, or with a key file, the first
// network address it lists in <dir>/moed-ingress-<rank>.ucx.
std::string door_of(const std::string& dir, int rank, const std::string& key_file) {
  const std::string base = dir + "/moed-ingress-" + std::to_string(rank);
  if (key_file.empty()) return base + ".sock";
  std::ifstream listed(base + ".ucx");
  std::string address;
  if (!std::getline(listed, address) || address.empty())
    throw std::runtime_error(base + ".ucx lists no network address (is [ingress].listen set?)");
  return address;
}

// The workload mode (above): every step's outputs, written as moed --dump-output writes them.
void serve_workload(std::vector<std::unique_ptr<Client>>& clients, const std::string& config_path,
                    const std::vector<std::string>& overrides, const std::string& out) {
  using namespace moed::runtime;
  const Config c = load_config(config_path, overrides);
  const ModelShape s = ModelShape::from(c.model);
  if (c.model.serve_dense && !s.spec.dense_layers().empty())
    throw std::runtime_error("the config serves dense layers, which the front door does not take");
  if (clients[0]->hidden() != s.hidden)
    throw std::runtime_error("the daemons serve hidden " + std::to_string(clients[0]->hidden()) + ", the config " +
                             std::to_string(s.hidden) + ": not the same model");
  const std::vector<float> gate = first_gate(c, s);
  const std::unique_ptr<Workload> workload = make_workload(c, gate.data());
  if (!workload || workload->replays_routing())
    throw std::runtime_error("[workload].kind must be synthetic: the front door routes rows itself");
  const std::size_t N = std::size_t(c.workload.tokens_per_step), steps = std::size_t(c.workload.steps),
                    H = std::size_t(s.hidden);
  std::vector<float> y(steps * N * H);
  const int n = int(clients.size());
  on_threads(n, [&](int i) {
    std::vector<std::uint64_t> ids(N);
    const std::vector<std::uint32_t> positions(N, 0);
    for (std::size_t step = std::size_t(i); step < steps; step += std::size_t(n)) {
      float* x = y.data() + step * N * H;
      workload->tokens(step * N, N, x);
      for (std::size_t t = 0; t < N; ++t) ids[t] = step * N + t;
      for (int l = 0; l < s.layers; ++l)
        clients[std::size_t(i)]->forward(s.spec.model_layer(l), x, N, ids.data(), positions.data(), x);
    }
  });
  OutputDump dump(out, {H, N, steps});
  dump.append(y.data(), y.size() * sizeof(float));
  dump.finish();
  std::cout << "served the workload's " << steps << " steps of " << N << " tokens over " << n << " client"
            << (n == 1 ? "" : "s") << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"front_door_check: serves fixed requests through moed's front door"};
  std::string dir, mode, out;
  int ranks = 1, count = 64, per_rank = 2, first_layer = 0;
  std::uint64_t seed = 7;
  app.add_option("--dir", dir, "[ingress].dir of the daemons")->required();
  app.add_option("--ranks", ranks, "ranks to spread the clients over");
  app.add_option("--mode", mode, "serial, concurrent, shuffled, decode, workload or hold")->required();
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "moed's config (workload)");
  app.add_option("--set", overrides, "a moed --set override of the config (workload)");
  int positions = 8;
  float drift = 0.3f;
  app.add_option("--positions", positions, "positions per request (decode)")->check(CLI::Range(1, 4096));
  app.add_option("--drift", drift, "share of a position's own direction in its row (decode)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--out", out, "file for the outputs");
  app.add_option("--requests", count, "requests to serve");
  app.add_option("--seed", seed, "seed of the requests");
  app.add_option("--clients-per-rank", per_rank, "clients per rank (concurrent, shuffled)");
  app.add_option("--first-layer", first_layer, "the first model layer to send rows to (serial, concurrent, shuffled)")
      ->check(CLI::NonNegativeNumber);
  int pause_after = -1;
  std::string resume_file;
  auto* pause_opt = app.add_option("--pause-after", pause_after, "pause once this many requests are answered")
                        ->check(CLI::NonNegativeNumber);
  app.add_option("--resume-file", resume_file, "go on from the pause once this file exists")->needs(pause_opt);
  pause_opt->needs(app.get_option("--resume-file"));
  std::string latencies;
  app.add_option("--latencies", latencies, "each request's start and latency, a line each (serial)");
  int rounds = 1;
  app.add_option("--rounds", rounds, "serve the requests this many times over (serial; the last round's outputs are written)")
      ->check(CLI::PositiveNumber);
  std::string key_file;
  app.add_option("--key-file", key_file, "connect through the ranks' network doors, proving this key");
  bool all_homes = false;
  app.add_flag("--all-homes", all_homes, "every rank's network door a home of each client")
      ->needs(app.get_option("--key-file"));
  CLI11_PARSE(app, argc, argv);
  moed::client::Options options;
  options.slots = 4, options.max_rows = 64, options.timeout_ms = 60'000, options.key_file = key_file;
  try {
    if (mode == "hold") {
      Client c(door_of(dir, 0, key_file), options);
      const int s = c.acquire();
      std::fill_n(static_cast<float*>(c.rows(s)), c.hidden(), 1.0f);
      c.request_ids(s)[0] = 1, c.positions(s)[0] = 0;
      c.submit(s, 0, 1);
      std::cout << "holding" << std::endl;
      std::this_thread::sleep_for(std::chrono::hours(1));
      return 0;
    }
    std::vector<std::unique_ptr<Client>> clients;
    const int n_clients = mode == "serial" ? 1 : ranks * per_rank;
    for (int i = 0; i < n_clients; ++i) {
      std::vector<std::string> homes;
      std::string closed;  // why the first door left out was
      for (int r = 0; r < (all_homes ? ranks : 1); ++r) {
        try {
          homes.push_back(door_of(dir, (i + r) % ranks, key_file));
        } catch (const std::runtime_error& e) {
          if (!all_homes) throw;
          if (closed.empty()) closed = e.what();
        }
      }
      if (homes.empty()) throw std::runtime_error(closed);
      clients.push_back(homes.size() == 1 ? std::make_unique<Client>(homes[0], options)
                                          : std::make_unique<Client>(homes, options));
    }
    std::vector<std::vector<int>> share(static_cast<std::size_t>(n_clients));
    for (int r = 0; r < count; ++r) share[std::size_t(r % n_clients)].push_back(r);
    if (mode == "workload") {
      if (config_path.empty()) throw std::runtime_error("--mode workload needs --config");
      serve_workload(clients, config_path, overrides, out);
      return 0;
    }
    if (mode == "decode") {
      const std::size_t per_request =
          std::size_t(positions) * std::size_t(clients[0]->layers()) * std::size_t(clients[0]->hidden());
      std::vector<float> y(std::size_t(count) * per_request);
      on_threads(n_clients, [&](int i) {
        decode(*clients[std::size_t(i)], share[std::size_t(i)], positions, seed, drift, y);
      });
      std::FILE* f = std::fopen(out.c_str(), "wb");
      if (!f || std::fwrite(y.data(), sizeof(float), y.size(), f) != y.size() || std::fclose(f) != 0)
        throw std::runtime_error("cannot write " + out);
      std::cout << "decoded " << count << " requests of " << positions << " positions over " << n_clients
                << " client" << (n_clients == 1 ? "" : "s") << "\n";
      return 0;
    }
    if (first_layer >= clients[0]->layers())
      throw std::runtime_error("--first-layer " + std::to_string(first_layer) + ": the model has " +
                               std::to_string(clients[0]->layers()) + " layers");
    std::vector<Request> requests =
        make_requests(count, seed, first_layer, clients[0]->layers(), clients[0]->hidden());
    if (mode == "serial") {
      Pause pause(pause_after, resume_file, 1);
      const Pause::Member member(pause);
      std::ofstream lines;  // written as it goes: a benchmark may stop the client once it has seen enough
      if (!latencies.empty()) {
        lines.open(latencies);
        if (!lines) throw std::runtime_error("cannot write " + latencies);
        lines << std::fixed;
      }
      for (long r = 0; r < long(count) * rounds; ++r) {
        const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        const auto began = std::chrono::steady_clock::now();
        serve(*clients[0], requests, {int(r % count)}, pause);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
        if (lines.is_open()) lines << std::setprecision(6) << wall << ' ' << std::setprecision(3) << ms << std::endl;
      }
    } else if (mode == "concurrent" || mode == "shuffled") {
      if (mode == "shuffled")
        for (std::size_t i = 0; i < share.size(); ++i) std::shuffle(share[i].begin(), share[i].end(), std::mt19937(unsigned(seed + i)));
      Pause pause(pause_after, resume_file, n_clients);
      on_threads(n_clients, [&](int i) {
        const Pause::Member member(pause);
        serve(*clients[std::size_t(i)], requests, share[std::size_t(i)], pause);
      });
    } else {
      std::cerr << "front_door_check: unknown mode " << mode << "\n";
      return 2;
    }
    std::FILE* f = std::fopen(out.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + out);
    std::size_t rows = 0;
    for (const Request& q : requests) {
      std::fwrite(q.y.data(), sizeof(float), q.y.size(), f);
      rows += q.rows;
    }
    std::fclose(f);
    std::cout << "served " << count << " requests (" << rows << " rows) over " << n_clients << " client"
              << (n_clients == 1 ? "" : "s") << " on " << (mode == "serial" ? 1 : ranks) << " rank"
              << (ranks == 1 || mode == "serial" ? "" : "s") << ", " << mode << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "front_door_check: " << e.what() << "\n";
    return 1;
  }
}
