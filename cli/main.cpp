// twin: a digital twin of large-scale Transformer training.
//   twin graph SCENARIO   the Program: ranks, ops, FLOPs, parameters, memory
//   twin sim SCENARIO     simulate one iteration on a model of the cluster (SimGrid)
//   twin run SCENARIO     train for real (CPU threads or MPI ranks; CUDA)
//   twin compare P M      a prediction next to a measurement
//   twin search SCENARIO  simulate every parallel plan that fits and rank them
//   twin sweep SCENARIO   simulate the scenario at each value of a key (--vary cluster.nodes=280,350,420)
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "model/errors.hpp"

int main(int argc, char** argv) {
  CLI::App app{"twin: a digital twin of large-scale Transformer training (simulate or run one shared Program)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "twin 0.1.0");
  twin::cli::register_graph_command(app);
#ifdef TWIN_HAVE_SIMGRID
  twin::cli::register_sim_command(app);
  twin::cli::register_search_command(app);
  twin::cli::register_sweep_command(app);
#endif
#ifdef TWIN_HAVE_RUN_COMMAND
  twin::cli::register_run_command(app);
#endif
  twin::cli::register_compare_command(app);
  // CLI11 would answer "A subcommand is required" to a misspelt one: name it and the commands there are.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* command : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + command->get_name();
      found |= command->get_name() == argv[1];
    }
    if (!found) {
      fmt::print(stderr, "twin: error: unknown command '{}' (the commands: {}; twin --help)\n", argv[1], known);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& error) {  // a command that failed after reporting why (a failed run: 1)
    return error.get_exit_code();
  } catch (const CLI::ParseError& error) {
    const int status = app.exit(error);  // prints the help, the version or the mistake
    return status == 0 ? 0 : 2;          // every mistake in what was typed exits 2, as the errors below
  } catch (const std::exception& error) {  // the one mapping of errors to lines and statuses: model/errors.hpp
    for (const std::string& line : twin::error_lines(error)) fmt::print(stderr, "twin: {}\n", line);
    return twin::exit_status(error);
  }
  // What was printed may still sit in stdout's buffer: a report that never reached its file (a full disk, a closed
  // pipe) is a failure, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const std::string message = fmt::format("twin: error: writing standard output failed: {}\n", std::strerror(errno));
    std::fputs(message.c_str(), stderr);  // no exception if stderr is broken too
    return 1;
  }
  return 0;
}
