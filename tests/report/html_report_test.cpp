// twin report's page builder on documents written here: the kind recognised from the keys, every section of each
// kind present, text escaped, the pipeline readable at 1 and at 64 micro-batches, a missing field named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "report/html_report.hpp"
#include "report/pipeline.hpp"

namespace twin::report {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// A pipeline of `stages` x `chunks` in which each row runs its micro-batches' forwards then backwards, one second
// each, one after the other: every box as wide as every other.
Pipeline even_pipeline(int stages, int chunks, int micro_batches) {
  Pipeline p;
  p.model = "m";
  p.stages = stages, p.chunks = chunks, p.micro_batches = micro_batches;
  p.iteration_time_s = 2.0 * micro_batches * chunks + 1;
  for (int stage = 0; stage < stages; ++stage) {
    PipelineRow row{stage, stage * 4, {}};
    double t = 0;
    for (const BoxKind kind : {BoxKind::Forward, BoxKind::Backward}) {
      for (int chunk = 0; chunk < chunks; ++chunk) {
        for (int mb = 0; mb < micro_batches; ++mb, t += 1) row.boxes.push_back({t, t + 1, mb, chunk, kind});
      }
    }
    row.boxes.push_back({t, t + 1, -1, 0, BoxKind::Sync});
    p.rows.push_back(row);
  }
  return p;
}

json sim_document(const std::string& name, int micro_batches) {
  const Pipeline pipeline = even_pipeline(2, 2, micro_batches);
  json stages = json::array();
  for (int stage = 0; stage < 2; ++stage) {
    stages.push_back({{"stage", stage},
                      {"rank", stage * 4},
                      {"busy_s", 3.0},
                      {"bubble_fraction", 0.25},
                      {"time_split", {{"compute_s", 3.0}, {"bubble_s", 1.0}}}});
  }
  return {{"iteration_time_s", pipeline.iteration_time_s},
          {"bubble_fraction", 0.25},
          {"tflops_per_gpu", 123.4},
          {"mfu", 0.42},
          {"time_split", {{"compute", 0.75}, {"bubble", 0.25}}},
          {"memory", {{"peak_bytes", 40e9}, {"capacity_bytes", 80e9}, {"fits", true}}},
          {"scenario", {{"name", name}, {"tp", 2}, {"pp", 2}, {"dp", 2}, {"ep", 4}, {"gpus", 8}, {"precision", "fp8"}}},
          {"stages", stages},
          {"pipeline", pipeline_to_json(pipeline)}};
}

void expect_sections(const std::string& page, ReportKind kind) {
  for (const std::string& id : report_sections(kind)) EXPECT_THAT(page, HasSubstr("<section id=\"" + id + "\">")) << id;
}

std::size_t count(const std::string& text, const std::regex& pattern) {
  return static_cast<std::size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), pattern), std::sregex_iterator()));
}

TEST(HtmlReport, ASimulationHasItsSectionsAndNamesThePlan) {
  const std::string page = html_report(sim_document("gpt", 8), "pred.json");
  ASSERT_EQ(report_kind(sim_document("gpt", 8)), ReportKind::Sim);
  expect_sections(page, ReportKind::Sim);
  EXPECT_THAT(page, HasSubstr("TP 2 x PP 2 x DP 2, EP 4"));
  EXPECT_THAT(page, HasSubstr("fp8"));
  EXPECT_THAT(page, HasSubstr("42.0 %"));  // MFU
  EXPECT_THAT(page, HasSubstr("from pred.json"));
  // Nothing fetched: the only URLs are SVG's namespace, which names and loads nothing.
  EXPECT_EQ(count(page, std::regex("http")), count(page, std::regex("xmlns=\"http://www\\.w3\\.org/2000/svg\"")));
  EXPECT_THAT(page, Not(HasSubstr("<link")));
  EXPECT_THAT(page, Not(HasSubstr("src=")));
}

TEST(HtmlReport, AModelNameIsEscapedEverywhere) {
  const std::string page = html_report(sim_document("a<b & \"c\"", 4), "x.json");
  EXPECT_THAT(page, HasSubstr("a&lt;b &amp; &quot;c&quot;"));
  EXPECT_THAT(page, Not(HasSubstr("a<b")));
  EXPECT_THAT(page, Not(HasSubstr("\"c\"")));
}

// At 1 and at 64 micro-batches: a row per stage and chunk, every forward and backward box wide enough to carry its
// micro-batch's number (the axis widens with the count), the same bytes twice.
TEST(HtmlReport, ThePipelineStaysReadableAtOneAndSixtyFourMicroBatches) {
  for (const int micro_batches : {1, 64}) {
    SCOPED_TRACE(micro_batches);
    const std::string page = html_report(sim_document("gpt", micro_batches), "x.json");
    EXPECT_EQ(page, html_report(sim_document("gpt", micro_batches), "x.json"));
    for (const char* row : {"stage 0 chunk 0", "stage 0 chunk 1", "stage 1 chunk 0", "stage 1 chunk 1"}) {
      EXPECT_THAT(page, HasSubstr(row));
    }
    EXPECT_THAT(page, HasSubstr("forward (chunk 1)"));  // the chunks' shades in the legend
    // 2 stages x 2 chunks x 2 passes x micro_batches boxes, each numbered.
    const std::regex number("fill=\"white\" text-anchor=\"middle\">\\d+</text>");
    EXPECT_EQ(count(page, number), static_cast<std::size_t>(8 * micro_batches));
    EXPECT_THAT(page, HasSubstr(">" + std::to_string(micro_batches) + "</text>"));
  }
}

TEST(HtmlReport, ASweepASearchAndAComparisonHaveTheirSections) {
  const json row = {{"set", {{"cluster.nodes", "2"}}},
                    {"gpus", 16},
                    {"iteration_time_s", 2.0},
                    {"tflops_per_gpu", 100.0},
                    {"bubble_fraction", 0.1},
                    {"memory_per_gpu_bytes", 1e9},
                    {"fits", true},
                    {"tokens_per_s", 5.0},
                    {"time_split", {{"compute", 0.9}}},
                    {"error", ""}};
  json other = row;
  other["set"]["cluster.nodes"] = "4";
  const json sweep = {{"scenario", "gpt"}, {"varied", {"cluster.nodes"}}, {"variants", {row, other}}};
  ASSERT_EQ(report_kind(sweep), ReportKind::Sweep);
  expect_sections(html_report(sweep, "s.json"), ReportKind::Sweep);

  const json plan = {{"tp", 8},
                     {"pp", 4},
                     {"dp", 2},
                     {"micro_batch", 1},
                     {"schedule", "1f1b"},
                     {"iteration_time_s", 3.0},
                     {"fits", true},
                     {"error", ""},
                     {"time_split", {{"compute", 0.5}}}};
  const json search = {{"scenario", "gpt"},
                       {"plans", {plan}},
                       {"plans_that_fit", 1},
                       {"rejected_for_memory", 0},
                       {"memory_headroom", "5%"}};
  ASSERT_EQ(report_kind(search), ReportKind::Search);
  const std::string search_page = html_report(search, "p.json");
  expect_sections(search_page, ReportKind::Search);
  EXPECT_THAT(search_page, HasSubstr("tp 8 pp 4 dp 2 mb 1 1f1b"));

  const json value = {{"name", "iteration time (s)"}, {"predicted", 1.0}, {"measured", 1.25}, {"error", -0.2}};
  const json compare = {{"mode", "summary"}, {"totals", {value}}, {"stages", json::array()}, {"kinds", json::array()}};
  ASSERT_EQ(report_kind(compare), ReportKind::Compare);
  const std::string compare_page = html_report(compare, "c.json");
  expect_sections(compare_page, ReportKind::Compare);
  EXPECT_THAT(compare_page, HasSubstr("-20.0 %"));
  EXPECT_THAT(compare_page, HasSubstr("no times per stage"));  // an iteration time alone: the totals
}

TEST(HtmlReport, AnotherDocumentIsNotAReportAndAMissingFieldIsNamed) {
  EXPECT_FALSE(report_kind(json{{"traceEvents", json::array()}}).has_value());
  EXPECT_FALSE(report_kind(json{{"mode", "ops"}, {"totals", json::array()}}).has_value());  // two traces op by op
  EXPECT_FALSE(report_kind(json::array()).has_value());
  EXPECT_THROW(html_report(json{{"traceEvents", json::array()}}, "t.json"), ReportError);
  json broken = sim_document("gpt", 2);
  broken.erase("memory");
  try {
    html_report(broken, "x.json");
    FAIL() << "a simulation without memory was drawn";
  } catch (const ReportError& error) {
    EXPECT_THAT(error.what(), HasSubstr("\"memory\""));
  }
}

TEST(Pipeline, ItsJsonReadsBackBoxForBox) {
  const Pipeline p = even_pipeline(3, 2, 5);
  const Pipeline back = pipeline_from_json(pipeline_to_json(p), "m");
  ASSERT_EQ(back.rows.size(), p.rows.size());
  EXPECT_EQ(back.chunks, 2);
  EXPECT_EQ(back.micro_batches, 5);
  for (std::size_t r = 0; r < p.rows.size(); ++r) {
    ASSERT_EQ(back.rows[r].boxes.size(), p.rows[r].boxes.size());
    for (std::size_t b = 0; b < p.rows[r].boxes.size(); ++b) {
      EXPECT_EQ(back.rows[r].boxes[b].kind, p.rows[r].boxes[b].kind);
      EXPECT_EQ(back.rows[r].boxes[b].micro_batch, p.rows[r].boxes[b].micro_batch);
      EXPECT_EQ(back.rows[r].boxes[b].start_s, p.rows[r].boxes[b].start_s);
    }
  }
  json bad = pipeline_to_json(p);
  bad["rows"][0]["boxes"][0][0] = "X";
  EXPECT_THROW(pipeline_from_json(bad, "m"), std::invalid_argument);
}

}  // namespace
}  // namespace twin::report
