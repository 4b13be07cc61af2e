// twin: a digital twin of large-scale Transformer training.
//   twin graph SCENARIO   the Program: ranks, ops, FLOPs, parameters, memory
//   twin sim SCENARIO     simulate one iteration on a model of the cluster (SimGrid)
//   twin run SCENARIO     train for real (CPU threads or MPI ranks; CUDA)
//   twin compare P M      a prediction next to a measurement
//   twin search SCENARIO  simulate every parallel plan that fits and rank them
//   twin sweep SCENARIO   simulate the scenario at each value of a key (--vary cluster.nodes=280,350,420)
//   twin goodput SCENARIO useful training time per wall time with interruptions and checkpoints counted
//   twin report FILE      an HTML page of a sim, sweep, search or compare --json file
//   twin completion bash  a bash completion script made from the commands and flags below
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "model/scenario/errors.hpp"

namespace {

// The subcommand named on the command line, if any.
const CLI::App* chosen_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return nullptr;
  for (const CLI::App* command : app.get_subcommands({})) {
    if (command->get_name() == argv[1]) return command;
  }
  return nullptr;
}

// The flags on the command line that `command` does not take ("--lr" of "--lr=1e-4" too).
std::vector<std::string> unknown_flags(const CLI::App& command, int argc, char** argv) {
  std::vector<std::string> unknown;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    arg = arg.substr(0, arg.find('='));
    if (command.get_option_no_throw(arg) == nullptr) unknown.push_back(arg);
  }
  return unknown;
}

// "--a, --b, --c": the flags of one help group of `command`.
std::string flags_of_group(const CLI::App& command, const std::string& group) {
  std::string names;
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_group() != group) continue;
    for (const std::string& name : option->get_lnames()) names += (names.empty() ? "--" : ", --") + name;
  }
  return names;
}

// A pasted Megatron-LM launch line holds flags of the optimizer, the data and the logging beside those of the plan
// (--lr 1e-4, --max-position-embeddings 4096, --use-mcore-models). When the line holds one of `command`'s
// Megatron-style aliases, the flags the command does not take are left out of what is parsed, each with the value
// after it (the next argument, when it does not begin with "-"), and returned in `ignored`. Without an alias on the
// line a flag twin does not know is a typo and fails by name, as before.
std::vector<std::string> without_ignored_megatron_flags(const CLI::App& command, const std::vector<std::string>& args,
                                                        std::vector<std::string>& ignored) {
  bool pasted = false;
  for (std::size_t i = 2; i < args.size() && args[i] != "--"; ++i) {
    const CLI::Option* option = command.get_option_no_throw(args[i].substr(0, args[i].find('=')));
    pasted |= option != nullptr && option->get_group() == "Megatron-style aliases";
  }
  if (!pasted) return args;
  std::vector<std::string> kept(args.begin(), args.begin() + 2);
  for (std::size_t i = 2; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      kept.insert(kept.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    const std::string name = arg.substr(0, arg.find('='));
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0 || command.get_option_no_throw(name) != nullptr) {
      kept.push_back(arg);
      continue;
    }
    ignored.push_back(name);
    if (name == arg && i + 1 < args.size() && !args[i + 1].empty() && args[i + 1][0] != '-') ++i;  // its value
  }
  return kept;
}

// The one note of a pasted line's ignored flags. Once per job: a rank other than 0 of an mpirun / srun job leaves it
// to rank 0, and the ranks `twin run --launcher mpi` starts (its own command line again) to the command that started
// them, which marks the environment they inherit.
void note_ignored_flags(const std::vector<std::string>& ignored) {
  const char* launched_rank = std::getenv("OMPI_COMM_WORLD_RANK") ? std::getenv("OMPI_COMM_WORLD_RANK")
                              : std::getenv("PMI_RANK")           ? std::getenv("PMI_RANK")
                                                                  : std::getenv("SLURM_PROCID");
  const bool noted = std::getenv("TWIN_IGNORED_FLAGS_NOTED") != nullptr;
  if (ignored.empty() || noted || (launched_rank != nullptr && std::atoi(launched_rank) != 0)) return;
  setenv("TWIN_IGNORED_FLAGS_NOTED", "1", 1);
  fmt::print(stderr, "note: ignored {} Megatron-LM flag{} twin does not model: {}\n", ignored.size(),
             ignored.size() > 1 ? "s" : "", fmt::join(ignored, ", "));
}

// CLI11's own messages as one `twin: error:` line: without its "Run with --help" line, its doubled "--flag: --flag:"
// prefix (a validator that names its flag), and with the flags a command takes when one is unknown.
std::string parse_error_line(const CLI::App& app, const CLI::ParseError& error, int argc, char** argv) {
  std::string message = error.what();
  if (const std::size_t colon = message.find(": "); colon != std::string::npos && colon > 0) {
    const std::string prefix = message.substr(0, colon + 2);
    if (message.compare(colon + 2, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
  }
  // "--steps: 1 required INT:>=1 missing" -> "--steps needs a value (INT:>=1)"
  if (const std::size_t at = message.find(": 1 required ");
      at != std::string::npos && message.size() > 8 && message.compare(message.size() - 8, 8, " missing") == 0) {
    const std::string type = message.substr(at + 13, message.size() - 8 - (at + 13));
    message = fmt::format("{} needs a value ({})", message.substr(0, at), type);
  }
  if (message == "A subcommand is required") {
    std::string known;
    for (const CLI::App* command : app.get_subcommands({})) known += (known.empty() ? "" : ", ") + command->get_name();
    return fmt::format("a command is required ({}; twin --help)", known);
  }
  const CLI::App* command = chosen_command(app, argc, argv);
  if (command != nullptr && dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    const std::vector<std::string> unknown = unknown_flags(*command, argc, argv);
    const std::string name = "twin " + command->get_name();
    if (unknown.empty()) return fmt::format("{}: {} (twin {} --help)", name, message, command->get_name());
    std::string line =
        fmt::format("{}: unknown flag{} {}", name, unknown.size() > 1 ? "s" : "", fmt::join(unknown, ", "));
    const std::string megatron = flags_of_group(*command, "Megatron-style aliases");
    if (!megatron.empty()) {
      line += fmt::format(" (of Megatron-LM's flags, twin takes only those of the plan and the model: {}; ", megatron);
    } else {
      line += " (";
    }
    return line + fmt::format("{} --help lists every flag)", name);
  }
  return message;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"twin: a digital twin of large-scale Transformer training (simulate or run one shared Program)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "twin 0.1.0");
  twin::cli::register_graph_command(app);
#ifdef TWIN_HAVE_SIMGRID
  twin::cli::register_sim_command(app);
  twin::cli::register_search_command(app);
  twin::cli::register_sweep_command(app);
  twin::cli::register_goodput_command(app);
#endif
#ifdef TWIN_HAVE_RUN_COMMAND
  twin::cli::register_run_command(app);
#endif
  twin::cli::register_compare_command(app);
  twin::cli::register_calibrate_command(app);
  twin::cli::register_report_command(app);
  twin::cli::register_completion_command(app);
  twin::cli::add_examples(app);
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
  std::vector<std::string> args(argv, argv + argc);
  std::vector<std::string> ignored;
  if (const CLI::App* command = chosen_command(app, argc, argv)) {
    args = without_ignored_megatron_flags(*command, args, ignored);
  }
  std::vector<char*> kept_argv;
  for (std::string& arg : args) kept_argv.push_back(arg.data());
  kept_argv.push_back(nullptr);
  argc = static_cast<int>(args.size());
  argv = kept_argv.data();
  note_ignored_flags(ignored);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& error) {  // a command that failed after reporting why (a failed run: 1)
    return error.get_exit_code();
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version: CLI11 prints them
    // every mistake in what was typed: one line, exit 2, as a UserError's
    fmt::print(stderr, "twin: error: {}\n", parse_error_line(app, error, argc, argv));
    return twin::kExitUsage;
  } catch (const std::exception& error) {  // the one mapping of errors to lines and statuses: model/scenario/errors.hpp
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
