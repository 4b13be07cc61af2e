// twin calibrate TRACE... --out PROFILE.toml: a hardware profile fitted on the traces of one plan (one per rank),
// checked on the traces of another plan (--check): the rates twin's cost model times ops with.
//   twin calibrate plan_a.json --check plan_b.json --out host.toml
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "measured/calibrate.hpp"
#include "measured/kineto.hpp"

namespace twin::cli {

void register_calibrate_command(CLI::App& app) {
  auto traces = std::make_shared<std::vector<std::string>>();
  auto checks = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "calibrate",
      "fit a hardware profile (GEMM rate by shape, memory rate, per-op overheads, with the fits' residuals) on "
      "PyTorch profiler traces of one plan, and check it on another plan's (--check): the out-of-sample error");
  command->add_option("traces", *traces, "profiler traces (.json, .json.gz; record_shapes=True) of one plan")
      ->required();
  command->add_option("--check", *checks, "traces of another plan on the same machine, timed by the profile");
  command->add_option("--out", *out, "write the profile (TOML) here")->check(output_file());
  command->callback([traces, checks, out] {
    try {
      std::vector<measured::KinetoTrace> read;
      for (const std::string& path : *traces) read.push_back(measured::read_kineto_trace(path));
      measured::HardwareProfile profile = measured::calibrate(read);
      for (const std::string& path : *checks) {
        profile.checks.push_back(measured::check_profile(profile, measured::read_kineto_trace(path)));
      }
      fmt::print("{}", measured::profile_table(profile));
      if (!out->empty()) {
        write_file_atomically(*out, measured::profile_to_toml(profile));
        fmt::print("profile written to {}\n", *out);
      }
    } catch (const measured::MeasuredError& error) {
      throw UserError(error.what());
    }
  });
}

}  // namespace twin::cli
