// twin calibrate SOURCE... --out PROFILE.toml: a hardware profile fitted on the traces of one plan (one per rank),
// checked on the traces of another plan (--check): the rates twin's cost model times ops with. A source is a PyTorch
// profiler trace, twin's own trace (twin run --trace), or one of twin's microbenchmark outputs (bench/gpu
// twin_gemm_peak's printout, bench/kernels_cpu_bench's Google Benchmark JSON).
//   twin calibrate plan_a.json --check plan_b.json --out host.toml
//   twin_gemm_peak > h200.txt && twin calibrate h200.txt --out h200.toml
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "measured/calibrate.hpp"
#include "measured/kineto.hpp"
#include "measured/microbenchmarks.hpp"
#include "measured/program_work.hpp"

namespace twin::cli {
namespace {

struct CalibrateOptions {
  std::vector<std::string> sources, checks;
  std::string out;
  int gpus_per_node = 8;
  bool fastest_step = false;
  std::string scenario;  // the plan the traces ran (optional)
};

measured::HardwareProfile profile_of(const CalibrateOptions& o, const measured::CalibrateOptions& options) {
  std::vector<measured::KinetoTrace> traces;
  for (const std::string& path : o.sources) {
    const measured::SourceKind kind = measured::source_kind(measured::read_maybe_gzipped(path, 4096));
    if (kind != measured::SourceKind::ProfilerTrace) {
      // A microbenchmark's output is a profile of its own: fitting it together with traces would mix two machines'
      // or two programs' rates in one line.
      if (o.sources.size() != 1) {
        throw UserError(
            fmt::format("'{}' is a microbenchmark's output: calibrate on it alone (one profile per "
                        "source kind)",
                        path));
      }
      if (!o.checks.empty()) {
        throw UserError(
            "--check sets a profile fitted on one plan's traces against another plan's; a "
            "microbenchmark's profile has no plan: compare its twin sim with a run (twin compare)");
      }
      const std::string text = measured::read_maybe_gzipped(path);
      return kind == measured::SourceKind::GemmPeak ? measured::profile_from_gemm_peak(path, text)
                                                    : measured::profile_from_google_benchmark(path, text);
    }
    traces.push_back(measured::read_kineto_trace(path));
    if (o.fastest_step) measured::keep_fastest_step(traces.back());
  }
  measured::HardwareProfile profile = measured::calibrate(traces, options);
  for (const std::string& path : o.checks) {
    measured::KinetoTrace check = measured::read_kineto_trace(path);
    if (o.fastest_step) measured::keep_fastest_step(check);
    profile.checks.push_back(measured::check_profile(profile, check, options));
  }
  return profile;
}

}  // namespace

void register_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* command = app.add_subcommand(
      "calibrate",
      "fit a hardware profile (GEMM rate by shape, memory or HBM rate, attention rate, collectives' bus bandwidth by "
      "size and span, per-op overheads, with the fits' residuals) on PyTorch profiler traces of one plan or on twin's "
      "microbenchmarks, and check it on another plan's traces (--check): the out-of-sample error");
  command
      ->add_option("sources", o->sources,
                   "profiler traces (.json, .json.gz; record_shapes=True) of one plan, twin run --trace output, or one "
                   "microbenchmark output (twin_gemm_peak's printout, kernels_cpu_bench's JSON)")
      ->required();
  command->add_option("--check", o->checks, "traces of another plan on the same machine, timed by the profile");
  command->add_option("--out", o->out, "write the profile (TOML) here")->check(output_file());
  command->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node, to count the nodes a collective spans")
      ->check(CLI::Range(1, 1024));
  command->add_option("--scenario", o->scenario,
                      "the plan the CPU run's traces ran (a scenario file or name): a PyTorch trace's memory-bound "
                      "classes are then fitted per byte its Program streams, and the time no Program op stands for "
                      "(copies, reductions, gaps between operators) per kernel it launches");
  command->add_flag("--fastest-step", o->fastest_step,
                    "fit on each trace's fastest ProfilerStep only (the one other work on the machine delayed least), "
                    "as `twin compare --fastest-step` measures a run");
  command->callback([o] {
    try {
      std::vector<std::pair<std::string, std::string>> inputs;
      for (const std::string& source : o->sources) inputs.emplace_back("the trace", source);
      for (const std::string& check : o->checks) inputs.emplace_back("--check", check);
      if (!o->scenario.empty()) inputs.push_back(scenario_input(ScenarioOptions{.scenario = o->scenario}));
      require_outputs_before_work({{"--out", o->out}}, inputs);
      measured::CalibrateOptions options{o->gpus_per_node, std::nullopt};
      if (!o->scenario.empty()) {
        const model::Scenario plan = load_scenario(ScenarioOptions{.scenario = o->scenario});
        options.program = measured::program_work(build_program_within_memory(plan, model::Granularity::Op));
      }
      const measured::HardwareProfile profile = profile_of(*o, options);
      fmt::print("{}", measured::profile_table(profile));
      if (!o->out.empty()) {
        write_file_atomically(o->out, measured::profile_to_toml(profile));
        fmt::print("profile written to {}\n", o->out);
      }
    } catch (const measured::MeasuredError& error) {
      throw UserError(error.what());
    }
  });
}

}  // namespace twin::cli
