// Serving-core benchmark: moed's step against the compute bound measured in
// the same run, on the same cores.
//
// The bound of a step is the time each rank takes to run, with OpenBLAS and
// nothing else, the expert GEMMs of the experts it holds at that step's real
// row counts (per expert: X·W1ᵀ, X·W3ᵀ, A·W2ᵀ, one sgemm each), all ranks
// at once; the slowest rank's time is the step's bound. moed's ratio is bound
// over its measured step time (1.0 = no overhead beyond the GEMMs). A second
// bound replays the GEMM calls moed actually issues (row chunks, W1 and W3
// fused, moed's kernel) to separate the cost of those choices from routing and
// communication. A shared expert (DeepSeek-V3, Qwen2-MoE) runs on each
// rank's own rows: the bound counts its three sgemms on those rows too.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>
#include <iostream>

#include "comm/mpi/mpi_session.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/summary_stats.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/gemm.h"
#include "runtime/daemon/daemon.h"

namespace {

using namespace moed;
using namespace moed::runtime;

// Row-major copies of the held experts' weights, for OpenBLAS (the store
// holds them packed for the fixed-order GEMM).
struct RowMajorExperts {
  std::map<std::pair<int, int>, std::vector<float>> slots;  // (layer, expert) -> W1|W3 then W2
  const std::vector<float>& of(const ExpertStore& store, int l, int e) {
    auto [it, added] = slots.try_emplace({l, e});
    if (added) {  // the bench serves fp32 experts: a slot's bytes are W1|W3 then W2 as floats
      it->second.resize(store.slot_bytes() / sizeof(float));
      store.copy_slot(l, e, reinterpret_cast<std::uint8_t*>(it->second.data()));
    }
    return it->second;
  }
  std::map<int, std::vector<float>> shared_slots;  // layer -> the shared expert's W1|W3 then W2
  const std::vector<float>& shared(const ExpertStore& store, int l) {
    auto [it, added] = shared_slots.try_emplace(l);
    if (added) {
      const kernels::ExpertView v = store.shared_expert(l);
      it->second.resize(3 * v.hidden * v.ffn);
      v.w13_packed->unpack(it->second.data());
      v.w2_packed->unpack(it->second.data() + 2 * v.hidden * v.ffn);
    }
    return it->second;
  }
};

// Seconds this rank spends on its experts' GEMMs for one step's loads: the
// bound (OpenBLAS, one sgemm each for W1, W3 and W2 over all of an expert's
// rows), or the calls moed issued in that step (`calls`: rows per call; W1|W3
// fused, then W2, with moed's kernel, fixed-order or OpenBLAS).
double gemm_seconds(const ExpertStore& store, const placement::Placement& placement, int rank,
                    const StepRecord& rec, std::size_t local_rows, const std::vector<std::uint32_t>* calls,
                    RowMajorExperts& row_major,
                    std::vector<float>& a, std::vector<float>& b) {
  const ModelShape& s = store.shape();
  const std::size_t H = s.hidden, F = s.ffn;
  // Room for `rows` rows of the widest operand: an input or output row [H],
  // or the up-projection's [2 x ffn].
  const auto fit = [&](std::size_t rows, std::size_t ffn) {
    const std::size_t n = rows * std::max(H, 2 * ffn);
    a.resize(std::max(a.size(), n));
    b.resize(std::max(b.size(), n));
  };
  double total = 0;
  if (calls) {  // every expert has the same shape: replay with the first one held here
    for (int l = 0; l < s.layers; ++l) {
      const std::vector<int> held = placement.experts_on(l, rank);
      if (held.empty()) continue;
      const kernels::ExpertView served = store.expert(l, held[0]);
      const float* w13 = row_major.of(store, l, held[0]).data();
      const float* w2 = w13 + 2 * F * H;
      for (std::uint32_t m : *calls) {
        fit(m, F);
        const double t0 = now_seconds();
        if (served.w13_packed) {
          kernels::gemm_fixed_order(a.data(), m, *served.w13_packed, b.data());
          kernels::gemm_fixed_order(b.data(), m, *served.w2_packed, a.data(), 2 * F);
        } else {
          kernels::gemm_xwt(a.data(), m, H, w13, 2 * F, b.data());
          kernels::gemm_xwt(b.data(), m, F, w2, H, a.data(), 2 * F);
        }
        total += now_seconds() - t0;
      }
      return total;  // the calls cover every layer
    }
    return total;
  }
  for (int l = 0; l < s.layers && store.has_shared(); ++l) {
    const std::size_t rows = local_rows, Fs = std::size_t(s.spec.shared_ffn);
    const std::vector<float>& w = row_major.shared(store, l);
    fit(rows, Fs);
    const double t0 = now_seconds();
    kernels::gemm_xwt(a.data(), rows, H, w.data(), Fs, b.data());                   // W1
    kernels::gemm_xwt(a.data(), rows, H, w.data() + Fs * H, Fs, b.data());          // W3
    kernels::gemm_xwt(b.data(), rows, Fs, w.data() + 2 * Fs * H, H, a.data());      // W2
    total += now_seconds() - t0;
  }
  for (int l = 0; l < s.layers; ++l) {
    for (int e : placement.experts_on(l, rank)) {
      std::size_t rows = rec.expert_load[std::size_t(l) * s.experts + e];
      rows /= placement.replicas(l, e).size();  // an even share when replicated
      if (rows == 0) continue;
      const float* w13 = row_major.of(store, l, e).data();
      const float* w2 = w13 + 2 * F * H;
      fit(rows, F);
      const double t0 = now_seconds();
      kernels::gemm_xwt(a.data(), rows, H, w13, F, b.data());          // W1
      kernels::gemm_xwt(a.data(), rows, H, w13 + F * H, F, b.data());  // W3
      kernels::gemm_xwt(b.data(), rows, F, w2, H, a.data());           // W2
      total += now_seconds() - t0;
    }
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, label = "moed";
  std::vector<std::string> overrides;
  CLI::App app{"bench_serving: moed's step time against the OpenBLAS compute bound"};
  app.add_option("-c,--config", config_path, "moed config");
  app.add_option("--set", overrides, "config override section.key=value (repeatable)");
  app.add_option("--label", label, "name of this case in the printed figures");
  CLI11_PARSE(app, argc, argv);

  try {
    Config config = load_config(config_path, overrides);
    comm::MpiSession mpi(&argc, &argv);
    init_logging(mpi.rank(), config.log.level);
    Daemon::Started started = Daemon::start(config, ServeOptions{}, mpi);
    if (!started.daemon) return started.exit_code;
    Daemon* daemon = started.daemon.get();

    // Each measured step is followed at once by its bounds, every rank at
    // once as when serving, so that drift in the machine's speed hits both.
    std::vector<float> a, b;
    RowMajorExperts row_major;
    std::vector<double> ratio, ratio_served, moed_ms, engine_ms, bound_ms, served_ms, overhead_ms;
    StepRecord rec;
    for (std::uint64_t step = 0;; ++step) {
      // A step's wall time: the whole serve_step (boundary, engine,
      // reductions, figures), as the daemon's loop runs it.
      daemon->control().all_max(0, "step barrier");
      const double started = now_seconds();
      if (!daemon->serve_step(step, &rec)) break;
      double wall = now_seconds() - started;
      daemon->control().reduce_max(&wall, 1, "step wall time");
      if (step < std::uint64_t(config.workload.warmup_steps)) continue;
      const std::vector<std::uint32_t> calls = daemon->engine().calls_of_last_step();
      double t[2] = {0, 0};
      for (int pass = 0; pass < 2; ++pass) {
        daemon->control().all_max(0, "bound barrier");
        t[pass] = gemm_seconds(daemon->store(), daemon->placement(), mpi.rank(), rec, daemon->engine().local_tokens(),
                               pass == 1 ? &calls : nullptr, row_major, a, b);
      }
      daemon->control().reduce_max(t, 2, "bound figures");
      overhead_ms.push_back((wall - t[1]) * 1e3);
      moed_ms.push_back(wall * 1e3);
      engine_ms.push_back(rec.total * 1e3);
      bound_ms.push_back(t[0] * 1e3);
      served_ms.push_back(t[1] * 1e3);
      ratio.push_back(t[0] / wall);
      ratio_served.push_back(t[1] / wall);
    }
    if (mpi.rank() == 0) {
      Summary s = daemon->report().summary();
      double tokens = double(config.workload.tokens_per_step);
      const double moed_tokens_per_s = tokens / (percentile(moed_ms, 0.5) / 1e3);
      std::cout << fmt::format(
          "{}: {} ranks, {} tokens/step ({}/rank), {} measured steps\n"
          "  moed            {:9.0f} tokens/s   step p50 {:8.2f} ms  (wall time of a whole step; the engine alone {:.2f} ms)\n"
          "  compute bound   {:9.0f} tokens/s   step p50 {:8.2f} ms  (OpenBLAS sgemm, W1/W3/W2 per expert, the shared expert's too)\n"
          "  ratio           {:9.3f}            (bound / moed step wall time, median over steps)\n"
          "  served GEMMs    {:9.0f} tokens/s   step p50 {:8.2f} ms  (the routed experts' calls moed issued in each step, replayed alone, {}; {:.3f} of the step's wall time)\n"
          "  overhead        {:9.2f} ms per step  (step wall time minus its served GEMMs, median over steps)\n"
          "  phases per step route {:.2f} | plan {:.2f} | experts {:.2f} | shared {:.2f} | other {:.2f} | idle for rows {:.2f} | idle for answers {:.2f} ms  (mean; each maxed over ranks)\n"
          "  router          {:9.3f} of the engine's step  (route: the norm, the gate GEMM and the selection, {})\n"
          "  shared expert   {:9.3f} of the engine's step  ({})\n"
          "  copies          {:.1f} MB per step  (all ranks: rows packed into messages, gathered for GEMMs, fp32 answers, answers narrowed)\n",
          label, mpi.size(), config.workload.tokens_per_step,
          config.workload.tokens_per_step / mpi.size(), moed_ms.size(), moed_tokens_per_s,
          percentile(moed_ms, 0.5), percentile(engine_ms, 0.5), tokens / (percentile(bound_ms, 0.5) / 1e3),
          percentile(bound_ms, 0.5), percentile(ratio, 0.5),
          tokens / (percentile(served_ms, 0.5) / 1e3), percentile(served_ms, 0.5),
          config.experts.gemm == Gemm::openblas ? "OpenBLAS" : "fixed-order " + kernels::to_string(kernels::gemm_isa()),
          percentile(ratio_served, 0.5), percentile(overhead_ms, 0.5), s.route_ms, s.plan_ms, s.experts_ms,
          s.shared_ms, s.other_ms, s.rows_wait_ms, s.answers_wait_ms, s.route_ms / s.engine_ms,
          fmt::format("{} experts, top-{}, {}", config.model.experts, config.model.top_k,
                      name_of(daemon->store().shape().spec.family)),
          s.shared_ms / s.engine_ms,
          daemon->store().has_shared()
              ? fmt::format("F = {} on each rank's own rows, {:.2f} ms per step", daemon->store().shape().spec.shared_ffn,
                            s.shared_ms)
              : std::string("none in this family"),
          s.bytes_copied / 1e6);
    }
    return 0;
  } catch (const moed::Error& e) {
    std::cerr << "bench_serving: " << e.describe() << "\n";
    return e.exit_code();
  }
}
