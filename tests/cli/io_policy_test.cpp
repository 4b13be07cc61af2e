// The input and output policies of every command (README "Reliability"), as a careless script meets them: a FIFO, a
// device or an oversized file as an input is refused at once by name; an output is never one of the inputs (through
// links and hard links too); every output is checked before the work; a FIFO as an output gets the whole report; a
// full disk is exit 1; a checkpoint folder follows no link out of itself, and a fresh start does not hide under an
// older run's newer checkpoints. Every command runs under `timeout`, so that a regression hangs no test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Result : twin::testing::ShellResult {  // status 124: the command hung and `timeout` ended it
  double seconds = 0;
};

Result twin(const std::string& arguments, int timeout_s = 30) {
  const auto start = std::chrono::steady_clock::now();
  Result result{twin::testing::run_shell("timeout -s KILL " + std::to_string(timeout_s) + " " +
                                         std::string(TWIN_BINARY) + " " + arguments + " 2>&1")};
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("twin-io-policy-test-" + std::to_string(getpid()));
}

fs::path scratch(const std::string& name) {
  fs::create_directories(scratch_dir());
  return scratch_dir() / name;
}

struct RemoveScratch : ::testing::Environment {
  void TearDown() override { fs::remove_all(scratch_dir()); }
};
const auto* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

std::string contents(const fs::path& path) {
  std::stringstream text;
  text << std::ifstream(path, std::ios::binary).rdbuf();
  return text.str();
}

fs::path fifo(const std::string& name) {
  const fs::path path = scratch(name);
  fs::remove(path);
  EXPECT_EQ(::mkfifo(path.c_str(), 0644), 0);
  return path;
}

// Exit 2 with one `twin: error:` line that says what `path` is, long before the timeout.
void expect_refused(const Result& r, const std::string& what) {
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output.rfind("twin: error: ", 0), 0u) << r.output;
  EXPECT_THAT(r.output, HasSubstr(what));
}

fs::path summary_json() {
  const fs::path path = scratch("summary.json");
  std::ofstream(path) << R"({"scenario": {"tp": 1, "pp": 1, "dp": 1, "micro_batches": 1}, "engine": "sim",
    "iteration_time_s": 50.0, "tflops_per_gpu": 120.0, "bubble_fraction": 0.1, "stages": []})";
  return path;
}

TEST(CliInputPolicy, FifosDevicesAndDirectoriesAreRefusedAtOnceByName) {
  const std::string pipe = fifo("input.fifo").string();
  const std::string summary = summary_json().string();
  const std::string is_fifo = "'" + pipe + "' is a named pipe (FIFO), not a regular file";
  expect_refused(twin("compare " + pipe + " 60"), is_fifo);
  expect_refused(twin("compare " + summary + " " + pipe), is_fifo);
  expect_refused(twin("calibrate " + pipe), is_fifo);
  expect_refused(twin("calibrate /dev/zero --out " + scratch("p.toml").string()),
                 "'/dev/zero' is a character device, not a regular file");
  expect_refused(twin("graph " + pipe), "scenario '" + pipe + "' is not a regular file");
#ifdef TWIN_HAVE_SIMGRID
  expect_refused(twin("sim gpt-tiny --quiet --profile " + pipe), "--profile " + is_fifo);
  expect_refused(twin("sim gpt-tiny --quiet --profile /dev/zero"),
                 "--profile '/dev/zero' is a character device, not a regular file");
  expect_refused(twin("sim gpt-tiny --quiet --profile " + scratch_dir().string()),
                 "--profile: File is actually a directory");
#endif
}

TEST(CliInputPolicy, AnInputOverItsKindsSizeCapIsRefused) {
  // A scenario of 5 MiB (a comment): over the 4 MiB cap that no scenario comes near.
  const fs::path big = scratch("big.toml");
  {
    std::ofstream out(big);
    out << "# " << std::string(5 << 20, 'x') << "\n";
  }
  expect_refused(twin("graph " + big.string()), "more than the 4 MiB a file of this kind may have");
}

TEST(CliOutputPolicy, AnOutputIsNeverOneOfTheInputsNotEvenThroughALink) {
  const fs::path scenario = scratch("tiny.toml");
  fs::copy_file(fs::path(TWIN_SOURCE_DIR) / "scenarios" / "gpt-tiny.toml", scenario,
                fs::copy_options::overwrite_existing);
  const std::string before = contents(scenario);
  const fs::path soft = scratch("soft.toml"), hard = scratch("hard.toml");
  fs::remove(soft);
  fs::remove(hard);
  fs::create_symlink(scenario, soft);
  fs::create_hard_link(scenario, hard);
  for (const fs::path& output : {scenario, soft, hard}) {
    expect_refused(twin("graph " + scenario.string() + " --json " + output.string()),
                   "is the same file as the scenario '" + scenario.string() + "'");
  }
  EXPECT_EQ(contents(scenario), before);
  // calibrate's trace and its --out, checked before the trace is read.
  const fs::path trace = scratch("trace.json");
  std::ofstream(trace) << "not read";
  expect_refused(twin("calibrate " + trace.string() + " --out " + trace.string()), "is the same file as the trace");
  EXPECT_EQ(contents(trace), "not read");
  // compare's --json onto the measurement.
  const fs::path summary = summary_json();
  const std::string summary_before = contents(summary);
  expect_refused(twin("compare " + summary.string() + " " + summary.string() + " --json " + summary.string()),
                 "is the same file as the prediction");
  EXPECT_EQ(contents(summary), summary_before);
#ifdef TWIN_HAVE_RUN_COMMAND
  const fs::path corpus = scratch("corpus.txt");
  std::ofstream(corpus) << std::string(4096, 'a');
  expect_refused(twin("run gpt-tiny --steps 1 --quiet --data " + corpus.string() + " --json " + corpus.string()),
                 "--json '" + corpus.string() + "' is the same file as --data");
  EXPECT_EQ(contents(corpus), std::string(4096, 'a'));
#endif
}

// Every command checks its outputs before its work, as twin run does: an unwritable --json stops it at once.
TEST(CliOutputPolicy, EveryCommandChecksItsOutputsBeforeItsWork) {
  const std::string summary = summary_json().string();
  const std::string unwritable = "/proc/twin-io-policy-test.json";
  const std::string message = "'" + unwritable + "': cannot write in '/proc'";
  expect_refused(twin("graph gpt-tiny --json " + unwritable), "--json " + message);
  expect_refused(twin("compare " + summary + " 40 --json " + unwritable), "--json " + message);
  expect_refused(twin("calibrate " + summary + " --out " + unwritable), "--out " + message);
#ifdef TWIN_HAVE_SIMGRID
  // Each would simulate for minutes before writing.
  for (const std::string command : {"sim mtnlg-530b --fidelity rank --quiet", "sweep gpt3-175b --vary parallel.pp=8,16",
                                    "search gpt3-175b --quiet"}) {
    const Result r = twin(command + " --json " + unwritable);
    expect_refused(r, "--json " + message);
    EXPECT_LT(r.seconds, 20.0) << command;
  }
#endif
}

// A FIFO as an output is written once, whole: the check before the work does not open it (which would give its reader
// an end of file, and leave the real write waiting for a reader that is gone).
TEST(CliOutputPolicy, AFifoOutputGetsTheWholeReport) {
  const fs::path pipe = fifo("output.fifo");
  const fs::path copy = scratch("from-fifo.json");
#ifdef TWIN_HAVE_RUN_COMMAND
  const std::string command = "run gpt-tiny --steps 1 --quiet";  // the command whose check opened the FIFO
#else
  const std::string command = "graph gpt-tiny";
#endif
  {
    fs::remove(copy);
    std::unique_ptr<FILE, int (*)(FILE*)> reader(
        popen(("timeout -s KILL 60 cat " + pipe.string() + " > " + copy.string()).c_str(), "w"), pclose);
    const Result r = twin(command + " --json " + pipe.string());
    const int reader_status = pclose(reader.release());
    EXPECT_EQ(r.status, 0) << command << ": " << r.output;
    EXPECT_EQ(WEXITSTATUS(reader_status), 0) << command;
    const std::string json = contents(copy);
    ASSERT_GT(json.size(), 100u) << command;
    EXPECT_EQ(json.back(), '\n') << command;  // the whole document, to its last line
  }
}

// README: a full disk is a failure (exit 1), not the user's mistake (2).
TEST(CliOutputPolicy, AFullDiskIsExitOne) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "skipped: no /dev/full on this system";
  const Result r = twin("graph gpt-tiny --json /dev/full");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("twin: error: writing '/dev/full' failed: No space left on device"));
}

#ifdef TWIN_HAVE_RUN_COMMAND
// The checkpoint folder follows no link out of itself: neither a lock file nor a step folder that is a link; the
// files they point at are left as they were.
TEST(CliCheckpointFolder, FollowsNoLinkOutOfItself) {
  const fs::path outside = scratch("outside");
  fs::create_directories(outside / "step-00000001");
  std::ofstream(outside / "precious.txt") << "precious";
  std::ofstream(outside / "step-00000001" / "manifest.json") << "{}";
  std::ofstream(outside / "step-00000001" / "rank-00000.bin") << "shard";
  const fs::path locked = scratch("lock-link");
  fs::create_directories(locked);
  fs::create_symlink(outside / "precious.txt", locked / "twin.lock");
  expect_refused(twin("run gpt-tiny --steps 1 --quiet --checkpoint " + locked.string()),
                 "'" + (locked / "twin.lock").string() + "' is a symbolic link");
  EXPECT_EQ(contents(outside / "precious.txt"), "precious");
  const fs::path stepped = scratch("step-link");
  fs::create_directories(stepped);
  fs::create_symlink(outside / "step-00000001", stepped / "step-00000001");
  expect_refused(twin("run gpt-tiny --steps 2 --checkpoint-every 1 --keep-checkpoints 1 --no-resume --quiet "
                      "--checkpoint " +
                      stepped.string()),
                 "'" + (stepped / "step-00000001").string() + "' is a symbolic link");
  // Compared without printing: a shard written through the link would fill the log.
  EXPECT_TRUE(contents(outside / "step-00000001" / "manifest.json") == "{}") << "the outside manifest was replaced";
  EXPECT_TRUE(contents(outside / "step-00000001" / "rank-00000.bin") == "shard") << "the outside shard was replaced";
}

TEST(CliCheckpointFolder, AFreshStartUnderANewerRunsCheckpointsIsRefused) {
  const fs::path dir = scratch("newer");
  for (const char* step : {"step-00000005", "step-00000010"}) {
    fs::create_directories(dir / step);
    std::ofstream(dir / step / "manifest.json") << "{}";
  }
  expect_refused(twin("run gpt-tiny --steps 3 --no-resume --quiet --checkpoint " + dir.string()),
                 "holds a checkpoint of step 10");
  EXPECT_TRUE(fs::exists(dir / "step-00000010" / "manifest.json"));
  EXPECT_FALSE(fs::exists(dir / "step-00000003"));
}
#endif

}  // namespace

namespace {

// Sizes past every bound are refused naming their key, before anything grows with them (each of these once reached
// gigabytes or hours).
TEST(CliSizeGuards, SizesPastTheirBoundsAreRefusedByKey) {
  expect_refused(twin("graph gpt-tiny --set model.experts=1000000000"),
                 "model.experts = 1000000000 is past twin's bound of 16384 experts");
  expect_refused(twin("graph gpt-tiny --set cluster.nodes=1000000000 --set cluster.gpus_per_node=8"),
                 "is past 2147483647 GPUs, the most ranks a job can number");
#ifdef TWIN_HAVE_SIMGRID
  // 100,000,000 nodes: about 3.5 TB of platform at a host per GPU, past any machine these tests run on.
  const Result huge =
      twin("sim gpt3-175b --quiet --set cluster.nodes=100000000 --set parallel.global_batch=100000000");
  expect_refused(huge, "cluster.nodes = 100000000: its platform in SimGrid would take about 3490 GB of memory");
  EXPECT_LT(huge.seconds, 10.0);
#endif
}

#ifdef TWIN_HAVE_CHAKRA_OUTPUT
// --chakra's size is estimated before writing: traces past the disk's free space are refused (GPT-3 175B on 250,000
// nodes: about 11 TB), nothing written.
TEST(CliSizeGuards, ChakraTracesPastTheFreeDiskAreRefused) {
  const fs::path dir = scratch("chakra");
  const double estimate_bytes = 10e12;  // below the estimate, so that the skip below is on the safe side
  if (static_cast<double>(fs::space(scratch_dir()).available) > estimate_bytes) {
    GTEST_SKIP() << "skipped: the scratch disk has more than 10 TB free, the traces would be written";
  }
  expect_refused(twin("graph gpt3-175b --set cluster.nodes=250000 --set parallel.global_batch=250000 --chakra " +
                      dir.string()),
                 "--chakra '" + dir.string() + "': the traces of 2000000 ranks would take about");
  EXPECT_FALSE(fs::exists(dir / "twin.0.et"));
}
#endif

#ifdef TWIN_HAVE_SIMGRID
// twin search says what its platforms cost before simulating them (400,000 nodes: about a minute each on 2 cores at a
// host per GPU). The search runs in its own process group, killed with its children once the line is out.
TEST(CliSizeGuards, SearchEstimatesItsPlatformsFirst) {
  if (std::system("command -v setsid > /dev/null 2>&1") != 0) GTEST_SKIP() << "skipped: no setsid (util-linux)";
  const fs::path log = scratch("search-estimate.log");
  const std::string command =
      "setsid " + std::string(TWIN_BINARY) +
      " search gpt3-175b --set cluster.nodes=400000 --set parallel.global_batch=3200000 --max 2 --jobs 1"
      " > /dev/null 2> " +
      log.string() +
      " & pid=$!; for i in $(seq 200); do grep -q \"building the platforms\" " + log.string() +
      " && break; sleep 0.05; done; kill -9 -$pid 2> /dev/null; kill -9 $pid 2> /dev/null; wait";
  ASSERT_NE(std::system(command.c_str()), -1);
  EXPECT_THAT(contents(log), HasSubstr("twin search: building the platforms alone takes up to about 2 min (2 plans on "
                                       "400000 nodes, 1 at a time"));
}

// A GPU profile's rates and shapes are bounded as the scenario's measurement keys are: within the GPU's datasheet and
// not under 5 % of it; its latencies within a second; a profile measuring nothing is refused.
TEST(CliInputPolicy, AProfilesRatesAndShapesAreBoundedByTheDatasheet) {
  const std::pair<const char*, const char*> cases[] = {
      {"[attention]\nflops_per_s = 1\n", "attention.flops_per_s = 1 is under 5 % of the A100-SXM4-80GB's"},
      {"[attention]\nflops_per_s = 1e30\n", "attention.flops_per_s = 1e+30 exceeds the A100-SXM4-80GB's"},
      {"[memory]\nbytes_per_s = 1e30\n", "memory.bytes_per_s = 1e+30 exceeds the A100-SXM4-80GB's HBM bytes/s"},
      {"[[gemm.shape]]\nm = 1e30\nn = 8192.0\nk = 8192.0\nflops_per_s = 2.5e14\n",
       "gemm.shape[0].m = 1e+30 is past 2147483647, the largest GEMM dimension cuBLAS takes"},
      {"[[gemm.shape]]\nm = 8192.0\nn = 8192.0\nk = 8192.0\nflops_per_s = 1e12\n",
       "gemm.shape flops_per_s = 1e+12 is under 5 %"},
      {"[[collective]]\nkind = \"all_reduce\"\nranks = 8\nnodes = 1\nlatency_s = 1e30\nbus_bytes_per_s = 2e11\n",
       "collective[0].latency_s must be a latency in seconds, from 0 to 1"},
      {"[profile]\ndevice = \"NVIDIA A100-SXM4-80GB\"\n", "the profile measures nothing"},
  };
  int n = 0;
  for (const auto& [text, message] : cases) {
    const fs::path profile = scratch("profile-" + std::to_string(n++) + ".toml");
    std::ofstream(profile) << text;
    expect_refused(twin("sim gpt3-175b --quiet --profile " + profile.string()), message);
  }
}

// A fabric two generations past the node's NICs is refused by name.
TEST(CliInputPolicy, AFabricTwoGenerationsPastTheNicsIsRefused) {
  expect_refused(twin("sim gpt3-175b --quiet --set cluster.fabric='\"infiniband-xdr\"'"),
                 "cluster.fabric = \"infiniband-xdr\" on dgx-a100: its 800 Gb/s links are 4 times the node's 200 Gb/s "
                 "NICs");
}
#endif

}  // namespace
