#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/scenario/scenario.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

using ::testing::HasSubstr;

constexpr const char* kValid = R"(
[model]
name = "small"
layers = 8
hidden = 256
heads = 8
seq_len = 128
vocab = 1000

[parallel]
tp = 2
pp = 2
micro_batch = 2
global_batch = 16

[cluster]
nodes = 1
node = "dgx-a100"
)";

// The problems a scenario text yields (none when it loads).
std::vector<std::string> scenario_problems_of(const std::string& text, const std::vector<Override>& overrides = {}) {
  try {
    parse_scenario(text, "case.toml", overrides);
  } catch (const ScenarioError& error) {
    return error.problems();
  }
  return {};
}

std::string joined_problems(const std::string& text, const std::vector<Override>& overrides = {}) {
  std::string out;
  for (const auto& problem : scenario_problems_of(text, overrides)) out += problem + "\n";
  return out;
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(Scenario, LoadsAValidTextAndDerivesDefaults) {
  const Scenario s = parse_scenario(kValid, "case.toml");
  EXPECT_EQ(s.model.name, "small");
  EXPECT_EQ(s.ffn_hidden(), 4 * 256);
  EXPECT_EQ(s.parallel.dp, 2);  // 8 GPUs / (tp 2 * pp 2)
  EXPECT_EQ(s.parallel.micro_batches(), 4);
  EXPECT_EQ(s.padded_vocab(), 1024);  // multiple of 128 * tp = 256
  EXPECT_EQ(s.model.dtype, DType::BF16);
  EXPECT_EQ(s.parallel.schedule, ScheduleKind::OneFOneB);
}

// Every node kind a scenario may name has its row of GPUs and memory (model/'s one table): a kind added without
// one is an internal error, not a silent copy of another kind's row.
TEST(Scenario, EveryNodeKindHasItsGpusAndMemory) {
  for (const char* node :
       {"dgx-a100", "dgx-a100-40gb", "dgx-h100", "dgx-h200", "hgx-h800", "dgx-b200", "gb200-nvl72", "cpu-host"}) {
    const Scenario s = parse_scenario(std::string(kValid).replace(std::string(kValid).find("dgx-a100"), 8, node),
                                      "node.toml", {{"parallel.dp", "1"}, {"cluster.gpus_per_node", "4"}});
    EXPECT_GT(gpu_memory_bytes(s.cluster.node), 0) << node;
    EXPECT_GT(default_gpus_per_node(s.cluster.node), 0) << node;
  }
  EXPECT_EQ(gpu_memory_bytes(NodeKind::DgxA100_40GB), gpu_memory_bytes(NodeKind::DgxA100) / 2);
  EXPECT_EQ(gpu_memory_bytes(NodeKind::CpuHost), 16.0 * 1024 * 1024 * 1024);
  EXPECT_THROW(gpu_memory_bytes(static_cast<NodeKind>(250)), InternalError);
}

TEST(Scenario, ShippedScenariosLoad) {
  const std::string dir = testing::source_dir() + "/scenarios/";
  const Scenario mtnlg = load_scenario(dir + "mtnlg-530b.toml");
  EXPECT_EQ(mtnlg.parallel.tp, 8);
  EXPECT_EQ(mtnlg.parallel.pp, 35);
  EXPECT_EQ(mtnlg.parallel.dp, 8);  // 280 nodes * 8 / 280
  EXPECT_EQ(mtnlg.parallel.micro_batches(), 240);
  EXPECT_EQ(mtnlg.padded_vocab(), 51200);
  const Scenario gpt3 = load_scenario(dir + "gpt3-175b.toml");
  EXPECT_EQ(gpt3.parallel.dp, 16);
  const Scenario tiny = load_scenario(dir + "gpt-tiny.toml");
  EXPECT_EQ(tiny.cluster.total_gpus(), 1);
  EXPECT_EQ(tiny.model.dtype, DType::FP32);
}

TEST(Scenario, OverridesChangeTheDerivedPlan) {
  const std::string dir = testing::source_dir() + "/scenarios/";
  const Scenario s = load_scenario(dir + "mtnlg-530b.toml", {parse_override("cluster.nodes=420")});
  EXPECT_EQ(s.parallel.dp, 12);
  EXPECT_EQ(s.parallel.micro_batches(), 160);
  // Bare words are strings; TOML values keep their type.
  const Scenario t =
      load_scenario(dir + "gpt-tiny.toml",
                    {parse_override("parallel.tp=2"), parse_override("parallel.pp=2"),
                     parse_override("parallel.schedule=gpipe"), parse_override("parallel.sequence_parallel=true")});
  EXPECT_EQ(t.parallel.schedule, ScheduleKind::GPipe);
  EXPECT_TRUE(t.parallel.sequence_parallel);
  EXPECT_EQ(t.cluster.total_gpus(), 4);  // a cpu-host cluster follows the plan
}

TEST(Scenario, TomlRoundTrips) {
  Scenario s = parse_scenario(kValid, "case.toml", {parse_override("parallel.recompute=selective")});
  const Scenario again = parse_scenario(to_toml(s), "again.toml");
  EXPECT_EQ(to_toml(again), to_toml(s));
  EXPECT_EQ(again.parallel.recompute, Recompute::Selective);
  // The price of a GPU-hour (cluster.usd_per_gpu_hour) is written only when given, and reads back.
  EXPECT_EQ(to_toml(s).find("usd_per_gpu_hour"), std::string::npos);
  const Scenario priced = parse_scenario(kValid, "case.toml", {parse_override("cluster.usd_per_gpu_hour=2.5")});
  EXPECT_DOUBLE_EQ(parse_scenario(to_toml(priced), "again.toml").cluster.usd_per_gpu_hour, 2.5);
  // Megatron's block recompute: the key (or its Megatron flag) round-trips.
  const Scenario block =
      parse_scenario(kValid, "case.toml",
                     {parse_override("parallel.recompute=full"), parse_override("parallel.recompute_num_layers=1")});
  EXPECT_EQ(block.parallel.recompute_num_layers, 1);
  EXPECT_EQ(parse_scenario(to_toml(block), "again.toml").parallel.recompute_num_layers, 1);
}

TEST(Scenario, PositionEmbeddingIsLearnedUnlessAlibiAndRoundTrips) {
  const Scenario learned = parse_scenario(kValid, "case.toml");
  EXPECT_EQ(learned.model.position_embedding, PositionEmbedding::Learned);
  const Scenario alibi =
      parse_scenario(replace(kValid, "layers = 8", "layers = 8\nposition_embedding = \"alibi\""), "case.toml");
  EXPECT_EQ(alibi.model.position_embedding, PositionEmbedding::Alibi);
  const Scenario again = parse_scenario(to_toml(alibi), "again.toml");
  EXPECT_EQ(to_toml(again), to_toml(alibi));
  EXPECT_EQ(again.model.position_embedding, PositionEmbedding::Alibi);
  EXPECT_EQ(
      parse_scenario(kValid, "case.toml", {parse_override("model.position_embedding=alibi")}).model.position_embedding,
      PositionEmbedding::Alibi);
}

TEST(Scenario, MeasuredGpuConstantsAreReadAndRoundTrip) {
  // Unset: 0, the simulator's cited values; the shape defaults to the 8192^3 GEMM most measurements use.
  const Scenario cited = parse_scenario(kValid, "case.toml");
  EXPECT_EQ(cited.cluster.gemm_tflops, 0);
  EXPECT_EQ(cited.cluster.hbm_gb_per_s, 0);
  EXPECT_THAT(to_toml(cited), ::testing::Not(HasSubstr("gemm_tflops")));
  const Scenario measured = parse_scenario(
      replace(kValid, "node = \"dgx-a100\"",
              "node = \"dgx-a100\"\ngemm_tflops = 267.9\ngemm_shape = [6912, 16384, 2048]"),
      "case.toml",
      {parse_override("cluster.hbm_gb_per_s=1850"), parse_override("cluster.attention_gemm_hbm_fraction=0.7")});
  EXPECT_DOUBLE_EQ(measured.cluster.gemm_tflops, 267.9);
  EXPECT_DOUBLE_EQ(measured.cluster.attention_gemm_hbm_fraction, 0.7);
  EXPECT_EQ(measured.cluster.gemm_shape, (std::array<std::int64_t, 3>{6912, 16384, 2048}));
  EXPECT_DOUBLE_EQ(measured.cluster.hbm_gb_per_s, 1850);
  const Scenario again = parse_scenario(to_toml(measured), "again.toml");
  EXPECT_EQ(to_toml(again), to_toml(measured));
  EXPECT_DOUBLE_EQ(again.cluster.gemm_tflops, 267.9);
  EXPECT_EQ(again.cluster.gemm_shape, measured.cluster.gemm_shape);
  EXPECT_DOUBLE_EQ(again.cluster.hbm_gb_per_s, 1850);
  EXPECT_DOUBLE_EQ(again.cluster.attention_gemm_hbm_fraction, 0.7);
}

TEST(Scenario, TheClustersOwnNetworkIsReadAndRoundTrips) {
  // Unset: 0, the node's own NICs.
  const Scenario dgx = parse_scenario(kValid, "case.toml");
  EXPECT_EQ(dgx.cluster.nics_per_node, 0);
  EXPECT_EQ(dgx.cluster.nic_gbps, 0);
  EXPECT_THAT(to_toml(dgx), ::testing::Not(HasSubstr("nic")));
  const Scenario cloud =
      parse_scenario(replace(kValid, "node = \"dgx-a100\"", "node = \"dgx-a100\"\nnics_per_node = 4"), "case.toml",
                     {parse_override("cluster.nic_gbps=100")});
  EXPECT_EQ(cloud.cluster.nics_per_node, 4);
  EXPECT_DOUBLE_EQ(cloud.cluster.nic_gbps, 100);
  const Scenario again = parse_scenario(to_toml(cloud), "again.toml");
  EXPECT_EQ(to_toml(again), to_toml(cloud));
  EXPECT_EQ(again.cluster.nics_per_node, 4);
}

// A model name is free text: quotes, backslashes and control characters are written escaped, so that the scenario
// reads back as itself (fuzz_scenario found a name of backslashes written raw: tests/fuzz/corpus/fuzz_scenario/).
TEST(Scenario, AFreeTextNameRoundTripsWhateverItHolds) {
  Scenario s = parse_scenario(kValid, "case.toml");
  s.model.name = "a \"quoted\" \\ name\twith a tab, \\\\ two and one \\";
  const std::string written = to_toml(s);
  EXPECT_THAT(written, HasSubstr(R"(name = "a \"quoted\" \\ name\u0009with a tab, \\\\ two and one \\")"));
  const Scenario again = parse_scenario(written, "again.toml");
  EXPECT_EQ(again.model.name, s.model.name);
  EXPECT_EQ(to_toml(again), written);
}

TEST(Scenario, TheHostsTimePerKernelIsReadAndRoundTrips) {
  // Unset: the node's measured host (the simulator resolves it), and a written scenario leaves it unset too.
  const Scenario plain = parse_scenario(kValid, "case.toml");
  EXPECT_FALSE(plain.cluster.host_us_per_kernel.has_value());
  EXPECT_THAT(to_toml(plain), ::testing::Not(HasSubstr("host_us_per_kernel")));
  const Scenario measured = parse_scenario(kValid, "case.toml", {parse_override("cluster.host_us_per_kernel=42.5")});
  EXPECT_DOUBLE_EQ(measured.cluster.host_us_per_kernel.value_or(-1), 42.5);
  const Scenario again = parse_scenario(to_toml(measured), "again.toml");
  EXPECT_DOUBLE_EQ(again.cluster.host_us_per_kernel.value_or(-1), 42.5);
  EXPECT_EQ(to_toml(again), to_toml(measured));
  // 0 (a host never behind) is a value of its own: written, and read back as 0, not as unset.
  const Scenario never_behind = parse_scenario(kValid, "case.toml", {parse_override("cluster.host_us_per_kernel=0")});
  const Scenario read_back = parse_scenario(to_toml(never_behind), "again.toml");
  EXPECT_EQ(read_back.cluster.host_us_per_kernel, std::optional<double>(0.0));
}

// cluster.gpu_profile names a file beside the scenario (a relative path from the scenario's folder); to_toml writes it
// absolute, so the written scenario names the same file wherever it is saved.
TEST(Scenario, TheGpuProfileIsReadBesideTheScenarioAndRoundTrips) {
  const Scenario plain = parse_scenario(kValid, "case.toml");
  EXPECT_TRUE(plain.cluster.gpu_profile.empty());
  EXPECT_THAT(to_toml(plain), ::testing::Not(HasSubstr("gpu_profile")));

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("twin-scenario-profile-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "profiles");
  std::ofstream(dir / "profiles" / "a100.toml") << "[profile]\ndevice = \"NVIDIA A100-SXM4-80GB\"\n";
  std::ofstream(dir / "case.toml") << replace(kValid, "node = \"dgx-a100\"",
                                              "node = \"dgx-a100\"\ngpu_profile = \"profiles/a100.toml\"");
  const Scenario measured = load_scenario(dir / "case.toml");
  EXPECT_EQ(std::filesystem::path(measured.cluster.gpu_profile), dir / "profiles" / "a100.toml");
  const std::string written = to_toml(measured);
  EXPECT_THAT(written, HasSubstr("gpu_profile = \"" + (dir / "profiles" / "a100.toml").string() + "\""));
  const Scenario again = parse_scenario(written, "elsewhere/again.toml");
  EXPECT_EQ(again.cluster.gpu_profile, measured.cluster.gpu_profile);
  EXPECT_EQ(to_toml(again), written);

  // From --set: as given, from where twin runs.
  const std::string absolute = (dir / "profiles" / "a100.toml").string();
  EXPECT_EQ(load_scenario(dir / "case.toml", {parse_override("cluster.gpu_profile=\"" + absolute + "\"")})
                .cluster.gpu_profile,
            absolute);

  // A missing file is named with its key; the profile and the cluster's own GPU measurement keys are one or the other.
  EXPECT_THAT(joined_problems(kValid, {parse_override("cluster.gpu_profile=\"/nonexistent/h100.toml\"")}),
              HasSubstr("case.toml: cluster.gpu_profile: no such file '/nonexistent/h100.toml'"));
  EXPECT_THAT(joined_problems(kValid, {parse_override("cluster.gpu_profile=\"" + absolute + "\""),
                                       parse_override("cluster.gemm_tflops=250")}),
              HasSubstr("cluster.gemm_tflops and cluster.gpu_profile both measure the GPU: give one"));
  EXPECT_THAT(joined_problems(kValid, {parse_override("cluster.gpu_profile=3")}), HasSubstr("cluster.gpu_profile"));
  std::filesystem::remove_all(dir);
}

TEST(Scenario, UnevenEndStagesSplitTheRestEvenly) {
  // 8 layers on 4 stages, 1 on each end stage: 3 on each of the two others.
  const Scenario s = parse_scenario(replace(kValid, "pp = 2", "pp = 4"), "case.toml",
                                    {parse_override("parallel.first_stage_layers=1"),
                                     parse_override("parallel.last_stage_layers=1"), parse_override("parallel.tp=1")});
  const std::int64_t expected_layers[] = {1, 3, 3, 1}, expected_first[] = {0, 1, 4, 7};
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(s.layers_in_virtual_stage(stage), expected_layers[stage]) << stage;
    EXPECT_EQ(s.first_layer_of_virtual_stage(stage), expected_first[stage]) << stage;
    EXPECT_EQ(s.layers_on_stage(stage), expected_layers[stage]) << stage;  // one chunk per stage
  }
  EXPECT_EQ(parse_scenario(to_toml(s), "again.toml").parallel.last_stage_layers, 1);
  // Only the first given: the other three share the rest (2 + 2 + 2 + 2 is the even split itself).
  const Scenario first_only =
      parse_scenario(replace(kValid, "pp = 2", "pp = 4"), "case.toml",
                     {parse_override("parallel.first_stage_layers=2"), parse_override("parallel.tp=1")});
  EXPECT_EQ(first_only.layers_in_virtual_stage(3), 2);
}

struct InvalidCase {
  const char* name;
  std::string text;
  std::vector<Override> overrides;
  const char* message;
};

void PrintTo(const InvalidCase& c, std::ostream* out) {
  *out << c.name;
}

class InvalidScenario : public ::testing::TestWithParam<InvalidCase> {};

TEST(Scenario, AFieldThatCannotBeReadIsReportedWithoutTheRulesAboutIt) {
  // Not also "model.layers must be a positive integer, got 0" (its default) or a world size from default nodes.
  const auto layers = scenario_problems_of(replace(kValid, "layers = 8", "layers = 8.0"));
  ASSERT_EQ(layers.size(), 1u) << joined_problems(replace(kValid, "layers = 8", "layers = 8.0"));
  EXPECT_THAT(layers.front(), HasSubstr("model.layers: expected an integer, got the float 8.0"));
  const auto nodes = scenario_problems_of(kValid, {parse_override("cluster.nodes=9223372036854775807")});
  EXPECT_EQ(nodes.size(), 1u);
}

TEST_P(InvalidScenario, ReportsItsOwnMessage) {
  const InvalidCase& c = GetParam();
  EXPECT_THAT(joined_problems(c.text, c.overrides), HasSubstr(c.message));
}

const std::string kV = kValid;

INSTANTIATE_TEST_SUITE_P(
    Validation, InvalidScenario,
    ::testing::Values(
        InvalidCase{"malformed_toml", replace(kV, "layers = 8", "layers = = 8"), {}, "case.toml:4:10: malformed TOML"},
        InvalidCase{
            "unknown_key", replace(kV, "layers = 8", "layrs = 8"), {}, "case.toml:4:9: model.layrs: unknown key"},
        InvalidCase{"unknown_section", kV + "\n[optimizer]\nlr = 1\n", {}, "unknown section [optimizer]"},
        InvalidCase{"string_for_integer",
                    replace(kV, "tp = 2", "tp = \"2\""),
                    {},
                    "parallel.tp: expected an integer, got the string \"2\""},
        InvalidCase{"float_for_integer",
                    replace(kV, "hidden = 256", "hidden = 256.5"),
                    {},
                    "model.hidden: expected an integer, got the float 256.5"},
        InvalidCase{"integer_too_large",
                    kV,
                    {parse_override("cluster.nodes=9223372036854775807")},
                    "cluster.nodes: 9223372036854775807 is too large (at most 2147483647)"},
        InvalidCase{"integer_for_bool",
                    kV + "\n[framework]\ntied_embeddings = 1\n",
                    {},
                    "framework.tied_embeddings: expected true or false, got 1"},
        InvalidCase{"negative_layers",
                    replace(kV, "layers = 8", "layers = -8"),
                    {},
                    "model.layers must be a positive integer, got -8"},
        InvalidCase{"zero_micro_batch",
                    replace(kV, "micro_batch = 2", "micro_batch = 0"),
                    {},
                    "parallel.micro_batch must be a positive integer, got 0"},
        InvalidCase{
            "missing_vocab", replace(kV, "vocab = 1000", ""), {}, "model.vocab must be a positive integer, got 0"},
        InvalidCase{"hidden_not_divisible_by_heads",
                    replace(kV, "heads = 8", "heads = 6"),
                    {},
                    "model.hidden (256) must be divisible by model.heads (6)"},
        InvalidCase{"heads_not_divisible_by_tp",
                    replace(replace(kV, "heads = 8", "heads = 4"), "tp = 2", "tp = 8"),
                    {parse_override("parallel.pp=1")},
                    "model.heads (4) must be divisible by parallel.tp (8)"},
        InvalidCase{"layers_not_divisible",
                    replace(kV, "layers = 8", "layers = 9"),
                    {},
                    "model.layers (9) must be divisible by parallel.pp * parallel.virtual_stages (2 * 1 = 2)"},
        InvalidCase{"global_batch_not_divisible",
                    replace(kV, "global_batch = 16", "global_batch = 18"),
                    {},
                    "parallel.global_batch (18) must be divisible by parallel.dp * parallel.micro_batch (2 * 2 = 4)"},
        InvalidCase{"world_size_mismatch",
                    kV,
                    {parse_override("parallel.dp=3")},
                    "parallel.tp * parallel.pp * parallel.dp = 2 * 2 * 3 = 12 does not match the cluster's 8 GPUs"},
        InvalidCase{"cannot_derive_dp",
                    replace(kV, "pp = 2", "pp = 3"),
                    {},
                    "cannot derive dp: the cluster's 8 GPUs (1 nodes x 8) are not a multiple of tp*pp = 6"},
        InvalidCase{"unknown_schedule",
                    replace(kV, "micro_batch = 2", "micro_batch = 2\nschedule = \"1f2b\""),
                    {},
                    "parallel.schedule: unknown value \"1f2b\" (expected one of gpipe, 1f1b, interleaved, zb-h1, zb-v, "
                    "dualpipev, dualpipe)"},
        // parallel.schedule = "zb-h1": refused by name where its B/W split has no bubble to fill or does not apply
        InvalidCase{"zb_h1_without_a_pipeline",
                    kV,
                    {parse_override("parallel.pp=1"), parse_override("parallel.schedule=\"zb-h1\"")},
                    "parallel.schedule = \"zb-h1\" needs parallel.pp >= 2, got 1"},
        InvalidCase{"zb_h1_in_deepspeed",
                    kV,
                    {parse_override("framework.name=\"deepspeed\""), parse_override("parallel.schedule=\"zb-h1\"")},
                    "parallel.schedule = \"zb-h1\" runs in framework.name = \"megatron\""},
        InvalidCase{"zb_h1_with_zero3",
                    kV,
                    {parse_override("parallel.zero_stage=3"), parse_override("parallel.schedule=\"zb-h1\"")},
                    "parallel.schedule = \"zb-h1\" with parallel.zero_stage = 3"},
        InvalidCase{
            "zb_h1_with_moe_a2a_overlap",
            kV,
            {parse_override("framework.moe_a2a_overlap=true"), parse_override("parallel.schedule=\"zb-h1\"")},
            "parallel.schedule = \"zb-h1\" and framework.moe_a2a_overlap (the combined 1F1B) are two schedules"},
        // parallel.schedule = "zb-v": two chunks per stage in a V, its layers split evenly, the zero-bubble rules
        InvalidCase{
            "zb_v_with_one_chunk",
            kV,
            {parse_override("parallel.schedule=\"zb-v\"")},
            "parallel.schedule = \"zb-v\" needs parallel.virtual_stages = 2 (two chunks per stage in a V), got 1"},
        InvalidCase{"zb_v_with_uneven_ends",
                    replace(kV, "layers = 8", "layers = 10"),
                    {parse_override("parallel.schedule=\"zb-v\""), parse_override("parallel.virtual_stages=2"),
                     parse_override("parallel.first_stage_layers=2")},
                    "parallel.schedule = \"zb-v\" splits layers evenly over its V: parallel.first_stage_layers"},
        InvalidCase{"zb_v_with_groups",
                    kV,
                    {parse_override("parallel.schedule=\"zb-v\""), parse_override("parallel.virtual_stages=2"),
                     parse_override("parallel.microbatch_group=2")},
                    "parallel.schedule = \"zb-v\" has no micro-batch groups: parallel.microbatch_group must be 0"},
        InvalidCase{"zb_v_with_moe_a2a_overlap",
                    kV,
                    {parse_override("parallel.schedule=\"zb-v\""), parse_override("parallel.virtual_stages=2"),
                     parse_override("framework.moe_a2a_overlap=true")},
                    "parallel.schedule = \"zb-v\" and framework.moe_a2a_overlap (the combined 1F1B) are two schedules"},
        // parallel.schedule = "dualpipev": at least 2 pp micro-batches (dualpipev.py asserts it), the V's rules
        InvalidCase{
            "dualpipev_with_few_micro_batches",
            kV,
            {parse_override("parallel.schedule=\"dualpipev\""), parse_override("parallel.virtual_stages=2"),
             parse_override("parallel.global_batch=12")},
            "parallel.schedule = \"dualpipev\" needs at least 2 * parallel.pp (4) micro-batches per pipeline, got 3"},
        InvalidCase{"dualpipev_with_full_recompute_on_moe",
                    kV,
                    {parse_override("parallel.schedule=\"dualpipev\""), parse_override("parallel.virtual_stages=2"),
                     parse_override("parallel.recompute=\"full\""), parse_override("model.experts=4"),
                     parse_override("model.top_k=2"), parse_override("parallel.ep=2")},
                    "parallel.schedule = \"dualpipev\" overlaps each forward with a backward layer by layer, without "
                    "full recompute"},
        InvalidCase{"dualpipev_with_one_chunk",
                    kV,
                    {parse_override("parallel.schedule=\"dualpipev\"")},
                    "parallel.schedule = \"dualpipev\" needs parallel.virtual_stages = 2"},
        // parallel.schedule = "dualpipe": dualpipe.py's asserts (even ranks, even micro-batches >= 2 pp), a block of
        // each direction per stage
        InvalidCase{"dualpipe_with_odd_micro_batches",
                    kV,
                    {parse_override("parallel.schedule=\"dualpipe\""), parse_override("parallel.virtual_stages=2"),
                     parse_override("parallel.global_batch=12")},
                    "parallel.schedule = \"dualpipe\" needs an even number of micro-batches per pipeline, at least 2 * "
                    "parallel.pp (4), half entering at each end; got 3"},
        InvalidCase{"dualpipe_with_odd_stages",
                    kV,
                    {parse_override("parallel.schedule=\"dualpipe\""), parse_override("parallel.virtual_stages=2"),
                     parse_override("parallel.pp=1")},
                    "parallel.schedule = \"dualpipe\" needs an even parallel.pp (dualpipe.py pairs stage s with "
                    "pp - 1 - s), got 1"},
        InvalidCase{"dualpipe_with_one_chunk",
                    kV,
                    {parse_override("parallel.schedule=\"dualpipe\"")},
                    "parallel.schedule = \"dualpipe\" needs parallel.virtual_stages = 2 (a block of each direction per "
                    "stage), got 1"},
        InvalidCase{"virtual_stages_without_interleaving",
                    kV,
                    {parse_override("parallel.virtual_stages=2")},
                    "parallel.virtual_stages = 2 needs parallel.schedule = \"interleaved\""},
        InvalidCase{"interleaved_without_chunks",
                    kV,
                    {parse_override("parallel.schedule=interleaved")},
                    "parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2"},
        InvalidCase{"interleaved_groups_of_p",
                    replace(kV, "global_batch = 16", "global_batch = 12"),
                    {parse_override("parallel.schedule=interleaved"), parse_override("parallel.virtual_stages=2")},
                    "micro-batches per pipeline (global_batch / (dp * micro_batch) = 3) must be divisible by "
                    "parallel.pp (2)"},
        InvalidCase{"zero_stage_5",
                    kV,
                    {parse_override("parallel.zero_stage=5")},
                    "parallel.zero_stage must be 0, 1, 2 or 3, got 5"},
        InvalidCase{"zero_stage_3_megatron",
                    kV,
                    {parse_override("parallel.zero_stage=3")},
                    "parallel.zero_stage = 3 is PyTorch FSDP's FULL_SHARD, which twin models as Composer runs it"},
        InvalidCase{"sequence_parallel_seq_len",
                    replace(kV, "seq_len = 128", "seq_len = 129"),
                    {parse_override("parallel.sequence_parallel=true")},
                    "parallel.sequence_parallel needs model.seq_len (129) divisible by parallel.tp (2)"},
        InvalidCase{"unknown_position_embedding",
                    kV,
                    {parse_override("model.position_embedding=rotary")},
                    "model.position_embedding: unknown value \"rotary\" (expected one of learned, alibi, rope)"},
        InvalidCase{"unknown_node",
                    replace(kV, "node = \"dgx-a100\"", "node = \"dgx-z100\""),
                    {},
                    "cluster.node: unknown value \"dgx-z100\" (expected one of dgx-a100, dgx-a100-40gb, dgx-h100, "
                    "dgx-h200, hgx-h800, dgx-b200, gb200-nvl72, cpu-host)"},
        InvalidCase{"negative_gemm_rate",
                    kV,
                    {parse_override("cluster.gemm_tflops=-230")},
                    "cluster.gemm_tflops must be a measured rate in TFLOP/s (> 0), or 0 for the cited value; got -230"},
        InvalidCase{"negative_nics",
                    kV,
                    {parse_override("cluster.nics_per_node=-8")},
                    "cluster.nics_per_node must be 1..32 compute NICs per node, or 0 for the node's own; got -8"},
        InvalidCase{"nic_in_bytes",
                    kV,
                    {parse_override("cluster.nic_gbps=0.025")},
                    "cluster.nic_gbps must be a NIC line rate in Gb/s (1..1600), or 0 for the node's own; got 0.025"},
        InvalidCase{"host_time_in_seconds",
                    kV,
                    {parse_override("cluster.host_us_per_kernel=2e-5")},
                    "cluster.host_us_per_kernel must be the host's microseconds to issue one kernel (0.1..10000), or "
                    "0 for a host that is never behind; got 2e-05"},
        InvalidCase{"negative_host_time",
                    kV,
                    {parse_override("cluster.host_us_per_kernel=-3")},
                    "cluster.host_us_per_kernel must be the host's microseconds to issue one kernel (0.1..10000), or "
                    "0 for a host that is never behind; got -3"},
        InvalidCase{"infinite_hbm",
                    kV,
                    {parse_override("cluster.hbm_gb_per_s=inf")},
                    "cluster.hbm_gb_per_s: expected a finite number, got the float inf"},
        InvalidCase{"nan_weight_decay",
                    kV,
                    {parse_override("training.weight_decay=nan")},
                    "training.weight_decay: expected a finite number, got the float nan"},
        InvalidCase{"infinite_adam_eps",
                    kV,
                    {parse_override("training.adam_eps=inf")},
                    "training.adam_eps: expected a finite number, got the float inf"},
        InvalidCase{
            "bool_for_integer", replace(kV, "tp = 2", "tp = true"), {}, "parallel.tp: expected an integer, got true"},
        InvalidCase{"huge_float_for_integer",
                    kV,
                    {parse_override("model.layers=1e30")},
                    "model.layers: expected an integer, got the float 1e+30"},
        InvalidCase{"explicit_zero_ffn_hidden",
                    kV,
                    {parse_override("model.ffn_hidden=0")},
                    "model.ffn_hidden must be positive (leave it out for 4 x model.hidden), got 0"},
        InvalidCase{"empty_name", kV, {parse_override("model.name=\"\"")}, "model.name must not be empty"},
        InvalidCase{"line_break_in_override",
                    kV,
                    {parse_override("model.layers=4\nhidden=2")},
                    "--set model.layers: the value holds a line break"},
        InvalidCase{
            "block_recompute_beyond_the_chunk",
            kV,
            {parse_override("parallel.recompute=\"full\""), parse_override("parallel.recompute_num_layers=100")},
            "parallel.recompute_num_layers (100) is more than a chunk's layers (4)"},
        InvalidCase{"block_recompute_without_full",
                    kV,
                    {parse_override("parallel.recompute_num_layers=2")},
                    "parallel.recompute_num_layers (2) needs parallel.recompute = \"full\" (Megatron-LM's "
                    "--recompute-method block), got \"none\""},
        InvalidCase{"block_recompute_in_deepspeed",
                    kV,
                    {parse_override("parallel.recompute_num_layers=1"), parse_override("parallel.recompute=\"full\""),
                     parse_override("framework.name=\"deepspeed\"")},
                    "parallel.recompute_num_layers is Megatron-LM's block recompute; framework.name = \"deepspeed\" "
                    "checkpoints every layer"},
        InvalidCase{"attention_fraction_above_one",
                    kV,
                    {parse_override("cluster.attention_gemm_hbm_fraction=64")},
                    "cluster.attention_gemm_hbm_fraction must be a measured fraction of the streaming rate "
                    "(0 < f <= 1), or 0 for the cited value; got 64"},
        InvalidCase{"uneven_interleaved",
                    kV,
                    {parse_override("parallel.first_stage_layers=3"), parse_override("parallel.virtual_stages=2"),
                     parse_override("parallel.schedule=interleaved")},
                    "with parallel.virtual_stages = 2 every stage's layers split evenly over its chunks"},
        InvalidCase{
            "uneven_rest_does_not_split",
            replace(kV, "pp = 2", "pp = 4"),
            {parse_override("parallel.first_stage_layers=1")},
            "model.layers (8) minus parallel.first_stage_layers (1) and parallel.last_stage_layers (0) leaves 7 "
            "for the other 3 stage(s): it must split evenly, at least one layer each"},
        InvalidCase{"uneven_negative",
                    kV,
                    {parse_override("parallel.last_stage_layers=-1")},
                    "parallel.first_stage_layers and parallel.last_stage_layers must be >= 0"},
        InvalidCase{"gemm_shape_of_two",
                    kV,
                    {parse_override("cluster.gemm_tflops=230"), parse_override("cluster.gemm_shape=[8192, 8192]")},
                    "cluster.gemm_shape: expected an array of 3 positive integers, got the array [ 8192, 8192 ]"},
        InvalidCase{"gemm_shape_with_zero",
                    kV,
                    {parse_override("cluster.gemm_tflops=230"), parse_override("cluster.gemm_shape=[8192, 0, 8192]")},
                    "cluster.gemm_shape: expected an array of 3 positive integers"},
        InvalidCase{"gemm_shape_without_rate",
                    kV,
                    {parse_override("cluster.gemm_shape=[8192, 8192, 8192]")},
                    "cluster.gemm_shape is the shape of a measurement: give its rate too (cluster.gemm_tflops)"},
        InvalidCase{"override_of_unknown_key",
                    kV,
                    {parse_override("parallel.tpp=2")},
                    "(--set parallel.tpp): parallel.tpp: unknown key"},
        InvalidCase{"override_without_section", kV, {Override{"tp", "2"}}, "--set tp: expected SECTION.KEY=VALUE"},
        InvalidCase{"learning_rate_zero",
                    kV + "\n[training]\nlearning_rate = 0.0\n",
                    {},
                    "training.learning_rate must be > 0, got 0"},
        InvalidCase{"missing_model", "[parallel]\ntp = 1\n", {}, "the [model] section is required"}),
    [](const ::testing::TestParamInfo<InvalidCase>& case_info) { return std::string(case_info.param.name); });

TEST(Scenario, EveryProblemIsReportedNotJustTheFirst) {
  const std::string text = replace(replace(kV, "heads = 8", "heads = 6"), "layers = 8", "layers = 9");
  EXPECT_GE(scenario_problems_of(text).size(), 2u);
}

TEST(Scenario, MalformedOverrideTextIsRejected) {
  EXPECT_THROW(parse_override("parallel.pp"), ScenarioError);
  EXPECT_THROW(parse_override("=3"), ScenarioError);
}

TEST(Scenario, MissingFileNamesThePath) {
  try {
    load_scenario("/nonexistent/x.toml");
    FAIL() << "expected ScenarioError";
  } catch (const ScenarioError& error) {
    EXPECT_THAT(error.what(), HasSubstr("scenario '/nonexistent/x.toml': cannot open: No such file or directory"));
  }
}

}  // namespace
}  // namespace twin::model
