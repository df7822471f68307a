// moectl: the operator's client of a running moed's admin socket. The work is
// in runtime/admin (moectl_format: command line and rendering; admin_client:
// the connection and the run), where it is unit-tested.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/admin/admin_client.h"
#include "runtime/admin/moectl_format.h"

int main(int argc, char** argv) {
  namespace admin = moed::runtime::admin;
  admin::MoectlEnv env;
  if (const char* run_dir = std::getenv("MOED_RUN_DIR")) env.run_dir = run_dir;
  env.uid = static_cast<unsigned>(::geteuid());
  std::error_code ec;
  env.cwd = std::filesystem::current_path(ec).string();

  const std::vector<std::string> args(argv, argv + argc);
  const admin::CommandLine command_line = admin::parse_command_line(args, env);
  std::cout << command_line.out;
  std::cerr << command_line.err;
  if (!command_line.invocation) return command_line.exit_code;

  admin::RunOptions options;
  options.tty = ::isatty(STDOUT_FILENO) == 1;
  return admin::run_moectl(*command_line.invocation, std::cout, std::cerr, options);
}
