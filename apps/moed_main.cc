// moed: the expert worker daemon. One rank per GPU (or CPU socket share),
// started by mpirun or srun; run alone it serves as a single rank.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "comm/mpi/mpi_session.h"
#include "common/error.h"
#include "common/log.h"
#include "runtime/config/config.h"
#include "runtime/daemon/daemon.h"
#include "runtime/config/memory_estimate.h"
#include "runtime/weights/synthetic_model.h"

namespace {

struct Cli {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string weights, family, placement_file, log_level;
  bool print_config = false, print_topology = false;
  std::string generate_weights;
  std::string join;
  moed::runtime::ServeOptions serve;
};

int generate_weights(const moed::runtime::Config& c, const std::string& path) {
  moed::runtime::refuse_if_too_large(moed::runtime::estimate_generate_memory(c), 1, "--generate-weights");
  moed::runtime::SyntheticModel model{moed::runtime::ModelShape::from(c.model),
                                      std::uint64_t(c.model.seed),
                                      *moed::weights::parse_dtype(c.model.dtype)};
  // The experts in [experts].dtype when it is a format checkpoints ship (fp8, mxfp4).
  moed::kernels::WeightDtype experts = moed::kernels::WeightDtype::f32;
  moed::kernels::parse_weight_dtype(moed::runtime::experts_dtype(c), &experts);
  const bool shipped = experts == moed::kernels::WeightDtype::fp8 || experts == moed::kernels::WeightDtype::mxfp4;
  model.write(path, c.model.norm_eps, shipped ? experts : moed::kernels::WeightDtype::f32);
  std::cout << fmt::format("wrote {}: synthetic {} {}{}, {}{}, seed {}\n", path,
                           moed::runtime::name_of(model.shape().spec.family), model.shape().describe(),
                           model.shape().spec.describe_dense().empty() ? "" : " (" + model.shape().spec.describe_dense() + ")",
                           c.model.dtype, shipped ? fmt::format(", experts in {}", moed::kernels::to_string(experts)) : "",
                           c.model.seed);
  return 0;
}

// A rank that failed while serving: MPI_Abort ends every rank (peers may be
// blocked on this one), and under elastic serving it must not: Open MPI's
// MPI_Abort kills every process even under mpirun --enable-recovery
// (measured), so a rank cut off with a minority would end the majority that
// goes on. There the rank leaves alone (MPI_Finalize would wait for peers),
// and the others see it as lost.
int end_after_error(moed::comm::MpiSession* mpi, const moed::runtime::Config& config, int code) {
  if (!mpi) return code;
  moed::runtime::note_exit_status(mpi->rank(), code);
  if (mpi->size() > 1 && !config.comm.elastic) mpi->abort(code);
  if (mpi->size() > 1) moed::exit_now(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // The network front door's listeners bind with SO_REUSEADDR, so that a
  // daemon restarted under moed-mpirun --restart listens on its port again
  // while its old connections linger in TIME_WAIT. UCX reads this from the
  // environment only (ucp_config_modify does not reach its TCP connection
  // manager); set here, before any thread, unless the user chose.
  ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
  Cli cli;
  CLI::App app{
      "moed: serves the expert layers of a Mixture-of-Experts model with expert parallelism.\n"
      "Launch one rank per GPU: mpirun -np N moed [options]. Exit codes: 0 ok, 1 runtime "
      "failure, 2 bad usage or input."};
  app.add_option("-c,--config", cli.config_path, "TOML config file (defaults: --print-config)")
      ->type_name("FILE");
  app.add_option("--set", cli.overrides, "override a config key (repeatable)")
      ->type_name("SECTION.KEY=VALUE");
  app.add_option("--weights", cli.weights, "shortcut for --set model.weights=PATH")->type_name("PATH");
  app.add_option("--family", cli.family,
                 "shortcut for --set model.family=NAME: mixtral, deepseek_v3, qwen3_moe, qwen2_moe, olmoe or gpt_oss")
      ->type_name("NAME");
  app.add_option("--placement", cli.placement_file, "shortcut for --set placement.file=PATH")
      ->type_name("FILE");
  app.add_option("--log-level", cli.log_level, "trace, debug, info, warn, error or off")
      ->type_name("LEVEL");
  app.add_flag("--print-config", cli.print_config, "print the effective config as TOML and exit");
  app.add_flag("--print-topology", cli.print_topology,
               "print the islands found (config, hwloc NVLink or host names) and every host's GPUs, and exit");
  app.add_option("--generate-weights", cli.generate_weights,
                 "write the synthetic model of the configured family and shape as a checkpoint directory "
                 "(config.json and model.safetensors in the family's names), or as one file for a PATH "
                 "ending in .safetensors, and exit")
      ->type_name("PATH");
  app.add_option("--join", cli.join,
                 "join a running job, outside MPI, at its [comm].join_listen (the job's config and key file): "
                 "this process takes a join slot, is admitted, and takes its share of the experts by migration")
      ->type_name("HOST:PORT");
  app.add_option("--dump-output", cli.serve.dump_output,
                 "write the final hidden states of all tokens, in global order, to PATH")
      ->type_name("PATH");
  app.add_option("--report-json", cli.serve.report_json, "write the run's figures as JSON to PATH")
      ->type_name("PATH");
  app.set_version_flag("--version", "moed 0.1.0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help/version or the error
    return code == 0 ? 0 : 2;
  }

  moed::runtime::Config config;
  try {
    if (!cli.weights.empty()) cli.overrides.push_back("model.weights=" + cli.weights);
    if (!cli.family.empty()) cli.overrides.push_back("model.family=" + cli.family);
    if (!cli.placement_file.empty()) cli.overrides.push_back("placement.file=" + cli.placement_file);
    if (!cli.log_level.empty()) cli.overrides.push_back("log.level=" + cli.log_level);
    // Writing weights needs only the model's keys to agree: a workload's
    // check (say hot_ratio at a larger top_k) must not refuse it.
    config = moed::runtime::load_config(cli.config_path, cli.overrides,
                                        cli.generate_weights.empty() || cli.print_config
                                            ? moed::runtime::ConfigUse::serve
                                            : moed::runtime::ConfigUse::write_weights);
    if (cli.print_config) {
      moed::runtime::print_config(std::cout, config);
      return 0;
    }
    if (!cli.generate_weights.empty()) {
      moed::init_logging(-1, config.log.level);
      return generate_weights(config, cli.generate_weights);
    }
  } catch (const moed::Error& e) {
    std::cerr << "moed: " << e.describe() << "\n";
    return e.exit_code();
  }

  if (!cli.join.empty()) {
    // A process started after the job: no MPI here (its launcher did not start it).
    try {
      if (cli.print_topology) throw moed::Error(moed::ErrorKind::Usage, "--join and --print-topology: choose one", __FILE__, __LINE__);
      moed::init_logging(-1, config.log.level);
      moed::runtime::serve_joined(config, cli.serve, cli.join);
    } catch (const moed::Error& e) {
      spdlog::critical("moed --join {}: {}", cli.join, e.describe());
      return e.exit_code();
    } catch (const std::exception& e) {
      spdlog::critical("moed --join {}: {}", cli.join, e.what());
      return 1;
    }
  }

  std::unique_ptr<moed::comm::MpiSession> mpi;
  try {
    mpi = std::make_unique<moed::comm::MpiSession>(&argc, &argv);
    moed::init_logging(mpi->rank(), config.log.level);
    if (cli.print_topology) return moed::runtime::print_topology(config, *mpi);
    const int code = moed::runtime::serve(config, cli.serve, *mpi);
    moed::runtime::note_exit_status(mpi->rank(), code);
    return code;
  } catch (const moed::Error& e) {
    spdlog::critical("{}", e.describe());
    return end_after_error(mpi.get(), config, e.exit_code());
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return end_after_error(mpi.get(), config, 1);
  }
}
