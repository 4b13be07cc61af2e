// twin completion bash: a bash completion script written from the CLI11 app itself (its subcommands and each one's
// long flags), so that it never falls out of date; CMake writes it beside the built twin and installs it
// (cli/CMakeLists.txt). What it completes: the command after `twin`; a flag after `-`; a file after a flag that takes
// a value; a scenario (a shipped name or a *.toml file) where a command takes one, any file where it takes files.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "api/scenario.hpp"
#include "cli/commands.hpp"

namespace twin::cli {
namespace {

namespace fs = std::filesystem;

// The scenario names twin resolves (api/scenario.hpp): the stems of the *.toml files in the scenario folder and its
// published/ folder, sorted. None when the folder is not there.
std::string scenario_names() {
  std::set<std::string> names;
  std::error_code ignored;
  const fs::path dir = api::scenario_directory();
  for (const fs::path& folder : {dir, dir / "published"}) {
    for (fs::directory_iterator it(folder, ignored), end; !ignored && it != end; it.increment(ignored)) {
      if (it->path().extension() == ".toml") names.insert(it->path().stem().string());
    }
  }
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : " ") + name;
  return out;
}

// " --a --b": a command's long flags, those that take a value or those that do not.
std::string long_flags(const CLI::App& command, bool taking_a_value) {
  std::string out;
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_positional() && option->get_lnames().empty()) continue;
    if ((option->get_expected_min() > 0) != taking_a_value) continue;
    for (const std::string& name : option->get_lnames()) out += " --" + name;
  }
  return out;
}

// One `case` arm: the command's flags, the flags after which a file comes, and what its positional arguments are.
std::string command_arm(const CLI::App& command) {
  const bool scenario = command.get_option_no_throw("--set") != nullptr;  // add_scenario_options
  const bool positional = !command.get_options([](const CLI::Option* o) { return o->get_positional(); }).empty();
  const std::string words = command.get_name() == "completion" ? "bash" : "";
  return fmt::format("    {}) flags=\"{}\"; valued=\"{}\"; positional={} ;;\n", command.get_name(),
                     long_flags(command, false) + long_flags(command, true), long_flags(command, true),
                     scenario         ? "scenario"
                     : !words.empty() ? "words; words=\"" + words + "\""
                     : positional     ? "files"
                                      : "none");
}

std::string bash_script(const CLI::App& app) {
  std::string commands, arms;
  for (const CLI::App* command : app.get_subcommands({})) {
    commands += (commands.empty() ? "" : " ") + command->get_name();
    arms += command_arm(*command);
  }
  return fmt::format(
      R"(# bash completion for twin, written by `twin completion bash` from twin's own commands and flags.
_twin() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
  local flags valued positional words
  COMPREPLY=()
  if (( COMP_CWORD == 1 )); then
    COMPREPLY=( $(compgen -W "{} --help --version" -- "$cur") )
    return 0
  fi
  case ${{COMP_WORDS[1]}} in
{}    *) return 0 ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=( $(compgen -W "$flags" -- "$cur") )
  elif [[ " $valued " == *" $prev "* ]]; then
    COMPREPLY=( $(compgen -f -- "$cur") )
  elif [[ $positional == scenario ]]; then
    COMPREPLY=( $(compgen -W "{}" -- "$cur") $(compgen -f -X '!*.toml' -- "$cur") $(compgen -d -S / -- "$cur") )
  elif [[ $positional == words ]]; then
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
  elif [[ $positional == files ]]; then
    COMPREPLY=( $(compgen -f -- "$cur") )
  fi
  return 0
}}
complete -o filenames -F _twin twin
)",
      commands, arms, scenario_names());
}

}  // namespace

void register_completion_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "completion", "print a shell completion script for twin, made from its own commands and flags (bash)");
  auto shell = std::make_shared<std::string>();
  command->add_option("shell", *shell, "the shell: bash")->required()->check(CLI::IsMember({"bash"}));
  command->callback([&app, shell] { fmt::print("{}", bash_script(app)); });
}

}  // namespace twin::cli
