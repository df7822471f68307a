// moe-place: placements of experts onto ranks, offline. This build makes
// placements by policy, checks placement files and converts routing traces;
// the optimiser (METIS) and the cost model arrive with the placement service.
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/error.h"
#include "placement/placement.h"
#include "placement/placement_file.h"
#include "placement/routing_trace.h"

namespace {

using namespace moed::placement;

int make(const std::string& policy, int ranks, int layers, int experts, std::uint64_t seed,
         int replicas, const std::string& out) {
  Placement p = make_placement(policy, ranks, layers, experts, seed);
  if (replicas > 0) p = add_random_replicas(std::move(p), replicas, seed);
  p.validate("moe-place make");
  write_placement_file(p, out);
  std::cout << fmt::format("wrote {}: {} placement of {} layers x {} experts on {} ranks{}\n", out,
                           policy, layers, experts, ranks,
                           replicas ? fmt::format(", {} extra replicas per layer", replicas) : "");
  return 0;
}

int check(const std::string& path, int max_slots) {
  Placement p = read_placement_file(path);
  p.validate(path, max_slots);
  std::cout << fmt::format("{}: valid: epoch {}, {} ranks, {} layers x {} experts, at most {} "
                           "slots per rank\n",
                           path, p.epoch(), p.ranks(), p.layers(), p.experts(),
                           p.max_slots_per_rank());
  return 0;
}

int convert_trace(const std::string& from, const std::string& out) {
  RoutingTrace trace = read_trace(from);
  write_trace_file(trace, out);
  std::cout << fmt::format("wrote {}: {} tokens, {} layers, {} experts, top-{}\n", out,
                           trace.tokens(), trace.layers(), trace.experts(), trace.top_k());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-place: expert placements for moed (exit codes: 0 ok, 2 bad usage or input)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moe-place 0.1.0");

  std::string policy = "contiguous", out, path, from;
  int ranks = 0, layers = 0, experts = 0, replicas = 0, max_slots = 0;
  std::uint64_t seed = 1;
  auto* make_cmd = app.add_subcommand("make", "write a placement file built by a policy");
  make_cmd->add_option("--policy", policy, "contiguous, round-robin or shuffled")
      ->check(CLI::IsMember(placement_policy_names()));
  make_cmd->add_option("--ranks", ranks, "ranks")->required()->check(CLI::PositiveNumber);
  make_cmd->add_option("--layers", layers, "MoE layers")->required()->check(CLI::PositiveNumber);
  make_cmd->add_option("--experts", experts, "experts per layer")->required()->check(CLI::PositiveNumber);
  make_cmd->add_option("--seed", seed, "seed of the shuffled policy and of replicas");
  make_cmd->add_option("--replicas", replicas, "extra replicas per layer, on seeded random experts")
      ->check(CLI::NonNegativeNumber);
  make_cmd->add_option("--out", out, "placement file to write")->required();

  auto* check_cmd = app.add_subcommand("check", "validate a placement file");
  check_cmd->add_option("placement", path, "placement file")->required();
  check_cmd->add_option("--max-slots-per-rank", max_slots, "slot capacity per rank (0: unlimited)");

  auto* convert_cmd = app.add_subcommand(
      "convert-trace", "convert routing JSON lines (or a moed trace) into the moed-trace v1 format");
  convert_cmd->add_option("input", from, "JSONL (one object per layer and token) or moed-trace file")
      ->required();
  convert_cmd->add_option("--out", out, "trace file to write")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*make_cmd) return make(policy, ranks, layers, experts, seed, replicas, out);
    if (*check_cmd) return check(path, max_slots);
    if (*convert_cmd) return convert_trace(from, out);
  } catch (const moed::Error& e) {
    std::cerr << "moe-place: " << e.describe() << "\n";
    return e.exit_code();
  }
  return 2;
}
