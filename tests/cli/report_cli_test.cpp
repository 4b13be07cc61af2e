// `twin report` as a user runs it (a page written atomically, another file refused in one line naming it), and the
// --csv of sweep and search and search's --sort.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Result = twin::testing::ShellResult;

Result twin(const std::string& arguments) {
  return twin::testing::run_shell(std::string(TWIN_BINARY) + " " + arguments + " 2>&1");
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-report-cli-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string contents(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// One refusal: exit 2, one `twin: error:` line.
void expect_refused(const Result& r, const std::string& message) {
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, StartsWith("twin: error: "));
  EXPECT_EQ(lines(r.output).size(), 1u) << r.output;
  EXPECT_THAT(r.output, HasSubstr(message));
}

TEST(ReportCli, AFileOfAnotherKindIsRefusedInOneLineNamingIt) {
  const fs::path trace = scratch("trace.json"), page = scratch("page.html");
  std::ofstream(trace) << R"({"traceEvents": []})";
  expect_refused(twin("report " + trace.string() + " -o " + page.string()),
                 "'" + trace.string() + "' is not a document twin report reads");
  const fs::path torn = scratch("torn.json");
  std::ofstream(torn) << R"({"iteration_time_s": 1, "stages": [], "scenario": {}})";  // a simulation's keys, no memory
  expect_refused(twin("report " + torn.string() + " -o " + page.string()), "the field \"memory\" is missing");
  expect_refused(twin("report " + trace.string() + " -o " + trace.string()), "is the same file as the input");
  EXPECT_FALSE(fs::exists(page));
  expect_refused(twin("report " + trace.string()), "-o");
}

#ifdef TWIN_HAVE_SIMGRID

// Eight GPUs of one DGX H200, micro-batch 1: a simulation takes a fraction of a second.
const std::string kSmall =
    "gpt-tiny --quiet --set cluster.node='\"dgx-h200\"' --set cluster.nodes=1 --set parallel.micro_batch=1 "
    "--set parallel.global_batch=64";

TEST(ReportCli, ASimulationsPageHasItsPipeline) {
  const fs::path json = scratch("sim.json"), page = scratch("sim.html");
  ASSERT_EQ(twin("sim " + kSmall + " --set parallel.pp=2 --json " + json.string()).status, 0);
  const Result r = twin("report " + json.string() + " -o " + page.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("report of a simulation written to"));
  const std::string html = contents(page);
  EXPECT_THAT(html, StartsWith("<!DOCTYPE html>"));
  EXPECT_THAT(html, HasSubstr("<section id=\"pipeline\">"));
  EXPECT_THAT(html, HasSubstr("stage 1 chunk 0"));
  EXPECT_THAT(html, ::testing::Not(HasSubstr("has no \"pipeline\"")));  // twin sim --json keeps the boxes
}

TEST(ReportCli, SweepCsvHasALinePerVariant) {
  const fs::path csv = scratch("sweep.csv");
  const Result r = twin("sweep " + kSmall + " --vary parallel.pp=1,2 --jobs 2 --csv " + csv.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<std::string> rows = lines(contents(csv));
  ASSERT_EQ(rows.size(), 3u) << contents(csv);
  EXPECT_EQ(rows[0], "parallel.pp,gpus,iter_s,tflops,bubble,mem_gib,fits,tokens_per_s,error");
  EXPECT_THAT(rows[1], StartsWith("1,8,"));
  EXPECT_THAT(rows[2], StartsWith("2,8,"));
}

// The column of `name` in a CSV's lines after its header.
std::vector<double> column(const std::vector<std::string>& rows, const std::string& name) {
  std::vector<std::string> header;
  std::stringstream names(rows.at(0));
  for (std::string cell; std::getline(names, cell, ',');) header.push_back(cell);
  const auto at = static_cast<std::size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  std::vector<double> values;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    std::stringstream cells(rows[i]);
    std::string cell;
    for (std::size_t c = 0; c <= at; ++c) std::getline(cells, cell, ',');
    values.push_back(std::stod(cell));
  }
  return values;
}

TEST(ReportCli, SearchCsvFollowsTheTableAndSortReordersIt) {
  const fs::path ranked = scratch("ranked.csv"), by_dp = scratch("by-dp.csv");
  ASSERT_EQ(twin("search " + kSmall + " --max 4 --jobs 2 --csv " + ranked.string()).status, 0);
  const Result r = twin("search " + kSmall + " --max 4 --jobs 2 --sort dp --csv " + by_dp.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sorted by dp (--sort)"));
  const std::vector<std::string> a = lines(contents(ranked)), b = lines(contents(by_dp));
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  const std::vector<double> seconds = column(a, "iter_s"), data_parallel = column(b, "dp");
  EXPECT_TRUE(std::is_sorted(seconds.begin(), seconds.end()));  // fastest first, as the table
  EXPECT_TRUE(std::is_sorted(data_parallel.begin(), data_parallel.end()));
  EXPECT_NE(a, b) << "the four plans are ranked by dp already: the test shows nothing";
  EXPECT_EQ(std::multiset<std::string>(a.begin(), a.end()), std::multiset<std::string>(b.begin(), b.end()));
}

TEST(ReportCli, AnUnknownSortColumnIsRefusedByNameBeforeTheWork) {
  const Result r = twin("search " + kSmall + " --sort speed");
  expect_refused(r, "--sort 'speed': no such column (the columns: node, tp, pp, dp");
  // finishes is a column only with --days: asked without it, refused by name before the work
  expect_refused(twin("search " + kSmall + " --sort Finishes"), "--sort finishes orders the plans by whether");
}

#endif

}  // namespace
