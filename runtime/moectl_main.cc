// moectl: the operator's client of a running moed's admin socket.
#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{
      "moectl: controls a running moed through its admin socket.\n"
      "Commands: status, metrics, placement, stats, reoptimize, migrate, trace, drain, shutdown.\n"
      "Exit codes: 0 ok, 1 error from the daemon, 2 bad usage, 3 cannot connect."};
  app.require_subcommand(1);
  for (const char* name : {"status", "metrics", "placement", "stats", "reoptimize", "migrate",
                           "trace", "drain", "shutdown"})
    app.add_subcommand(name, std::string("the daemon's ") + name);
  app.set_version_flag("--version", "moectl 0.1.0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  // The admin socket is not served yet: say so plainly rather than pretend.
  std::cerr << "moectl: cannot connect: this moed build has no admin socket yet\n";
  return 3;
}
