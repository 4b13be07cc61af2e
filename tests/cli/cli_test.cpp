#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using Result = twin::testing::ShellResult;

// `redirect`: what the shell does with the streams (default: stderr into stdout, both captured).
Result twin(const std::string& arguments, const std::string& redirect = " 2>&1") {
  return twin::testing::run_shell(std::string(TWIN_BINARY) + " " + arguments + redirect);
}

// stderr alone (stdout discarded).
Result twin_stderr(const std::string& arguments) {
  return twin(arguments, " 2>&1 1>/dev/null");
}

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("twin-cli-test-" + std::to_string(getpid()));
}

fs::path scratch(const std::string& name) {
  fs::create_directories(scratch_dir());
  return scratch_dir() / name;
}

struct RemoveScratch : ::testing::Environment {
  void TearDown() override { fs::remove_all(scratch_dir()); }
};
const auto* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

// A 1.3B GPT on two DGX A100 nodes: small enough to simulate in a fraction of a second.
fs::path small_cluster_scenario() {
  const fs::path path = scratch("gpt-1.3b.toml");
  std::ofstream(path) << "[model]\nname = \"gpt-1.3b\"\nlayers = 24\nhidden = 2048\nheads = 16\nseq_len = 2048\n"
                         "vocab = 50257\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 32\nrecompute = \"full\"\n"
                         "[cluster]\nnodes = 2\nnode = \"dgx-a100\"\n";
  return path;
}

TEST(Cli, MegatronFlagsSetTheirScenarioKeys) {
  // Megatron-LM's own flag names are aliases of --set: here the pipeline size and block recompute (the first 4 layers
  // of each chunk run forward again), whose FLOPs the Program and Narayanan's count agree on.
  const Result graph =
      twin("graph " + small_cluster_scenario().string() + " --pipeline-model-parallel-size 4 --recompute-num-layers 4");
  EXPECT_EQ(graph.status, 0) << graph.output;
  EXPECT_THAT(graph.output, HasSubstr("tp 2 x pp 4 x dp 2"));
  EXPECT_THAT(graph.output, HasSubstr("recompute full (the first 4 layers of a chunk)"));
  EXPECT_THAT(graph.output, HasSubstr("(+0.000%)"));
  auto iteration_s = [](const std::string& flags) {
    const fs::path json_path = scratch("block-recompute.json");
    const Result r =
        twin("sim " + small_cluster_scenario().string() + " --quiet --json " + json_path.string() + " " + flags);
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(json_path);
    return nlohmann::json::parse(in)["iteration_time_s"].get<double>();
  };
  EXPECT_LT(iteration_s("--recompute-num-layers 4"), iteration_s(""));
  // Block recompute belongs to full recompute: said so by name.
  const Result selective =
      twin("sim " + small_cluster_scenario().string() + " --quiet --recompute selective --recompute-num-layers 4");
  EXPECT_EQ(selective.status, 2);
  EXPECT_THAT(selective.output, HasSubstr("parallel.recompute_num_layers (4) needs parallel.recompute = \"full\""));
}

TEST(Cli, MegatronMoeFlagsSetTheirScenarioKeys) {
  // Each flag shows its key in the rule it breaks (the scenario is the 24-layer GPT on 16 GPUs, tp 2).
  const std::string scenario = small_cluster_scenario().string() + " --num-experts 8 --sequence-parallel";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--moe-router-topk 9", "model.top_k must be in [1, model.experts = 8], got 9"},
      {"--expert-model-parallel-size 3", "model.experts (8) must be divisible by parallel.ep (3)"},
      {"--moe-ffn-hidden-size 512 --expert-tensor-parallel-size 3",
       "model.moe_ffn_hidden (512) must be divisible by parallel.etp (3)"},
      {"--moe-expert-capacity-factor -1", "model.capacity_factor must be >= 0"},
      {"--moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 700",
       "--moe-shared-expert-intermediate-size 700: not a multiple of the expert width model.moe_ffn_hidden = 512"},
      {"--moe-layer-freq '([0]*3+[1]*20)'", "--moe-layer-freq lists 23 layers; model.layers is 24"},
      {"--moe-layer-freq '[0,1,0]'", "a dense layer after an MoE one is not modelled"},
      {"--moe-layer-freq 2", "every N-th layer MoE is not modelled"},
      {"--moe-shared-expert-intermediate-size 1024 --set model.shared_experts=3",
       "model.shared_experts is given twice"},
  };
  for (const auto& [flags, expected] : cases) {
    const Result r = twin("graph " + scenario + " " + flags);
    EXPECT_EQ(r.status, 2) << flags << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("twin: error:")) << flags;
    EXPECT_THAT(r.output, HasSubstr(expected)) << flags << "\n" << r.output;
  }
  // Without --num-experts, an MoE flag is refused by its key's name.
  const Result dense = twin("graph " + small_cluster_scenario().string() + " --moe-router-topk 2");
  EXPECT_EQ(dense.status, 2);
  EXPECT_THAT(dense.output, HasSubstr("model.top_k is a Mixture-of-Experts key: it needs model.experts > 0"));
  EXPECT_EQ(twin("graph " + scenario + " --moe-layer-freq '([0]*3+[1]*21)' --expert-model-parallel-size 8").status, 0);
}

TEST(Cli, UserErrorsAreOneLineAndExitTwo) {
  const Result missing = twin("graph no-such-scenario");
  EXPECT_EQ(missing.status, 2);
  EXPECT_THAT(missing.output, HasSubstr("twin: error: scenario 'no-such-scenario': no such file"));
  const Result bad_plan = twin("graph mtnlg-530b --set parallel.tp=3 --set parallel.pp=5");
  EXPECT_EQ(bad_plan.status, 2);
  EXPECT_THAT(bad_plan.output, HasSubstr("model.heads (128) must be divisible by parallel.tp (3)"));
  EXPECT_THAT(bad_plan.output, ::testing::Not(HasSubstr("terminate")));
  const Result bad_set = twin("graph gpt-tiny --set parallel.tp");
  EXPECT_EQ(bad_set.status, 2);
  EXPECT_THAT(bad_set.output, HasSubstr("expected SECTION.KEY=VALUE"));
  const Result unknown_section = twin("graph gpt-tiny --set foo.bar=1");
  EXPECT_EQ(unknown_section.status, 2);
  EXPECT_THAT(unknown_section.output, HasSubstr("(--set foo.*): unknown section [foo]"));
  const Result unwritable = twin("graph gpt-tiny --json /nonexistent-twin-dir/program.json");
  EXPECT_EQ(unwritable.status, 2);
  EXPECT_THAT(unwritable.output, HasSubstr("there is no directory '/nonexistent-twin-dir'"));
  const std::string a_directory = fs::temp_directory_path().string();
  const Result directory = twin("graph gpt-tiny --json " + a_directory);  // checked before any work
  EXPECT_EQ(directory.status, 2);
  EXPECT_THAT(directory.output, HasSubstr("is a directory: give a file name"));
  EXPECT_FALSE(fs::exists(a_directory + ".tmp"));
  const Result compare_directory = twin("compare " + a_directory + " 60");
  EXPECT_EQ(compare_directory.status, 2);
  EXPECT_THAT(compare_directory.output, HasSubstr("is a directory, not a JSON file"));
}

TEST(Cli, OutputFilesGoWhereTheirLinksPointAndStreamsAreWrittenInPlace) {
  // A link named by --json keeps pointing at the file it named; the file behind it is replaced atomically.
  const fs::path target = scratch("target.json"), link = scratch("link.json");
  std::ofstream(target) << "old";
  fs::remove(link);
  fs::create_symlink(target.filename(), link);
  ASSERT_EQ(twin("graph gpt-tiny --json " + link.string()).status, 0);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_NO_THROW(nlohmann::json::parse(std::ifstream(target)));
  // A dangling link: the file it names is created.
  const fs::path dangling = scratch("dangling.json"), created = scratch("created.json");
  fs::remove(dangling);
  fs::remove(created);
  fs::create_symlink(created.filename(), dangling);
  ASSERT_EQ(twin("graph gpt-tiny --json " + dangling.string()).status, 0);
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_TRUE(fs::is_regular_file(created));
  // Standard output as a file name: written in place, not replaced (it is not a file to rename over).
  const Result to_stdout = twin("graph gpt-tiny --json /dev/stdout");
  EXPECT_EQ(to_stdout.status, 0);
  EXPECT_THAT(to_stdout.output, HasSubstr("\"stages\""));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  ASSERT_EQ(twin("graph gpt-tiny --json /dev/null").status, 0);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
#ifdef TWIN_HAVE_SIMGRID
  const Result same = twin("sim gpt3-175b --quiet --json " + target.string() + " --svg " + target.string());
  EXPECT_EQ(same.status, 2);
  EXPECT_THAT(same.output, HasSubstr("--json and --svg name the same file"));
#endif
  const Result empty = twin("graph gpt-tiny --json ''");
  EXPECT_EQ(empty.status, 2);
  EXPECT_THAT(empty.output, HasSubstr("--json: the file name is empty"));
}

TEST(Cli, AReportThatCannotBeWrittenIsAFailure) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "skipped: no /dev/full on this system";
  const fs::path errors = scratch("full.err");
  const int status =
      std::system((std::string(TWIN_BINARY) + " graph gpt-tiny > /dev/full 2> " + errors.string()).c_str());
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::stringstream text;
  text << std::ifstream(errors).rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("twin: error: writing standard output failed: No space left on device"));
}

TEST(Cli, AnAliasAndASetThatDisagreeAreRefused) {
  const Result r = twin("graph gpt-tiny --num-layers 4 --set model.layers=16");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("model.layers is given twice, as 4 by a Megatron-style flag and as 16 by --set"));
  EXPECT_EQ(twin("graph gpt-tiny --num-layers 4 --set model.layers=4").status, 0);  // the same value twice is fine
  const Result directory = twin("graph " + fs::temp_directory_path().string());
  EXPECT_EQ(directory.status, 2);
  EXPECT_THAT(directory.output, HasSubstr("is a directory, not a TOML file"));
}

TEST(Cli, NumericFlagsRefuseNanInfAndAbsurdValues) {
#ifdef TWIN_HAVE_SIMGRID
  const Result nan_ratio = twin("sim gpt3-175b --oversubscription nan");
  EXPECT_EQ(nan_ratio.status, 2);
  EXPECT_THAT(nan_ratio.output, HasSubstr("--oversubscription: expected a finite number, got 'nan'"));
  const Result trace_ranks_alone = twin("sim gpt3-175b --trace-ranks 0-7");
  EXPECT_EQ(trace_ranks_alone.status, 2);
  EXPECT_THAT(trace_ranks_alone.output, HasSubstr("--trace"));
  const Result no_jobs = twin("search gpt3-175b --jobs 0");
  EXPECT_EQ(no_jobs.status, 2);
  EXPECT_THAT(no_jobs.output, HasSubstr("--jobs: must be at least 1, got 0"));
#endif
#ifdef TWIN_HAVE_RUN_COMMAND
  const Result threads = twin("run gpt-tiny --steps 1 --threads 100000");
  EXPECT_EQ(threads.status, 2);
  EXPECT_THAT(threads.output, HasSubstr("--threads: must be at most 1024, got 100000"));
  const Result timeout = twin("run gpt-tiny --steps 1 --timeout inf");
  EXPECT_EQ(timeout.status, 2);
  EXPECT_THAT(timeout.output, HasSubstr("--timeout: expected a finite number, got 'inf'"));
#endif
}

TEST(Cli, AnAbsurdlyLargeProgramIsRefusedBeforeItIsBuilt) {
  // 10.5 M layers: about 9e10 ops, terabytes; refused from the estimate, in well under a second.
  const Result r = twin("graph mtnlg-530b --set model.layers=10500000");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("the Program of mt-nlg-530b would hold about"));
  EXPECT_THAT(r.output, HasSubstr("10500000 layers over 35 stages, 240 micro-batches per pipeline"));
}

TEST(Cli, FlagMistakesNameTheFlagAndExitTwo) {
  const Result bad_choice = twin("graph gpt-tiny --granularity kernel");
  EXPECT_EQ(bad_choice.status, 2);
  EXPECT_THAT(bad_choice.output, HasSubstr("--granularity"));
  EXPECT_EQ(twin("--version").status, 0);
  const Result misspelt = twin("smi gpt-tiny");
  EXPECT_EQ(misspelt.status, 2);
  EXPECT_THAT(misspelt.output, HasSubstr("twin: error: unknown command 'smi' (the commands: graph"));
  EXPECT_EQ(twin("graph --help").status, 0);
#ifdef TWIN_HAVE_RUN_COMMAND
  const Result zero_steps = twin("run gpt-tiny --steps 0");
  EXPECT_EQ(zero_steps.status, 2);
  EXPECT_THAT(zero_steps.output, HasSubstr("--steps: must be at least 1, got 0"));
  const Result late_trace = twin("run gpt-tiny --steps 2 --trace-step 3");
  EXPECT_EQ(late_trace.status, 2);
  EXPECT_THAT(late_trace.output, HasSubstr("--trace-step 3 is past the last step (--steps 2)"));
#endif
}

// CLI11's own mistakes are one `twin: error:` line like every other, without "Run with --help" and without a doubled
// "--flag: --flag:" prefix; an unknown flag (a Megatron-LM flag twin does not take) lists the Megatron flags it takes.
TEST(Cli, ParseErrorsAreOneTwinErrorLine) {
  const auto one_line = [](const Result& r) {
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(r.output.rfind("twin: error: ", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("Run with --help")));
  };
  const Result no_command = twin("");
  one_line(no_command);
  EXPECT_THAT(no_command.output, HasSubstr("a command is required (graph"));
  const Result missing_value = twin("graph gpt-tiny --set");
  one_line(missing_value);
  EXPECT_THAT(missing_value.output, HasSubstr("twin: error: --set needs a value (KEY=VALUE)"));
#ifdef TWIN_HAVE_SIMGRID
  const Result tokens = twin("sim gpt3-175b --train-tokens abc");
  one_line(tokens);
  EXPECT_THAT(tokens.output, HasSubstr("twin: error: --train-tokens: expected a number of tokens"));
  const Result gpu = twin("sim gpt3-175b --gpu b200");
  one_line(gpu);
  EXPECT_THAT(gpu.output, HasSubstr("--gpu: b200 not in {a100,h100,h200}"));
#endif
#ifdef TWIN_HAVE_RUN_COMMAND
  const Result zero_steps = twin("run gpt-tiny --steps 0");
  one_line(zero_steps);
  EXPECT_EQ(zero_steps.output, "twin: error: --steps: must be at least 1, got 0\n");
  const Result megatron = twin("run gpt-tiny --lr 1e-4");
  one_line(megatron);
  EXPECT_THAT(megatron.output, HasSubstr("twin: error: twin run: unknown flag --lr (of Megatron-LM's flags, twin "
                                         "takes only those of the plan and the model: --tensor-model-parallel-size, "));
  EXPECT_THAT(megatron.output, HasSubstr("--num-layers-per-virtual-pipeline-stage"));
#endif
  const Result graph_flag = twin("graph gpt-tiny --data-path x");
  one_line(graph_flag);
  EXPECT_THAT(graph_flag.output, HasSubstr("twin graph: unknown flag --data-path"));
}

// A value past a key's range is one problem, not two (ffn_hidden = 2^40 is not also "0").
TEST(Cli, AnOutOfRangeValueIsOneError) {
  const Result r = twin("graph gpt-tiny --set model.ffn_hidden=1099511627776");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("model.ffn_hidden: 1099511627776 is too large (at most 2147483647)"));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

#ifdef TWIN_HAVE_RUN_COMMAND
// Every size guard of twin run runs before anything grows with the plan: a global batch of 2^31 - 4 is refused from
// the scenario's sizes, as twin graph refuses it, in well under a second and without the memory its schedule would
// take (here capped at 4 GB, so that a regression fails instead of exhausting the machine).
TEST(Cli, RunRefusesAnAbsurdPlanBeforeAllocatingByIt) {
  const auto start = std::chrono::steady_clock::now();
  Result r;
  const std::string command = "sh -c 'ulimit -v 4000000; exec " + std::string(TWIN_BINARY) +
                              " run gpt-tiny --set parallel.global_batch=2147483644 --steps 1 --quiet' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe.get())) r.output += buffer.data();
  const int status = pclose(pipe.release());
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("twin: error: the Program of gpt-tiny would hold about"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("--granularity")));  // twin run has none to suggest
  EXPECT_LT(seconds, 5.0);
}

// Output paths are checked before step 1: a run whose --json, --trace or checkpoint directory cannot be written stops
// at once (exit 2), naming the flag, instead of throwing the training away at its end.
TEST(Cli, RunChecksItsOutputsBeforeTraining) {
  for (const auto& [flag, message] :
       {std::pair{"--json /proc/twin-test.json", "--json '/proc/twin-test.json': cannot write in '/proc'"},
        std::pair{"--trace /proc/twin-test.json", "--trace '/proc/twin-test.json': cannot write in '/proc'"},
        std::pair{"--checkpoint /proc/twin-test-checkpoints",
                  "--checkpoint '/proc/twin-test-checkpoints': cannot create the directory"}}) {
    const Result r = twin(std::string("run gpt-tiny --steps 20 ") + flag);
    EXPECT_EQ(r.status, 2) << flag << ": " << r.output;
    EXPECT_EQ(r.output.rfind(std::string("twin: error: ") + message, 0), 0u) << flag << ": " << r.output;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("step 1/20"))) << flag;  // nothing trained
  }
}

// Two runs on one checkpoint directory: the second is refused, naming the first's pid and host.
TEST(Cli, ACheckpointDirectoryInUseIsRefused) {
  const fs::path dir = scratch("locked-checkpoints");
  FILE* first = popen((std::string(TWIN_BINARY) + " run gpt-tiny --steps 1000 --quiet --checkpoint " + dir.string() +
                       " 2>/dev/null & echo $!")
                          .c_str(),
                      "r");
  char pid_text[32] = {};
  ASSERT_NE(std::fgets(pid_text, sizeof pid_text, first), nullptr);
  pclose(first);
  const int pid = std::atoi(pid_text);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(dir / "twin.lock") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the holder writes its pid after taking the lock
  const Result second = twin("run gpt-tiny --steps 1 --quiet --checkpoint " + dir.string());
  kill(pid, SIGKILL);
  EXPECT_EQ(second.status, 2) << second.output;
  EXPECT_THAT(second.output, HasSubstr("is in use by another twin run (pid " + std::to_string(pid) + " on host "));
}
#endif

TEST(Cli, RunRefusesAModelThatCannotFitInHostMemory) {
  const Result r = twin("run mtnlg-530b --steps 1 --quiet");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("mt-nlg-530b needs about"));
  EXPECT_THAT(r.output, HasSubstr("GiB available"));
}

TEST(Cli, GraphWritesTheProgramAsJson) {
  const fs::path json_path = scratch("program.json");
  const Result r = twin("graph gpt-tiny --set parallel.pp=2 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Narayanan's formula"));
  std::ifstream in(json_path);
  const auto program = nlohmann::json::parse(in);
  ASSERT_EQ(program["stages"].size(), 2u);
  EXPECT_FALSE(program["stages"][0]["ops"].empty());
}

TEST(Cli, GraphSaysWhenTheModelUsesAlibi) {
  // gpt-tiny: seq 64 x hidden 128 position-embedding parameters fewer under ALiBi (834304 -> 826112)
  const Result learned = twin("graph gpt-tiny");
  ASSERT_EQ(learned.status, 0) << learned.output;
  EXPECT_THAT(learned.output, HasSubstr("(834304)"));
  EXPECT_THAT(learned.output, ::testing::Not(HasSubstr("ALiBi")));
  const Result alibi = twin("graph gpt-tiny --set model.position_embedding=alibi");
  ASSERT_EQ(alibi.status, 0) << alibi.output;
  EXPECT_THAT(alibi.output, HasSubstr("fp32, ALiBi (no position embedding)"));
  EXPECT_THAT(alibi.output, HasSubstr("(826112)"));
}

TEST(Cli, CompareAgainstAPublishedTime) {
  const fs::path summary = scratch("summary.json");
  std::ofstream(summary) << R"({"scenario": {"tp": 1, "pp": 1, "dp": 1, "micro_batches": 1}, "engine": "sim",
    "iteration_time_s": 50.0, "tflops_per_gpu": 120.0, "bubble_fraction": 0.1, "stages": []})";
  const Result r = twin("compare " + summary.string() + " 40");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("+25.0%"));  // 50 s predicted against 40 s measured
  const fs::path json = scratch("compare.json");
  const Result with_json = twin("compare " + summary.string() + " 40 --json " + json.string());
  ASSERT_EQ(with_json.status, 0) << with_json.output;
  const auto written = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(written["measured_engine"], "published");
  EXPECT_DOUBLE_EQ(written["totals"][0]["error"].get<double>(), 0.25);
  const Result onto_input = twin("compare " + summary.string() + " 40 --json " + summary.string());
  EXPECT_EQ(onto_input.status, 2);
  EXPECT_THAT(onto_input.output, HasSubstr("is the same file as the prediction"));
  EXPECT_TRUE(fs::exists(summary));
  EXPECT_NO_THROW(nlohmann::json::parse(std::ifstream(summary)));  // not overwritten
  const Result bad = twin("compare " + summary.string() + " -3");
  EXPECT_EQ(bad.status, 2);
  const Result infinite = twin("compare " + summary.string() + " inf");
  EXPECT_EQ(infinite.status, 2);
  EXPECT_THAT(infinite.output, HasSubstr("measured iteration time must be a number of seconds"));
  const fs::path broken = scratch("broken-summary.json");
  std::ofstream(broken) << R"({"iteration_time_s": -1, "stages": []})";
  const Result negative = twin("compare " + broken.string() + " 40");
  EXPECT_EQ(negative.status, 2);
  EXPECT_THAT(negative.output, HasSubstr("\"iteration_time_s\" must be a positive number of seconds, got -1"));
}

#ifdef TWIN_HAVE_SIMGRID
// Two predictions of one Program, the second on GPUs with half the GEMM rate: op by op, the compute-bound GEMMs take
// about twice as long, the memory-bound passes and the communication exactly as long.
TEST(Cli, CompareTwoTracesOpByOp) {
  const std::string scenario = small_cluster_scenario().string();
  const fs::path fast = scratch("fast.trace.json"), slow = scratch("slow.trace.json");
  const Result a = twin("sim " + scenario + " --granularity op --quiet --trace-ranks 0,8 --trace " + fast.string());
  ASSERT_EQ(a.status, 0) << a.output;
  const Result b = twin("sim " + scenario + " --granularity op --quiet --trace-ranks 0,8 --trace " + slow.string() +
                        " --set cluster.gemm_tflops=115");
  ASSERT_EQ(b.status, 0) << b.output;
  const Result r = twin("compare " + slow.string() + " " + fast.string() + " --top 2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ops on 2 ranks (0, 8)"));
  std::map<std::string, double> error_percent;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t percent = line.rfind('%');
    if (percent == std::string::npos || line.find("  the ") == 0) continue;
    std::istringstream words(line);
    std::string phase, kind;
    words >> phase >> kind;
    const std::size_t start = line.find_last_of(' ', percent) + 1;
    error_percent[phase + " " + kind] = std::stod(line.substr(start, percent - start));
  }
  ASSERT_TRUE(error_percent.count("forward mlp_up")) << r.output;
  EXPECT_GT(error_percent["forward mlp_up"], 60);
  EXPECT_LT(error_percent["forward mlp_up"], 101);
  EXPECT_DOUBLE_EQ(error_percent["forward layernorm_attention"], 0.0);
  EXPECT_DOUBLE_EQ(error_percent["backward gelu"], 0.0);
  EXPECT_DOUBLE_EQ(error_percent["all_reduce tensor"], 0.0);
  EXPECT_THAT(r.output, HasSubstr("the 2 ops that differ most"));
  const fs::path json = scratch("ops.json");
  ASSERT_EQ(twin("compare " + slow.string() + " " + fast.string() + " --top 2 --json " + json.string()).status, 0);
  const auto ops = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(ops["mode"], "ops");
  EXPECT_EQ(ops["ranks"], (std::vector<int>{0, 8}));
  EXPECT_EQ(ops["largest"].size(), 2u);
  int layernorms = 0;
  for (const auto& cls : ops["classes"]) {
    if (cls["name"] != "forward layernorm_attention") continue;
    ++layernorms;
    EXPECT_DOUBLE_EQ(cls["error"].get<double>(), 0.0);
  }
  EXPECT_EQ(layernorms, 1);

  const Result mixed = twin("compare " + slow.string() + " 0.5");
  EXPECT_EQ(mixed.status, 2);
  EXPECT_THAT(mixed.output, HasSubstr("is a trace: compare it with another trace"));
  const fs::path other = scratch("other.trace.json");
  const Result c = twin("sim " + scenario + " --granularity op --quiet --trace-ranks 0 --trace " + other.string() +
                        " --set parallel.recompute=\"none\"");
  ASSERT_EQ(c.status, 0) << c.output;
  const Result different = twin("compare " + other.string() + " " + fast.string());
  EXPECT_EQ(different.status, 2);
  EXPECT_THAT(different.output, HasSubstr("the traces are of different Programs"));
}

// Both engines read one Program: the simulator's trace of a plan on four GPUs of a DGX A100 and the CPU executor's
// trace of the same scenario have the same ops, rank by rank, which `twin compare` checks op by op.
TEST(Cli, TheSimulatorAndTheExecutorTraceTheSameProgram) {
  const std::string plan =
      " --set cluster.node=\"dgx-a100\" --set cluster.nodes=1 --set cluster.gpus_per_node=4 --set parallel.tp=2"
      " --set parallel.pp=2";
  const fs::path predicted = scratch("sim4.trace.json"), measured = scratch("run4.trace.json");
  const Result sim =
      twin("sim gpt-tiny --granularity op --quiet --trace-ranks 0-3 --trace " + predicted.string() + plan);
  ASSERT_EQ(sim.status, 0) << sim.output;
  EXPECT_THAT(sim.output, HasSubstr("DGX A100, 4 of its 8 GPUs"));
  const Result run = twin("run gpt-tiny --steps 2 --quiet --threads 1 --trace " + measured.string() + plan);
  ASSERT_EQ(run.status, 0) << run.output;
  const Result r = twin("compare " + predicted.string() + " " + measured.string() + " --top 0");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ops on 4 ranks (0-3)"));
  for (const char* op : {"send forward", "recv backward", "all_reduce tensor layer_output", "backward mlp_up",
                         "optimizer optimizer_step"}) {
    EXPECT_THAT(r.output, HasSubstr(op));
  }
  // The one-GPU scenario that bench/gpu_check.sh measures on a GPU: as shipped it fits one H200; shrunk, both
  // engines trace the same Program of it.
  const Result shipped = twin("sim gpt-350m-h200 --quiet");
  ASSERT_EQ(shipped.status, 0) << shipped.output;
  EXPECT_THAT(shipped.output, HasSubstr("gpt-350m: 1 GPUs"));
  EXPECT_THAT(shipped.output, HasSubstr("DGX H200, 1 of its 8 GPUs"));
  const std::string shrunk =
      " --set model.layers=2 --set model.hidden=256 --set model.heads=4 --set model.vocab=512"
      " --set parallel.micro_batch=2 --set parallel.global_batch=4";
  const fs::path one_predicted = scratch("one.sim.json"), one_measured = scratch("one.run.json");
  ASSERT_EQ(twin("sim gpt-350m-h200 --granularity op --quiet --trace " + one_predicted.string() + shrunk).status, 0);
  ASSERT_EQ(twin("run gpt-350m-h200 --steps 1 --quiet --trace " + one_measured.string() + shrunk).status, 0);
  const Result one = twin("compare " + one_predicted.string() + " " + one_measured.string() + " --top 0");
  EXPECT_EQ(one.status, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("ops on 1 rank (0)"));

  const Result too_many = twin(
      "sim gpt-tiny --quiet --set cluster.node=\"dgx-h200\" --set cluster.nodes=1"
      " --set cluster.gpus_per_node=9 --set parallel.dp=9 --set parallel.global_batch=36");
  EXPECT_EQ(too_many.status, 2);
  EXPECT_THAT(too_many.output, HasSubstr("cluster.gpus_per_node = 9 but a DGX H200 has 8 GPUs"));
}

// The README and docs/simulator.md show what `twin sim` prints on the default scenario (MT-NLG on 280 nodes): every
// line of it, but the last (this machine's wall time and memory), must be in both word for word, so that a change of
// the model cannot leave the documented numbers behind.
TEST(Cli, TheDocsShowWhatTwinSimPrintsOnTheDefaultScenario) {
  const Result sim = twin("sim --quiet");
  ASSERT_EQ(sim.status, 0) << sim.output;
  int compared = 0;
  for (const char* doc : {"README.md", "docs/simulator.md"}) {
    std::ifstream in(fs::path(TWIN_SOURCE_DIR) / doc);
    ASSERT_TRUE(in) << doc;
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::istringstream lines(sim.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line.starts_with("  simulated by")) continue;
      EXPECT_THAT(text, HasSubstr(line)) << doc << " does not show this line of `twin sim`; paste the new output";
      ++compared;
    }
  }
  EXPECT_GE(compared, 2 * 12);  // the header, the summary, the split, the stage table, the constants
}

// --sensitivity: each rate of the hardware model moved down and up; the shares of the time they govern add up to
// about the whole iteration, and on an ideal network the links govern none of it.
TEST(Cli, SimSensitivityMovesEachRateOfTheHardwareModel) {
  const std::string scenario = small_cluster_scenario().string();
  const fs::path json_path = scratch("sensitivity.json");
  const Result r = twin("sim " + scenario + " --quiet --sensitivity=20 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sensitivity: the iteration time with one rate 20 % lower / higher"));
  const auto json = nlohmann::json::parse(std::ifstream(json_path));
  ASSERT_EQ(json["sensitivity"].size(), 6u);
  std::map<std::string, double> share;
  double total = 0;
  const double base = json["iteration_time_s"].get<double>();
  for (const auto& one : json["sensitivity"]) {
    EXPECT_EQ(one["percent"], 20.0);
    // a lower rate never makes the iteration faster
    EXPECT_GE(one["lower_s"].get<double>(), base * (1 - 1e-9)) << one.dump();
    EXPECT_LE(one["higher_s"].get<double>(), base * (1 + 1e-9)) << one.dump();
    share[one["rate"].get<std::string>()] = one["elasticity"].get<double>();
    total += one["elasticity"].get<double>();
  }
  for (const auto& one : json["sensitivity"]) {
    EXPECT_DOUBLE_EQ(one["lower_factor"].get<double>(), 0.8) << one.dump();
    EXPECT_LE(one["higher_factor"].get<double>(), 1.2 + 1e-12) << one.dump();
    // NCCL's 24 GB/s on a 25 GB/s HDR NIC: the network gains at most the line rate
    if (one["rate"] == "network_bandwidth") {
      EXPECT_NEAR(one["higher_factor"].get<double>(), 25.0 / 24.0, 1e-9);
    }
  }
  EXPECT_GT(share["gemm_rate"], 0.3);
  EXPECT_GT(share["hbm_bandwidth"], 0.0);
  EXPECT_GT(share["network_bandwidth"], 0.0);  // DP 4 over two nodes
  EXPECT_GT(total, 0.8);
  EXPECT_LT(total, 1.2);
  const fs::path ideal_path = scratch("sensitivity-ideal.json");
  ASSERT_EQ(twin("sim " + scenario + " --quiet --ideal-network --sensitivity 10 --json " + ideal_path.string()).status,
            0);
  const auto ideal = nlohmann::json::parse(std::ifstream(ideal_path));  // kept: the loop reads into it
  for (const auto& one : ideal["sensitivity"]) {
    if (one["rate"] == "network_bandwidth" || one["rate"] == "nvlink_bandwidth") {
      EXPECT_DOUBLE_EQ(one["elasticity"].get<double>(), 0.0) << one.dump();
    }
    EXPECT_EQ(one["percent"], 10.0);
  }
  EXPECT_EQ(twin("sim " + scenario + " --quiet --sensitivity=0").status, 2);
  EXPECT_EQ(twin("sim " + scenario + " --quiet --sensitivity=80").status, 2);
  EXPECT_EQ(twin("sim " + scenario + " --quiet --sensitivity").status, 2);  // a percentage is required
}

TEST(Cli, SearchTriesPipelinesThatSplitUnevenLayers) {
  // 22 layers with 3 on each end stage: only a pipeline of 4 splits the other 16 evenly, and 4 does not divide 22.
  const fs::path json_path = scratch("search-uneven.json");
  const Result r = twin("search " + small_cluster_scenario().string() +
                        " --set model.layers=22 --set parallel.pp=4 --set parallel.first_stage_layers=3"
                        " --set parallel.last_stage_layers=3 --max 2 --jobs 2 --json " +
                        json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(json_path);
  const auto plans = nlohmann::json::parse(in)["plans"];
  ASSERT_FALSE(plans.empty());
  for (const auto& plan : plans) EXPECT_EQ(plan["pp"], 4);
}

TEST(Cli, SearchKeepsAndVariesContextParallelism) {
  // The scenario's cp takes its share of the GPUs: dp = 16 / (tp x pp x 2). Before, dp was 16 / (tp x pp), every plan
  // was invalid, and search reported none ("0 rejected for memory").
  const fs::path kept_path = scratch("search-cp-kept.json");
  const Result kept = twin("search " + small_cluster_scenario().string() +
                           " --context-parallel-size 2 --set model.layers=4 --set parallel.global_batch=8"
                           " --set framework.attention=flash2 --max 2 --jobs 2 --json " + kept_path.string());
  ASSERT_EQ(kept.status, 0) << kept.output;
  EXPECT_THAT(kept.output, HasSubstr(" cp "));
  std::ifstream kept_in(kept_path);
  const auto kept_plans = nlohmann::json::parse(kept_in)["plans"];
  ASSERT_FALSE(kept_plans.empty());
  for (const auto& plan : kept_plans) {
    EXPECT_EQ(plan["cp"], 2);
    EXPECT_EQ(plan["tp"].get<int>() * plan["pp"].get<int>() * plan["dp"].get<int>() * plan["cp"].get<int>(), 16);
    EXPECT_EQ(plan["error"], "");
  }
  // --vary-cp tries cp 1, 2, 4, 8: the enumeration holds plans of several sizes (ranked by ideal bubble, the first few
  // simulated are pp 1 plans of tp 1, in the order cp 1, 2, 4, 8).
  const fs::path varied_path = scratch("search-cp-varied.json");
  const Result varied = twin("search " + small_cluster_scenario().string() +
                             " --set parallel.pp=1 --set model.layers=2 --set parallel.global_batch=8"
                             " --set framework.attention=flash2 --vary-cp --max 8 --jobs 2 --json " +
                             varied_path.string());
  ASSERT_EQ(varied.status, 0) << varied.output;
  std::ifstream varied_in(varied_path);
  std::set<int> sizes;
  const auto varied_plans = nlohmann::json::parse(varied_in)["plans"];
  for (const auto& plan : varied_plans) sizes.insert(plan["cp"].get<int>());
  EXPECT_GE(sizes.size(), 2u);
  EXPECT_TRUE(sizes.count(2) || sizes.count(4) || sizes.count(8));
}

TEST(Cli, SearchLeavesMemoryHeadroomStatesItsCapAndExplains) {
  // "Fits" left no headroom: a plan at 78.8 of 80 GiB ranked first. Now a plan must leave --memory-headroom free
  // (default 5 %), the output says how many of the plans that fit it simulated, and --explain says why the others
  // were left out.
  auto search = [](const std::string& flags, const std::string& name) {
    const fs::path json_path = scratch(name);
    const Result r = twin("search " + small_cluster_scenario().string() + " --set parallel.recompute=none --max 1 "
                          "--jobs 1 --json " + json_path.string() + " " + flags);
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(json_path);
    return std::make_pair(r.output, nlohmann::json::parse(in));
  };
  const auto [none_output, none] = search("--memory-headroom 0%", "headroom-0.json");
  const auto [tight_output, tight] = search("--memory-headroom 60 --explain", "headroom-60.json");
  EXPECT_THAT(none_output, HasSubstr("plans that fit simulated (--max 1: the 1 fastest, proven by a lower bound"));
  EXPECT_THAT(none_output, HasSubstr(" pruned by the bound, "));
  EXPECT_THAT(none_output, HasSubstr("(16 GPUs), bf16, global batch"));  // the precision, named
  EXPECT_GT(none["plans"][0]["time_split"]["compute"].get<double>(), 0);  // each row's time split
  EXPECT_LT(tight["plans_that_fit"].get<int>(), none["plans_that_fit"].get<int>());
  EXPECT_GT(tight["rejected_for_memory"].get<int>(), none["rejected_for_memory"].get<int>());
  ASSERT_TRUE(tight.contains("rejected"));
  int memory_reasons = 0;
  for (const auto& r : tight["rejected"]) {
    if (r["memory"].get<bool>()) {
      ++memory_reasons;
      EXPECT_THAT(r["reason"].get<std::string>(), HasSubstr("the headroom leaves"));
    }
  }
  EXPECT_EQ(memory_reasons, tight["rejected_for_memory"].get<int>());
  EXPECT_THAT(tight_output, HasSubstr("not simulated ("));
  EXPECT_EQ(twin("search " + small_cluster_scenario().string() + " --memory-headroom 100%").status, 2);
}

TEST(Cli, SearchRanksValidPlansByIterationTime) {
  const fs::path json_path = scratch("search.json");
  const Result r = twin("search " + small_cluster_scenario().string() + " --max 5 --jobs 2 --train-tokens 10B --json " +
                        json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("GPU-hours"));
  EXPECT_THAT(r.output, HasSubstr(" mem GiB  fits"));
  std::ifstream in(json_path);
  const auto plans = nlohmann::json::parse(in)["plans"];
  ASSERT_EQ(plans.size(), 5u);
  double previous = 0;
  for (const auto& plan : plans) {
    EXPECT_EQ(plan["error"], "");
    EXPECT_TRUE(plan["fits"].get<bool>());  // search simulates only plans that fit: it says so per plan
    EXPECT_EQ(plan["tp"].get<int>() * plan["pp"].get<int>() * plan["dp"].get<int>(), 16);
    EXPECT_GE(plan["iteration_time_s"].get<double>(), previous);
    previous = plan["iteration_time_s"].get<double>();
    // The same global batch for every plan: the run takes as many iterations of each plan's own time.
    EXPECT_DOUBLE_EQ(plan["training"]["time_s"].get<double>(),
                     std::ceil(10e9 / (32.0 * 2048)) * plan["iteration_time_s"].get<double>());
  }
}

TEST(Cli, SearchVariesSequenceParallelismAndZero) {
  // Each plan with and without sequence parallelism (only where tp > 1) and with ZeRO stages 0 and 1: the memory each
  // saves (activations split across TP, optimizer state across DP) shows in the plans it ranks.
  const fs::path json_path = scratch("search-sharding.json");
  // 4 layers and 8 sequences (a few hundredths of a second a plan): --max proves its plans the fastest, simulating
  // more than it lists.
  const Result r = twin("search " + small_cluster_scenario().string() +
                        " --set model.layers=4 --set parallel.global_batch=8 --vary-sequence-parallel --vary-zero"
                        " --max 32 --jobs 2 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sp zero1"));
  std::ifstream in(json_path);
  const auto listed = nlohmann::json::parse(in)["plans"];
  std::map<std::string, std::map<std::string, double>> memory;  // plan -> sharding -> bytes
  for (const auto& plan : listed) {
    ASSERT_EQ(plan["error"], "") << plan.dump();
    if (plan["tp"] == 1) {
      EXPECT_FALSE(plan["sequence_parallel"].get<bool>()) << plan.dump();
    }
    if (plan["dp"] == 1) continue;  // nothing for ZeRO to shard
    const std::string key = plan["tp"].dump() + " " + plan["pp"].dump() + " " + plan["micro_batch"].dump() + " " +
                            plan["virtual_stages"].dump() + " " + plan["recompute"].dump();
    const std::string sharding =
        std::string(plan["sequence_parallel"].get<bool>() ? "sp" : "-") + "/" + plan["zero_stage"].dump();
    EXPECT_EQ(memory[key].count(sharding), 0u) << "a plan listed twice: " << key << " " << sharding;
    memory[key][sharding] = plan["memory_per_gpu_bytes"].get<double>();
  }
  int complete = 0;
  for (auto& [key, by] : memory) {
    if (by.size() != 4) continue;
    ++complete;
    EXPECT_LT(by["sp/0"], by["-/0"]) << key;
    EXPECT_LT(by["-/1"], by["-/0"]) << key;
    EXPECT_LT(by["sp/1"], by["sp/0"]) << key;
  }
  EXPECT_GE(complete, 1) << r.output;
  // The scenario's overlap_param_gather goes with the distributed optimizer: kept on its ZeRO-1 plans, off on ZeRO-0.
  const fs::path overlap_path = scratch("search-overlap.json");
  const Result overlap = twin("search " + small_cluster_scenario().string() +
                              " --set model.layers=4 --set parallel.global_batch=8 --set parallel.zero_stage=1"
                              " --set parallel.dp_overlap=true --set parallel.overlap_param_gather=true --vary-zero"
                              " --max 64 --jobs 2 --json " + overlap_path.string());
  ASSERT_EQ(overlap.status, 0) << overlap.output;
  std::ifstream overlap_in(overlap_path);
  const auto overlap_plans = nlohmann::json::parse(overlap_in)["plans"];
  std::set<std::int64_t> stages;
  for (const auto& plan : overlap_plans) {
    stages.insert(plan["zero_stage"].get<std::int64_t>());
    EXPECT_EQ(plan["overlap_param_gather"].get<bool>(), plan["zero_stage"] == 1) << plan.dump();
    EXPECT_EQ(plan["error"], "") << plan.dump();
  }
  EXPECT_EQ(stages, (std::set<std::int64_t>{0, 1})) << overlap.output;
  const Result composer = twin("search " + small_cluster_scenario().string() +
                               " --set framework.name=\"composer\" --set parallel.zero_stage=3 --set parallel.tp=1"
                               " --set parallel.pp=1 --vary-zero");
  EXPECT_EQ(composer.status, 2);
  EXPECT_THAT(composer.output, HasSubstr("shards with FSDP"));
}

TEST(Cli, MegatronLaunchFlagsGiveTheProgramOfTheKeysTheyName) {
  // A Megatron-Core launch line's plan flags, pasted, build the same Program (byte for byte in `twin graph --json`) as
  // the scenario keys they stand for, the ones Megatron derives included: --swiglu's ffn of 4h x 2/3 rounded down to
  // 64 (2048 -> 5440), and the chunks of --num-layers-per-virtual-pipeline-stage (24 layers / (pp 2 x 3) = 4).
  const std::string scenario = small_cluster_scenario().string();
  const fs::path megatron_json = scratch("megatron-flags.json"), keys_json = scratch("megatron-keys.json");
  const Result megatron =
      twin("graph " + scenario +
           " --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --swiglu"
           " --untie-embeddings-and-output-weights --disable-bias-linear --normalization RMSNorm"
           " --position-embedding-type rope --recompute-granularity selective --bf16"
           " --make-vocab-size-divisible-by 64 --num-layers-per-virtual-pipeline-stage 3 --json " +
           megatron_json.string());
  ASSERT_EQ(megatron.status, 0) << megatron.output;
  EXPECT_THAT(megatron.output, HasSubstr("ffn 5440"));
  EXPECT_THAT(megatron.output, HasSubstr("interleaved (v = 4)"));
  const Result keys =
      twin("graph " + scenario +
           " --set parallel.sequence_parallel=true --set parallel.zero_stage=1 --set parallel.dp_overlap=true"
           " --set parallel.overlap_param_gather=true --set model.activation=swiglu --set model.ffn_hidden=5440"
           " --set framework.tied_embeddings=false --set model.linear_bias=false --set model.norm=rmsnorm"
           " --set model.position_embedding=rope --set parallel.recompute=selective --set model.dtype=bf16"
           " --set parallel.vocab_pad_multiple=64 --set parallel.virtual_stages=4 --set parallel.schedule=interleaved"
           " --json " +
           keys_json.string());
  ASSERT_EQ(keys.status, 0) << keys.output;
  auto contents = [](const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  EXPECT_FALSE(contents(megatron_json).empty());
  EXPECT_EQ(contents(megatron_json), contents(keys_json));
  // Megatron's --num-query-groups defaults to 1: --group-query-attention alone is multi-query attention.
  EXPECT_THAT(twin("graph " + scenario + " --group-query-attention --tensor-model-parallel-size 1").output,
              HasSubstr("1 key/value heads"));
  EXPECT_THAT(twin("graph " + scenario + " --group-query-attention --num-query-groups 4").output,
              HasSubstr("4 key/value heads"));
  // Dropout is off only when both of Megatron's probabilities are 0 (each 0.1 unless given).
  const std::string no_dropout = twin("sim " + scenario + " --quiet --attention-dropout 0 --hidden-dropout 0").output;
  EXPECT_THAT(no_dropout, HasSubstr("dropout = false"));
  EXPECT_THAT(twin("sim " + scenario + " --quiet --attention-dropout 0").output, HasSubstr("dropout = true"));
  EXPECT_THAT(twin("sim " + scenario + " --quiet --use-flash-attn").output, HasSubstr("attention = flash2"));
  const Result dropout_twice = twin("graph " + scenario + " --hidden-dropout 0.1 --set framework.dropout=false");
  EXPECT_EQ(dropout_twice.status, 2);
  EXPECT_THAT(dropout_twice.output, HasSubstr("framework.dropout is given twice"));
  // A scenario's own ffn_hidden stays.
  EXPECT_THAT(twin("graph " + scenario + " --swiglu --ffn-hidden-size 6144").output, HasSubstr("ffn 6144"));
  // Megatron's uniform method recomputes every layer; block (the default here) the first N of each chunk.
  EXPECT_THAT(twin("graph " + scenario + " --recompute-method uniform --recompute-num-layers 2").output,
              HasSubstr("recompute full, "));
  EXPECT_THAT(twin("graph " + scenario + " --recompute-method block --recompute-num-layers 2").output,
              HasSubstr("recompute full (the first 2 layers of a chunk)"));
  // Chunks per stage directly, by twin's name or Megatron-Core's.
  for (const char* flag : {"--virtual-stages 2", "--num-virtual-stages-per-pipeline-rank 2"}) {
    EXPECT_THAT(twin("graph " + scenario + " " + flag).output, HasSubstr("interleaved (v = 2)")) << flag;
  }
  // Chunks that do not divide the layers, or given twice, are refused by name.
  const Result uneven = twin("graph " + scenario + " --num-layers-per-virtual-pipeline-stage 5");
  EXPECT_EQ(uneven.status, 2);
  EXPECT_THAT(uneven.output, HasSubstr("model.layers (24) is not a multiple of parallel.pp x 5 = 10"));
  const Result twice = twin("graph " + scenario + " --num-layers-per-virtual-pipeline-stage 3 --virtual-stages 2");
  EXPECT_EQ(twice.status, 2);
  EXPECT_THAT(twice.output, HasSubstr("both say how many chunks a stage holds"));
  // Under twin sweep the derived chunks follow each variant: 24 layers in chunks of 3 are 4 chunks per stage at pp 2
  // and 2 at pp 4, each variant the prediction `twin sim` gives with those keys.
  const fs::path sweep_json = scratch("megatron-sweep.json");
  const Result sweep = twin("sweep " + scenario + " --num-layers-per-virtual-pipeline-stage 3 --vary parallel.pp=2,4" +
                            " --jobs 2 --quiet --json " + sweep_json.string());
  ASSERT_EQ(sweep.status, 0) << sweep.output;
  std::ifstream sweep_in(sweep_json);
  const auto variants = nlohmann::json::parse(sweep_in)["variants"];
  ASSERT_EQ(variants.size(), 2u);
  for (const auto& [variant, pp, chunks] : {std::tuple{0, 2, 4}, std::tuple{1, 4, 2}}) {
    const fs::path sim_json = scratch("megatron-sweep-sim.json");
    ASSERT_EQ(twin("sim " + scenario + " --quiet --set parallel.pp=" + std::to_string(pp) +
                   " --set parallel.virtual_stages=" + std::to_string(chunks) +
                   " --set parallel.schedule=interleaved --json " + sim_json.string())
                  .status,
              0);
    std::ifstream sim_in(sim_json);
    EXPECT_DOUBLE_EQ(variants[variant]["iteration_time_s"].get<double>(),
                     nlohmann::json::parse(sim_in)["iteration_time_s"].get<double>())
        << "pp " << pp;
  }
}

TEST(Cli, SimHeaderNamesExpertParallelismAndPrecision) {
  // The header read "8 GPUs, TP 1 x PP 2 x DP 4" for an EP 4 plan with FP8 GEMMs: neither was visible.
  const fs::path path = scratch("moe-fp8.toml");
  std::ofstream(path) << "[model]\nname = \"gpt-moe\"\nlayers = 4\nhidden = 1024\nheads = 16\nseq_len = 2048\n"
                         "vocab = 50257\nexperts = 8\ntop_k = 2\nfp8 = \"hybrid\"\n[parallel]\ntp = 1\npp = 2\nep = 4\n"
                         "global_batch = 32\n[cluster]\nnodes = 1\nnode = \"dgx-h100\"\n";
  const fs::path json_path = scratch("moe-fp8.json");
  const Result r = twin("sim " + path.string() + " --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("TP 1 x PP 2 x DP 4 (EP 4), fp8 hybrid, delayed,"));
  std::ifstream in(json_path);
  const auto scenario = nlohmann::json::parse(in)["scenario"];
  EXPECT_EQ(scenario["ep"], 4);
  EXPECT_EQ(scenario["precision"], "fp8 hybrid, delayed");
}

TEST(Cli, SimSweepAndSearchPriceTheRunsGpuHours) {
  // --usd-per-gpu-hour turns a run's GPU-hours into dollars (issue 40, item 5): in twin sim's lines and JSON, and in
  // every sweep variant's and search plan's `training`; without --train-tokens there is no run to price.
  const fs::path json_path = scratch("priced.json");
  const Result r = twin("sim " + small_cluster_scenario().string() +
                        " --quiet --train-tokens 10B --usd-per-gpu-hour 2.5 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("at $2.5 per GPU-hour: $"));
  std::ifstream in(json_path);
  const auto training = nlohmann::json::parse(in)["training"];
  EXPECT_DOUBLE_EQ(training["cost_usd"].get<double>(), 2.5 * training["gpu_hours"].get<double>());
  const Result unpriced = twin("sim " + small_cluster_scenario().string() + " --quiet --usd-per-gpu-hour 2.5");
  EXPECT_EQ(unpriced.status, 2);
  EXPECT_THAT(unpriced.output, HasSubstr("twin: error: --usd-per-gpu-hour prices a training run"));
  EXPECT_EQ(twin("sim " + small_cluster_scenario().string() + " --quiet --train-tokens 10B --usd-per-gpu-hour 0").status,
            2);
  const fs::path search_path = scratch("priced-search.json");
  const Result search = twin("search " + small_cluster_scenario().string() + " --max 2 --jobs 2 --quiet "
                             "--train-tokens 10B --usd-per-gpu-hour 2 --json " + search_path.string());
  ASSERT_EQ(search.status, 0) << search.output;
  std::ifstream search_in(search_path);
  const auto plans = nlohmann::json::parse(search_in)["plans"];
  ASSERT_FALSE(plans.empty());
  for (const auto& plan : plans) {
    EXPECT_DOUBLE_EQ(plan["training"]["cost_usd"].get<double>(), 2 * plan["training"]["gpu_hours"].get<double>());
  }
  const fs::path sweep_path = scratch("priced-sweep.json");
  const Result sweep = twin("sweep " + small_cluster_scenario().string() + " --vary parallel.pp=2,4 --jobs 2 --quiet "
                            "--train-tokens 10B --usd-per-gpu-hour 2 --json " + sweep_path.string());
  ASSERT_EQ(sweep.status, 0) << sweep.output;
  std::ifstream sweep_in(sweep_path);
  const auto variants = nlohmann::json::parse(sweep_in)["variants"];
  ASSERT_EQ(variants.size(), 2u);
  for (const auto& variant : variants) {
    EXPECT_DOUBLE_EQ(variant["training"]["cost_usd"].get<double>(),
                     2 * variant["training"]["gpu_hours"].get<double>());
  }
}

TEST(Cli, TheScenariosPriceCostsARunUnlessTheFlagGivesAnother) {
  // cluster.usd_per_gpu_hour (issue 40, item 5's scenario key): the price of a --train-tokens run in twin sim and in
  // every sweep variant, the flag winning over it; a price past 1000 dollars a GPU-hour is refused naming the key.
  const fs::path sim_path = scratch("scenario-priced.json");
  const Result r = twin("sim " + small_cluster_scenario().string() +
                        " --quiet --train-tokens 10B --set cluster.usd_per_gpu_hour=3 --json " + sim_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("at $3 per GPU-hour: $"));
  std::ifstream in(sim_path);
  const auto training = nlohmann::json::parse(in)["training"];
  EXPECT_DOUBLE_EQ(training["usd_per_gpu_hour"].get<double>(), 3);
  EXPECT_DOUBLE_EQ(training["cost_usd"].get<double>(), 3 * training["gpu_hours"].get<double>());
  const Result flag = twin("sim " + small_cluster_scenario().string() +
                           " --quiet --train-tokens 10B --set cluster.usd_per_gpu_hour=3 --usd-per-gpu-hour 2");
  ASSERT_EQ(flag.status, 0) << flag.output;
  EXPECT_THAT(flag.output, HasSubstr("at $2 per GPU-hour: $"));
  const fs::path sweep_path = scratch("scenario-priced-sweep.json");
  const Result sweep = twin("sweep " + small_cluster_scenario().string() + " --vary parallel.pp=2,4 --jobs 2 --quiet "
                            "--train-tokens 10B --set cluster.usd_per_gpu_hour=3 --json " + sweep_path.string());
  ASSERT_EQ(sweep.status, 0) << sweep.output;
  std::ifstream sweep_in(sweep_path);
  for (const auto& variant : nlohmann::json::parse(sweep_in)["variants"]) {
    EXPECT_DOUBLE_EQ(variant["training"]["cost_usd"].get<double>(),
                     3 * variant["training"]["gpu_hours"].get<double>());
  }
  const Result slip = twin("sim " + small_cluster_scenario().string() + " --quiet --set cluster.usd_per_gpu_hour=2500");
  EXPECT_EQ(slip.status, 2);
  EXPECT_THAT(slip.output, HasSubstr("cluster.usd_per_gpu_hour must be US dollars per GPU-hour"));
}

TEST(Cli, SimEstimatesAWholeTrainingRun) {
  // GPT-3 175B, 300 B tokens on 1024 GPUs: the iterations are whole global batches, the days follow from the
  // simulated iteration, and they agree with Narayanan et al.'s end-to-end estimate 8 T P / (n X) (SC'21, Sec. 5.1)
  // taken with twin's own rate X: the estimate leaves out only the attention and logits terms, s/6h + V/16lh, 3 %.
  const fs::path json_path = scratch("train-tokens.json");
  const Result r = twin("sim gpt3-175b --quiet --train-tokens 300B --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("training 300 B tokens"));
  std::ifstream in(json_path);
  const auto json = nlohmann::json::parse(in);
  const auto training = json["training"];
  const double tokens_per_iteration = 1536.0 * 2048;
  EXPECT_DOUBLE_EQ(training["tokens"].get<double>(), 300e9);
  EXPECT_DOUBLE_EQ(training["iterations"].get<double>(), std::ceil(300e9 / tokens_per_iteration));
  EXPECT_DOUBLE_EQ(training["time_s"].get<double>(),
                   training["iterations"].get<double>() * json["iteration_time_s"].get<double>());
  EXPECT_DOUBLE_EQ(training["days"].get<double>(), training["time_s"].get<double>() / 86400);
  EXPECT_DOUBLE_EQ(training["gpu_hours"].get<double>(), training["time_s"].get<double>() / 3600 * 1024);
  const double l = 96, h = 12288, s = 2048, vocab = 50304;  // 50257 padded to 128 x 8 for TP 8, as Megatron does
  const double parameters = 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + s) / (12 * l * h));
  const double estimate_s = 8 * 300e9 * parameters / (1024 * json["tflops_per_gpu"].get<double>() * 1e12);
  EXPECT_NEAR(training["time_s"].get<double>() / estimate_s, 1 + s / (6 * h) + vocab / (16 * l * h), 0.01);
  // The same count written another way gives the same run; a count that is not one is refused, naming the flag.
  const fs::path plain_path = scratch("train-tokens-plain.json");
  ASSERT_EQ(twin("sim gpt3-175b --quiet --train-tokens 3e11 --json " + plain_path.string()).status, 0);
  std::ifstream plain_in(plain_path);
  EXPECT_EQ(nlohmann::json::parse(plain_in)["training"], training);
  for (const std::string bad : {"0", "-5", "300X", "300 B", "1e19", "nan", "B"}) {
    const Result refused = twin("sim gpt3-175b --quiet --train-tokens '" + bad + "'");
    EXPECT_EQ(refused.status, 2) << bad << "\n" << refused.output;
    EXPECT_THAT(refused.output, HasSubstr("--train-tokens")) << bad;
  }
}

TEST(Cli, SweepSimulatesEveryCombinationAsTwinSimWould) {
  // Two keys of two values: four variants, the first key slowest, each the same prediction as `twin sim` with the
  // same --set gives; more nodes shorten the iteration (more replicas for the same global batch).
  const std::string scenario = small_cluster_scenario().string();
  const fs::path json_path = scratch("sweep.json");
  const Result r = twin("sweep " + scenario + " --vary cluster.nodes=2,4 --vary parallel.micro_batch=1,2 --jobs 2" +
                        " --train-tokens 1B --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cluster.nodes parallel.micro_batch"));
  std::ifstream in(json_path);
  const auto sweep = nlohmann::json::parse(in);
  EXPECT_EQ(sweep["varied"], nlohmann::json({"cluster.nodes", "parallel.micro_batch"}));
  const auto variants = sweep["variants"];
  ASSERT_EQ(variants.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> order{{"2", "1"}, {"2", "2"}, {"4", "1"}, {"4", "2"}};
  for (std::size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(variants[i]["set"]["cluster.nodes"], order[i].first);
    EXPECT_EQ(variants[i]["set"]["parallel.micro_batch"], order[i].second);
    EXPECT_EQ(variants[i]["error"], "") << variants[i].dump();
    EXPECT_EQ(variants[i]["gpus"], 8 * std::stoi(order[i].first));
    // 32 sequences of 2048 tokens per iteration.
    EXPECT_NEAR(variants[i]["tokens_per_s"].get<double>() * variants[i]["iteration_time_s"].get<double>(), 32.0 * 2048,
                1e-6);
    EXPECT_DOUBLE_EQ(variants[i]["training"]["time_s"].get<double>(),
                     std::ceil(1e9 / (32.0 * 2048)) * variants[i]["iteration_time_s"].get<double>());
  }
  EXPECT_LT(variants[2]["iteration_time_s"].get<double>(), variants[0]["iteration_time_s"].get<double>());
  const fs::path sim_json = scratch("sweep-sim.json");
  ASSERT_EQ(twin("sim " + scenario + " --quiet --set cluster.nodes=4 --set parallel.micro_batch=2 --json " +
                 sim_json.string())
                .status,
            0);
  std::ifstream sim_in(sim_json);
  const auto sim = nlohmann::json::parse(sim_in);
  EXPECT_DOUBLE_EQ(variants[3]["iteration_time_s"].get<double>(), sim["iteration_time_s"].get<double>());
  EXPECT_DOUBLE_EQ(variants[3]["memory_per_gpu_bytes"].get<double>(), sim["memory_per_gpu_bytes"].get<double>());
}

TEST(Cli, SearchVariesTheZeroBubbleSchedule) {
  // 8 layers (pipelines of 2, 4 and 8 stages) and 8 sequences: --max 1 proves the fastest, simulating a few plans.
  const std::string scenario =
      small_cluster_scenario().string() + " --set model.layers=8 --set parallel.global_batch=8";
  // The plans that fit, counted before any is simulated: --vary-schedule adds one ZB-H1 plan per 1F1B plan with a
  // pipeline (and none without one).
  const auto plans_found = [&](const std::string& flags) {
    const Result searched = twin("search " + scenario + " --max 1 --jobs 1 " + flags);
    EXPECT_EQ(searched.status, 0) << searched.output;
    const std::size_t at = searched.output.find(" plans of ");
    EXPECT_NE(at, std::string::npos) << searched.output;
    const std::size_t start = searched.output.rfind(' ', at - 1);
    return std::stoi(searched.output.substr(start + 1, at - start - 1));
  };
  const int base = plans_found(""), varied = plans_found("--vary-schedule");
  EXPECT_GT(varied, base);
  EXPECT_LT(varied, 2 * base);  // not for the plans without a pipeline, nor the interleaved ones
}

TEST(Cli, SearchAndSweepAreSilentOnStderrWithQuiet) {
  // Scripts read stdout (or --json); --quiet leaves stderr to errors. Without it the header and progress go there.
  const std::string scenario = small_cluster_scenario().string();
  const Result loud = twin_stderr("sweep " + scenario + " --vary cluster.nodes=2,4 --jobs 2");
  ASSERT_EQ(loud.status, 0) << loud.output;
  EXPECT_THAT(loud.output, HasSubstr("simulated"));
  const Result sweep = twin_stderr("sweep " + scenario + " --vary cluster.nodes=2,4 --jobs 2 --quiet");
  EXPECT_EQ(sweep.status, 0);
  EXPECT_EQ(sweep.output, "");
  const Result search = twin_stderr("search " + scenario + " --max 2 --jobs 2 --quiet");
  EXPECT_EQ(search.status, 0);
  EXPECT_EQ(search.output, "");
  // An error still says so.
  const Result refused = twin_stderr("sweep " + scenario + " --vary cluster.nodes=0 --quiet");
  EXPECT_EQ(refused.status, 2);
  EXPECT_THAT(refused.output, HasSubstr("twin: error:"));
}

// A variant whose memory does not fit one GPU is still simulated, and says so: the fits column and JSON field (and
// twin sim --json's), where only its memory column showed it.
TEST(Cli, SweepAndSimSayWhetherAPlanFitsInMemory) {
  const fs::path json_path = scratch("fits.json");
  const Result r = twin("sweep gpt3-175b --vary parallel.pp=8,2 --quiet --jobs 2 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(" fits "));
  const auto variants = nlohmann::json::parse(std::ifstream(json_path))["variants"];
  ASSERT_EQ(variants.size(), 2u);
  EXPECT_TRUE(variants[0]["fits"].get<bool>());   // pp 8: 52 GiB of 80
  EXPECT_GT(variants[0]["time_split"]["compute"].get<double>(), 0);  // each row's time split, as twin sim's
  EXPECT_FALSE(variants[1]["fits"].get<bool>());  // pp 2: 189 GiB
  EXPECT_THAT(r.output, HasSubstr("     189.1    NO "));
  const fs::path sim_json = scratch("fits-sim.json");
  ASSERT_EQ(twin("sim gpt3-175b --quiet --set parallel.pp=2 --json " + sim_json.string()).status, 0);
  EXPECT_FALSE(nlohmann::json::parse(std::ifstream(sim_json))["fits"].get<bool>());
}

// A platform of 800,000 hosts (100,000 nodes at rank fidelity) takes SimGrid seconds to build: twin sim says so before
// it starts (the test stops it after 3 s; the progress lines that follow every 10 s come from the same code as the
// replay's).
TEST(Cli, SimSaysUpFrontWhatAHugePlatformWillCost) {
  const std::string log = scratch("huge-platform.log").string();
  const std::string command =
      std::string(TWIN_BINARY) +
      " sim gpt3-175b --fidelity rank --set cluster.nodes=100000 --set parallel.global_batch=100000 > /dev/null 2> " +
      log +
      " & sleep 3; kill -9 $! 2> /dev/null; wait";
  ASSERT_EQ(std::system(("sh -c '" + command + "'").c_str()) != -1, true);
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("[twin sim] building the platform of 100000 nodes (800000 GPUs) in SimGrid: about "
                                    "17 s on a 2-core machine"));
}

// A trace's size is estimated before simulating: past 200 MB it needs --large-trace (MT-NLG's 1024 first ranks: about
// 1.5 GB, refused at once); a small one is written as before.
TEST(Cli, SimEstimatesATracesSizeFirst) {
  const fs::path trace = scratch("big-trace.json");
  const auto start = std::chrono::steady_clock::now();
  const Result big = twin("sim --quiet --trace " + trace.string() + " --trace-ranks 0-1023");
  EXPECT_EQ(big.status, 2) << big.output;
  EXPECT_THAT(big.output, HasSubstr("twin: error: --trace of ranks 0-1023 would be about 1.5 GB"));
  EXPECT_THAT(big.output, HasSubstr("add --large-trace to write it anyway"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_FALSE(fs::exists(trace));
  EXPECT_EQ(twin("sim gpt3-175b --quiet --trace " + trace.string() + " --trace-ranks 0-1").status, 0);
  EXPECT_TRUE(fs::exists(trace));
}

TEST(Cli, SweepShowsWhyAVariantIsRefused) {
  // 3 nodes with tp 2 x pp 2 give dp 6, over which 32 sequences do not split: that row says so, and the other
  // variant is simulated.
  const Result r = twin("sweep " + small_cluster_scenario().string() + " --vary cluster.nodes=2,3 --jobs 2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("invalid: "));
  EXPECT_THAT(r.output, HasSubstr("parallel.global_batch (32) must be divisible"));
  // Every variant refused: a mistake in what was typed, exit 2, each reason once.
  const Result none = twin("sweep " + small_cluster_scenario().string() + " --vary cluster.nodes=3,5");
  EXPECT_EQ(none.status, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("twin: error: "));
  // A value only the simulation can refuse (a GEMM rate above the GPU's peak): its row says why, and when every
  // variant is refused so, that is a mistake in what was typed too.
  const Result rates = twin("sweep " + small_cluster_scenario().string() + " --vary cluster.gemm_tflops=200,9999");
  ASSERT_EQ(rates.status, 0) << rates.output;
  EXPECT_THAT(rates.output, HasSubstr("failed: "));
  EXPECT_THAT(rates.output, HasSubstr("exceeds"));
  EXPECT_EQ(twin("sweep " + small_cluster_scenario().string() + " --vary cluster.gemm_tflops=8888,9999").status, 2);
}

TEST(Cli, SweepRefusesAMalformedVary) {
  const std::string scenario = small_cluster_scenario().string();
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--vary nodes=2,4", "KEY is section.key"},
      {"--vary cluster.nodes=", "an empty value"},
      {"--vary cluster.nodes=2,,4", "an empty value"},
      {"--vary cluster.nodes", "expected KEY=V1,V2"},
      {"--vary 'cluster.gemm_shape=[8192,8192'", "unclosed"},
      {"--vary cluster.nodes=2 --vary cluster.nodes=4", "gives cluster.nodes twice"},
      {"--vary cluster.nodes=2,4 --nodes 4", "both give cluster.nodes"},
      {"--vary model.no_such_key=1,2", "model.no_such_key: unknown key"},
  };
  for (const auto& [arguments, message] : cases) {
    const Result r = twin("sweep " + scenario + " " + arguments);
    EXPECT_EQ(r.status, 2) << arguments << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(message)) << arguments;
  }
  // Commas inside brackets belong to the value: two measured GEMM shapes are two variants.
  const Result shapes =
      twin("sweep " + scenario +
           " --set cluster.gemm_tflops=230 --vary 'cluster.gemm_shape=[8192,8192,8192],[4096,4096,4096]'");
  ASSERT_EQ(shapes.status, 0) << shapes.output;
  EXPECT_THAT(shapes.output, HasSubstr("[4096,4096,4096]"));
}

TEST(Cli, SearchVariesRecomputeBlockRecomputeIncluded) {
  // Every plan in every recompute mode: none, selective, full, and Megatron's block recompute of a quarter, half and
  // three quarters of a chunk's layers, which trade memory for time in between none and full.
  const fs::path json_path = scratch("search-recompute.json");
  // On one GPU (tp 1, pp 1: four micro-batch sizes), --all: every mode of each plan is simulated and shown (--max
  // shows the fastest plans, whose modes need not be complete).
  const Result r = twin("search " + small_cluster_scenario().string() +
                        " --set cluster.gpus_per_node=1 --set cluster.nodes=1 --set parallel.tp=1 --set parallel.pp=1"
                        " --all --jobs 2 --vary-recompute --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("block 12"));  // half of the 24 layers of a plan without a pipeline
  std::ifstream in(json_path);
  // plan -> recompute label -> (seconds, bytes)
  std::map<std::string, std::map<std::string, std::pair<double, double>>> plans;
  const auto listed = nlohmann::json::parse(in)["plans"];  // a copy: the parsed document is a temporary
  for (const auto& plan : listed) {
    const std::string key = plan["tp"].dump() + " " + plan["pp"].dump() + " " + plan["micro_batch"].dump() + " " +
                            plan["virtual_stages"].dump();
    const int block = plan["recompute_num_layers"].get<int>();
    const std::string label = block > 0 ? "block " + std::to_string(block) : plan["recompute"].get<std::string>();
    plans[key][label] = {plan["iteration_time_s"].get<double>(), plan["memory_per_gpu_bytes"].get<double>()};
  }
  int complete = 0;
  for (auto& [key, modes] : plans) {
    if (modes.size() < 6) continue;  // memory left some of its modes out
    ++complete;
    EXPECT_LT(modes["none"].first, modes["block 12"].first) << key;
    EXPECT_LT(modes["block 12"].first, modes["full"].first) << key;
    EXPECT_LT(modes["full"].second, modes["block 12"].second) << key;
    EXPECT_LT(modes["block 12"].second, modes["none"].second) << key;
  }
  EXPECT_GE(complete, 1) << r.output;
}

TEST(Cli, SimNamesTheFrameworkModelItFollowed) {
  const Result megatron = twin("sim " + small_cluster_scenario().string() + " --quiet");
  ASSERT_EQ(megatron.status, 0) << megatron.output;
  EXPECT_THAT(megatron.output, HasSubstr("framework: megatron (tp_comm_overlap = false, gradient_accumulation_fusion = "
                                         "false, pipeline_gather_copies = true)"));
  const Result deepspeed = twin("sim " + small_cluster_scenario().string() +
                                " --quiet --set framework.name=deepspeed --set parallel.zero_stage=1 "
                                "--set framework.bf16_optimizer=true");
  ASSERT_EQ(deepspeed.status, 0) << deepspeed.output;
  EXPECT_THAT(deepspeed.output, HasSubstr("framework: deepspeed, BF16_Optimizer of v0.6.2 on (bf16_optimizer = true)"));
  // A named release is the one reported (a bare version on the command line is a string, as the README shows).
  const Result released = twin("sim " + small_cluster_scenario().string() +
                               " --quiet --set framework.name=deepspeed --set framework.deepspeed_version=0.9.5");
  ASSERT_EQ(released.status, 0) << released.output;
  EXPECT_THAT(released.output, HasSubstr("framework: deepspeed, pipeline engine of v0.9.5 (bf16_optimizer = false)"));
}

TEST(Cli, SimReportsTheHostsShareWhenItPacesTheGpu) {
  // A small model at micro-batch 1 on one GPU: microsecond kernels, so a host at 100 us a kernel sets the pace.
  const fs::path scenario = scratch("gpt-small-one-gpu.toml");
  std::ofstream(scenario) << "[model]\nname = \"gpt-small\"\nlayers = 4\nhidden = 512\nheads = 8\nseq_len = 512\n"
                             "vocab = 1024\n[parallel]\nglobal_batch = 4\n[cluster]\nnodes = 1\ngpus_per_node = 1\n";
  const fs::path json_path = scratch("host-paced.json");
  const Result plain = twin("sim " + scenario.string() + " --quiet --set cluster.host_us_per_kernel=0");
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_THAT(plain.output, ::testing::Not(HasSubstr("host")));  // the lines as always when the host is never behind
  // Unset, the node's measured host (13.48 us a kernel on DGX A100's default) already paces these kernels.
  const Result measured = twin("sim " + scenario.string() + " --quiet");
  ASSERT_EQ(measured.status, 0) << measured.output;
  EXPECT_THAT(measured.output, HasSubstr("fill/drain %  host %"));
  const Result paced =
      twin("sim " + scenario.string() + " --quiet --set cluster.host_us_per_kernel=100 --json " + json_path.string());
  ASSERT_EQ(paced.status, 0) << paced.output;
  EXPECT_THAT(paced.output, HasSubstr("fill/drain %  host %"));
  std::ifstream in(json_path);
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_GT(summary["time_split"]["host"].get<double>(), 0.5);
  EXPECT_GT(summary["stages"][0]["time_split"]["host_s"].get<double>(), 0);
  const Result wrong = twin("sim " + scenario.string() + " --quiet --set cluster.host_us_per_kernel=-1");
  EXPECT_EQ(wrong.status, 2);
  EXPECT_THAT(wrong.output, HasSubstr("cluster.host_us_per_kernel must be the host's microseconds"));
}

TEST(Cli, SimTakesTheClustersOwnNetwork) {
  auto iteration_s = [](const std::string& sets, const std::string& name, std::string* text) {
    const fs::path json_path = scratch("network-" + name + ".json");
    const Result r =
        twin("sim " + small_cluster_scenario().string() + " --quiet " + sets + " --json " + json_path.string());
    EXPECT_EQ(r.status, 0) << r.output;
    if (text != nullptr) *text = r.output;
    std::ifstream in(json_path);
    return nlohmann::json::parse(in)["iteration_time_s"].get<double>();
  };
  std::string cloud_text;
  const double dgx = iteration_s("", "dgx", nullptr);
  const double cloud = iteration_s("--set cluster.nics_per_node=4 --set cluster.nic_gbps=100", "cloud", &cloud_text);
  EXPECT_THAT(cloud_text, HasSubstr("DGX A100 with 4 x 100 Gb/s NICs (A100-SXM4-80GB), fat-tree of 100 Gb/s links"));
  EXPECT_GT(cloud, dgx);  // its pipeline exchanges cross nodes on an eighth of the bandwidth
  const Result what_if = twin("sim " + small_cluster_scenario().string() +
                              " --quiet --set cluster.nics_per_node=4 --set cluster.nic_gbps=100 --gpu h100");
  EXPECT_EQ(what_if.status, 0) << what_if.output;
  EXPECT_THAT(what_if.output, HasSubstr("--gpu h100 uses the DGX H100's own NICs"));
}

TEST(Cli, SimTakesTheClustersOwnGpuMeasurements) {
  auto simulate = [](const std::string& sets, const std::string& name) {
    const fs::path json_path = scratch("summary-" + name + ".json");
    const Result r =
        twin("sim " + small_cluster_scenario().string() + " --quiet " + sets + " --json " + json_path.string());
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(json_path);
    return std::make_pair(r.output, nlohmann::json::parse(in));
  };
  const auto [cited_text, cited] = simulate("", "cited");
  EXPECT_THAT(cited_text, HasSubstr("GPU constants: GEMM 230.0 TFLOP/s at 8192x8192x8192 (cited), HBM 1616 GB/s "
                                    "(cited), attention GEMMs at 0.64 of it (cited)"));
  EXPECT_EQ(cited["gpu_constants"]["gemm_source"], "cited");
  EXPECT_NEAR(cited["gpu_constants"]["attention_gemm_hbm_fraction"].get<double>(), 0.64, 0.01);
  const auto [measured_text, measured] = simulate(
      "--set cluster.gemm_tflops=267.9 --set 'cluster.gemm_shape=[6912,16384,2048]' "
      "--set cluster.hbm_gb_per_s=1800 --set cluster.attention_gemm_hbm_fraction=0.7",
      "measured");
  EXPECT_THAT(measured_text, HasSubstr("GEMM 267.9 TFLOP/s at 6912x16384x2048 (cluster.gemm_tflops), HBM 1800 GB/s "
                                       "(cluster.hbm_gb_per_s), attention GEMMs at 0.70 of it "
                                       "(cluster.attention_gemm_hbm_fraction)"));
  EXPECT_THAT(measured_text, ::testing::Not(HasSubstr("your own: bench/gpu")));
  EXPECT_EQ(measured["gpu_constants"]["attention_source"], "cluster.attention_gemm_hbm_fraction");
  EXPECT_EQ(measured["gpu_constants"]["gemm_source"], "cluster.gemm_tflops");
  EXPECT_DOUBLE_EQ(measured["gpu_constants"]["hbm_gb_per_s"].get<double>(), 1800);
  EXPECT_LT(measured["iteration_time_s"].get<double>(), cited["iteration_time_s"].get<double>());
  // A --gpu what-if on another GPU does not carry the A100's measurements over.
  const auto [what_if_text, what_if] = simulate("--set cluster.gemm_tflops=267.9 --gpu h100", "what-if");
  EXPECT_THAT(what_if_text, HasSubstr("--gpu h100 uses the cited H100-SXM5-80GB values"));
  EXPECT_EQ(what_if["gpu_constants"]["gemm_source"], "cited");
  // A rate the GPU cannot reach is a user error naming the field.
  const Result beyond = twin("sim " + small_cluster_scenario().string() + " --quiet --set cluster.gemm_tflops=400");
  EXPECT_EQ(beyond.status, 2);
  EXPECT_THAT(beyond.output, HasSubstr("cluster.gemm_tflops = 400 exceeds the A100-SXM4-80GB's 16-bit tensor-core "
                                       "peak of 312 TFLOP/s"));
  // twin search refuses it once, before simulating any plan.
  const Result search =
      twin("search " + small_cluster_scenario().string() + " --max 2 --set cluster.hbm_gb_per_s=9999");
  EXPECT_EQ(search.status, 2);
  EXPECT_THAT(search.output, HasSubstr("cluster.hbm_gb_per_s = 9999 exceeds the A100-SXM4-80GB's datasheet HBM"));
  EXPECT_THAT(search.output, ::testing::Not(HasSubstr("simulated")));
}

TEST(Cli, SimRunsOnEveryDgxNodeKind) {
  // A100 40GB: same tensor cores, slower HBM, half the memory; H200: H100's tensor cores, faster HBM.
  auto simulate = [](const std::string& node) {
    const fs::path json_path = scratch("summary-" + node + ".json");
    const Result r = twin("sim " + small_cluster_scenario().string() + " --quiet --set cluster.node=" + node +
                          " --json " + json_path.string());
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(json_path);
    return nlohmann::json::parse(in);
  };
  const auto a100 = simulate("dgx-a100"), a100_40gb = simulate("dgx-a100-40gb");
  const auto h100 = simulate("dgx-h100"), h200 = simulate("dgx-h200");
  EXPECT_THAT(a100_40gb["hardware"].get<std::string>(), HasSubstr("A100-SXM4-40GB"));
  EXPECT_DOUBLE_EQ(a100_40gb["memory"]["capacity_bytes"].get<double>(),
                   a100["memory"]["capacity_bytes"].get<double>() / 2);
  EXPECT_GT(a100_40gb["iteration_time_s"].get<double>(), a100["iteration_time_s"].get<double>());
  EXPECT_THAT(h200["hardware"].get<std::string>(), HasSubstr("H200"));
  EXPECT_LT(h200["iteration_time_s"].get<double>(), h100["iteration_time_s"].get<double>());
  EXPECT_LT(h100["iteration_time_s"].get<double>(), a100["iteration_time_s"].get<double>());
}
TEST(Cli, SearchVariesExpertParallelismForMoe) {
  // A Mixture-of-Experts model: ep is part of every plan (each a divisor of the experts that divides tp x dp), so
  // plans that differ only in ep are ranked side by side; --vary-etp adds expert tensor parallelism.
  const std::string moe = small_cluster_scenario().string() +
                          " --set model.experts=8 --set model.top_k=2 --set model.moe_ffn_hidden=2048 --jobs 2";
  const fs::path json_path = scratch("search-moe.json");
  const Result r = twin("search " + moe + " --max 6 --json " + json_path.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("   ep  etp "));
  std::ifstream in(json_path);
  const auto plans = nlohmann::json::parse(in)["plans"];
  std::set<int> eps;
  for (const auto& plan : plans) {
    ASSERT_EQ(plan["error"], "") << plan.dump();
    const int ep = plan["ep"].get<int>(), etp = plan["etp"].get<int>();
    EXPECT_EQ(8 % ep, 0) << plan.dump();
    EXPECT_EQ(plan["tp"].get<int>() * plan["dp"].get<int>() % (ep * etp), 0) << plan.dump();
    EXPECT_EQ(etp, 1);
    eps.insert(ep);
  }
  EXPECT_GE(eps.size(), 2u) << r.output;  // the 6 fastest plans hold several ep
  const fs::path etp_path = scratch("search-moe-etp.json");
  const Result with_etp = twin("search " + moe + " --vary-etp --max 12 --json " + etp_path.string());
  ASSERT_EQ(with_etp.status, 0) << with_etp.output;
  std::ifstream etp_in(etp_path);
  const auto etp_plans = nlohmann::json::parse(etp_in)["plans"];
  int split_experts = 0;
  for (const auto& plan : etp_plans) split_experts += plan["etp"].get<int>() > 1;
  EXPECT_GT(split_experts, 0);
  // A dense model's table has no expert columns.
  EXPECT_THAT(twin("search " + small_cluster_scenario().string() + " --max 1 --jobs 1").output,
              ::testing::Not(HasSubstr(" etp ")));
}
// --fidelity replica: one pipeline replica replayed (GPT-3 175B on 1,024 GPUs, DP 16: 8 actors of replica 0, not
// 128), the header and the JSON name it, the iteration within 0.5 % of group fidelity's (the guard's bound on every
// published run); with a slow GPU, which makes one replica unlike the others, it is refused by name.
TEST(Cli, SimFidelityReplicaReplaysOneReplica) {
  const auto run = [](const std::string& fidelity) {
    const fs::path json_path = scratch("fidelity-" + fidelity + ".json");
    const Result r = twin("sim gpt3-175b --quiet --fidelity " + fidelity + " --json " + json_path.string());
    EXPECT_EQ(r.status, 0) << r.output;
    std::ifstream in(json_path);
    return std::make_pair(r.output, nlohmann::json::parse(in));
  };
  const auto [replica_text, replica] = run("replica");
  const auto [group_text, group] = run("group");
  EXPECT_THAT(replica_text, HasSubstr("[sim, replica fidelity,"));
  EXPECT_THAT(replica_text, HasSubstr("simulated by 8 actors"));
  EXPECT_THAT(group_text, HasSubstr("simulated by 128 actors"));
  EXPECT_EQ(replica["fidelity"], "replica");
  const double t_group = group["iteration_time_s"].get<double>();
  EXPECT_NEAR(replica["iteration_time_s"].get<double>(), t_group, 0.005 * t_group);
  const Result slow = twin("sim gpt3-175b --quiet --fidelity replica --slow-gpu 9:2");
  EXPECT_EQ(slow.status, 2);
  EXPECT_THAT(slow.output, HasSubstr("twin: error: --fidelity replica: --slow-gpu"));
}

#endif

}  // namespace
