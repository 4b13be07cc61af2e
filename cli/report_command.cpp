// twin report FILE -o report.html: one self-contained HTML page (report/html_report.hpp) of what `twin sim`,
// `twin sweep`, `twin search` or `twin compare` wrote with --json, its kind recognised from the document's keys.
// Parse, read, build, write.
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "api/compare.hpp"
#include "cli/commands.hpp"
#include "report/html_report.hpp"

namespace twin::cli {
namespace {

struct ReportOptions {
  std::string input;
  std::string output;
};

void run(const ReportOptions& o) {
  require_outputs_before_work({{"-o", o.output}}, {{"the input", o.input}});
  const nlohmann::json document = api::read_json_file(o.input);
  const std::optional<report::ReportKind> kind = report::report_kind(document);
  if (!kind) {
    throw UserError(fmt::format(
        "'{}' is not a document twin report reads: it takes what twin sim --json, twin sweep --json, twin search "
        "--json or twin compare --json (of summaries, not of two traces op by op) wrote",
        o.input));
  }
  std::string page;
  try {
    page = report::html_report(document, std::filesystem::path(o.input).filename().string());
  } catch (const report::ReportError& error) {
    throw UserError(fmt::format("'{}' ({} document): {}", o.input, report::to_string(*kind), error.what()));
  }
  write_file_atomically(o.output, page);
  fmt::print("report of a {} written to {}\n", report::to_string(*kind), o.output);
}

}  // namespace

void register_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* command = app.add_subcommand(
      "report",
      "one self-contained HTML page (inline SVG, nothing fetched) of a twin sim, sweep, search or compare --json "
      "file: summary, time split, stages, pipeline, curves, ranked plans, predicted against measured");
  command->add_option("file", o->input, "the JSON file a twin sim, sweep, search or compare --json wrote")->required();
  command->add_option("-o,--output", o->output, "the HTML file to write")->required()->check(output_file());
  command->callback([o] { run(*o); });
}

}  // namespace twin::cli
