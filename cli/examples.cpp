// Two examples under each command's --help (issue 40: a newcomer's first question is "what do I type"), on the
// shipped scenarios; tests/cli/cli_test.cpp checks that each names flags its command takes and scenarios that exist.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"

namespace twin::cli {

const std::vector<CommandExamples>& command_examples() {
  static const std::vector<CommandExamples> all = {
      {"graph", {"twin graph gpt3-175b", "twin graph mixtral-8x7b --granularity op --json program.json"}},
      {"sim",
       {"twin sim mtnlg-530b --set cluster.nodes=350 --json summary.json",
        "twin sim llama2-70b --svg pipeline.svg --train-tokens 2T --usd-per-gpu-hour 2.5"}},
      {"search",
       {"twin search gpt3-175b --max 8 --sort tflops --csv plans.csv",
        "twin search mixtral-8x7b --vary-recompute --explain"}},
      {"sweep",
       {"twin sweep gpt3-175b --vary cluster.nodes=64,128,256 --train-tokens 300B --days 30",
        "twin sweep gpt3-175b --vary parallel.schedule=1f1b,zb-h1 --vary parallel.micro_batch=1,2 --csv sweep.csv"}},
      {"goodput",
       {"twin goodput llama2-70b --train-tokens 2T", "twin goodput gpt3-175b --iteration-time 31.8 --json g.json"}},
      {"run",
       {"twin run gpt-tiny --steps 300", "twin run gpt-tiny --set parallel.tp=2 --set parallel.pp=2 --steps 20"}},
      {"compare",
       {"twin compare predicted.json megatron.log",
        "twin compare predicted.json rank-0.json.gz --allow-mismatch --top 5"}},
      {"calibrate",
       {"twin calibrate trace-rank-0.json.gz --out profile.toml", "twin calibrate twin_gemm_peak.txt --out h100.toml"}},
      {"report", {"twin report summary.json -o report.html", "twin report search.json --output search.html"}},
      {"completion",
       {"source <(twin completion bash)", "twin completion bash > ~/.local/share/bash-completion/completions/twin"}},
  };
  return all;
}

void add_examples(CLI::App& app) {
  // A command this build leaves out (no SimGrid, no executor) is not among the subcommands: nothing to add.
  for (CLI::App* sub : app.get_subcommands({})) {
    for (const CommandExamples& command : command_examples()) {
      if (command.name != sub->get_name()) continue;
      std::string footer = "\nExamples:";
      for (const std::string& example : command.examples) footer += "\n  " + example;
      sub->footer(footer);
    }
  }
}

}  // namespace twin::cli
