// The `twin` command line: one file per subcommand, each registering itself on the CLI11 app.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "api/scenario.hpp"
#include "api/token_count.hpp"
#include "model/program/program.hpp"
#include "model/scenario/errors.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::cli {

// A mistake in what the user typed (flag, file, value): printed as one line, exit status 2 (model/scenario/errors.hpp).
using twin::UserError;

// The scenario a command works on: a TOML file or a name under scenarios/, with `--set key=value` overrides and
// Megatron-style aliases (--tensor-model-parallel-size 8 is --set parallel.tp=8).
struct ScenarioOptions {
  std::string scenario = "mtnlg-530b";
  std::vector<std::string> sets;
  std::vector<model::Override> aliases;    // filled by the alias flags
  std::string recompute_method;            // --recompute-method: "uniform", "block" or "" (block)
  long long layers_per_virtual_stage = 0;  // --num-layers-per-virtual-pipeline-stage (0: not given)
  bool group_query_attention = false;      // --group-query-attention
  double attention_dropout = -1;           // --attention-dropout, --hidden-dropout (< 0: not given)
  double hidden_dropout = -1;
  long long shared_expert_width = 0;  // --moe-shared-expert-intermediate-size (0: not given)
  std::string moe_layer_freq;         // --moe-layer-freq (empty: not given)
  std::string hf_config;              // --hf-config: a Hugging Face config.json as the model (api/hf_config.hpp)
};
void add_scenario_options(CLI::App& command, ScenarioOptions& options);
model::Scenario load_scenario(const ScenarioOptions& options);
// Every override `options` makes: the --set ones, the aliases, and the keys Megatron derives from them (--swiglu's
// ffn, --num-layers-per-virtual-pipeline-stage's chunks). load_scenario applies them to the scenario's file.
std::vector<model::Override> scenario_overrides(const ScenarioOptions& options);
// The same as `--set` arguments, what a child `twin sim` is given.
std::vector<std::string> as_sets(const std::vector<model::Override>& overrides);
// Scenario names resolve as the library resolves them (api/scenario.hpp).
using api::resolve_scenario_path;
// The scenario file as an input of a command, for require_outputs_before_work: {"the scenario", its path}.
std::pair<std::string, std::string> scenario_input(const ScenarioOptions& options);

// The Program built within this host's memory, and the check alone (api/scenario.hpp).
using api::available_memory_bytes;
using api::build_program_within_memory;
using api::require_program_fits_memory;

// A numeric option's bounds, with a message a person can read ("must be at least 1, got 0"); nan and inf are refused.
CLI::Validator at_least(double minimum);
CLI::Validator between(double minimum, double maximum);

// An output file flag's check at parse time, before any work: a name, not a directory, in a directory that exists.
CLI::Validator output_file();

// A number of tokens as people write it: 300e9, 300B, 1.4T, 500M (suffixes k, M, B or G, T; either case), at least
// one and at most 1e18. Throws UserError naming the flag otherwise.
using api::parse_token_count;  // api/token_count.hpp
CLI::Validator token_count(const std::string& flag);  // the same check at parse time

// A file written atomically: a temporary beside it, then rename, so a reader never sees half of it. A symbolic link
// is followed (the file it points at is replaced, not the link); what is not a regular file (a pipe, a terminal,
// /dev/stdout) is written in place. Throws UserError naming the path when it cannot be opened, RunFailure when writing
// fails (a full disk: exit 1).
void write_file_atomically(const std::string& path, const std::string& contents);

// Throws UserError when two output flags name the same file (one would overwrite the other): pairs of flag and path,
// empty paths ignored.
void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& flags_and_paths);

// Every output of a command, checked before its work (README "Reliability"), so that an hour of simulation or training
// is not lost at its end: `outputs` (pairs of flag and path; empty paths ignored) name distinct files; each can be
// written (a file's directory takes a new file; a character device opens; a pipe or socket is checked for permission
// only, never opened, so that its reader sees no early end of file; a directory or block device is refused); and none
// is the same file as one of `inputs` (pairs of what names it and its path: by device and inode, through links).
// Throws UserError naming the flag.
void require_outputs_before_work(const std::vector<std::pair<std::string, std::string>>& outputs,
                                 const std::vector<std::pair<std::string, std::string>>& inputs);

void register_graph_command(CLI::App& app);
void register_sim_command(CLI::App& app);  // cli/sim_command.cpp, built when SimGrid is present
void register_run_command(CLI::App& app);  // cli/run_command.cpp
void register_compare_command(CLI::App& app);
void register_calibrate_command(CLI::App& app);  // cli/calibrate_command.cpp
void register_search_command(CLI::App& app);  // cli/search_command.cpp, with the simulator
void register_sweep_command(CLI::App& app);   // cli/sweep_command.cpp, with the simulator
void register_goodput_command(CLI::App& app);  // cli/goodput_command.cpp, with the simulator
void register_report_command(CLI::App& app);   // cli/report_command.cpp
void register_completion_command(CLI::App& app);  // cli/completion_command.cpp: bash completion from `app` itself

// Two examples for each command, shown under its --help (cli/examples.cpp).
struct CommandExamples {
  std::string name;
  std::vector<std::string> examples;
};
const std::vector<CommandExamples>& command_examples();
// Puts each registered command's examples in its --help footer.
void add_examples(CLI::App& app);

}  // namespace twin::cli
