// Training speed of the executor on one rank (CPU backend), next to what this machine's cblas_sgemm can do.
//
//   twin_exec_bench [--layers 12] [--hidden 512] [--heads 8] [--seq 256] [--batch 8] [--steps 3] [--threads 0]
//                   [--json FILE]
//
// 1. cblas_sgemm GFLOP/s at the model's GEMM shapes (tokens x 3C x C, tokens x C x C, tokens x 4C x C, C x 4C x
//    tokens for a weight gradient), best of a few runs: the ceiling a GPT step can approach on this CPU.
// 2. A training step of the model (GPT-2 style, byte vocabulary, fp32, AdamW) on the shipped corpus: one warm-up step,
//    then --steps timed steps. Achieved GFLOP/s counts Narayanan's model FLOPs without recompute (the 72 form: what
//    MFU uses) over the measured time; the ratio to sgemm is the fraction of the GEMM ceiling the whole step reaches.
// 3. Where the traced step's time went, by op kind.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "exec/train/data.hpp"
#include "exec/train/trainer.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"

#ifdef TWIN_HAVE_BLAS
#include <cblas.h>
#endif
#include "kernels/cpu/matmul.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int layers = 12, hidden = 512, heads = 8, seq = 256, batch = 8, steps = 3, threads = 0;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--layers")
      a.layers = std::atoi(value);
    else if (key == "--hidden")
      a.hidden = std::atoi(value);
    else if (key == "--heads")
      a.heads = std::atoi(value);
    else if (key == "--seq")
      a.seq = std::atoi(value);
    else if (key == "--batch")
      a.batch = std::atoi(value);
    else if (key == "--steps")
      a.steps = std::atoi(value);
    else if (key == "--threads")
      a.threads = std::atoi(value);
    else if (key == "--json")
      a.json = value;
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  return a;
}

// GFLOP/s of C (M, N) = A (M, K) @ B^T, B stored (N, K): the layout of matmul_forward.
double sgemm_gflops(int m, int n, int k) {
  std::vector<float> a(static_cast<std::size_t>(m) * k, 0.5f), b(static_cast<std::size_t>(n) * k, 0.25f);
  std::vector<float> c(static_cast<std::size_t>(m) * n);
  double best = 1e30;
  for (int repeat = 0; repeat < 5; ++repeat) {
    const auto start = Clock::now();
#ifdef TWIN_HAVE_BLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
#else
    twin::kernels::cpu::matmul_forward(c.data(), a.data(), b.data(), nullptr, m, k, n);
#endif
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return 2.0 * m * n * k / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace twin;
  const Args args = parse(argc, argv);
  const std::string toml = fmt::format(R"(
[model]
name = "bench-{0}x{1}"
layers = {0}
hidden = {1}
heads = {2}
seq_len = {3}
vocab = 256
dtype = "fp32"
[parallel]
micro_batch = {4}
global_batch = {4}
[cluster]
node = "cpu-host"
[training]
learning_rate = 3e-4
)",
                                       args.layers, args.hidden, args.heads, args.seq, args.batch);
  const model::Scenario scenario = model::parse_scenario(toml, "bench");
  const int threads = args.threads > 0 ? args.threads : exec::default_threads_per_rank(1);
  twin::kernels::cpu::set_blas_threads(threads);

  // 1. the GEMM ceiling
  const int tokens = args.batch * args.seq, C = args.hidden;
  struct Shape {
    const char* name;
    int m, n, k;
  };
  const Shape shapes[] = {{"qkv      (T, 3C, C)", tokens, 3 * C, C},
                          {"proj     (T, C, C)", tokens, C, C},
                          {"mlp up   (T, 4C, C)", tokens, 4 * C, C},
                          {"mlp down (T, C, 4C)", tokens, C, 4 * C}};
  double sgemm_best = 0;
  std::printf("cblas_sgemm on %d thread%s:\n", threads, threads > 1 ? "s" : "");
  for (const Shape& s : shapes) {
    const double gflops = sgemm_gflops(s.m, s.n, s.k);
    sgemm_best = std::max(sgemm_best, gflops);
    std::printf("  %-22s M=%-5d N=%-5d K=%-5d %7.1f GFLOP/s\n", s.name, s.m, s.n, s.k, gflops);
  }

  // 2. training steps
  const model::Program program = model::build_program(scenario, model::Granularity::Op);
  const exec::TextDataset data = exec::load_text(std::string(TWIN_SOURCE_DIR) + "/data/corpus.txt", 1024);
  exec::TrainOptions options;
  options.steps = args.steps + 1;  // the first one warms up (page faults, BLAS buffers) and is not counted
  options.threads_per_rank = threads;
  options.trace_step = args.steps;  // the last
  const exec::TrainResult result = exec::train_threads(program, data, options);
  double seconds = 0;
  for (std::size_t i = 1; i < result.iteration_time_s.size(); ++i) seconds += result.iteration_time_s[i];
  seconds /= args.steps;
  const double model_flops = model::model_flops_per_iteration(scenario, false);
  const double program_flops = program.total_flops();
  const double achieved = model_flops / seconds / 1e9;
  const double tokens_per_s = static_cast<double>(tokens) / seconds;
  std::printf("\nmodel: %d layers, hidden %d, %d heads, seq %d, batch %d (%.1f M parameters), %d thread%s\n",
              args.layers, args.hidden, args.heads, args.seq, args.batch, model::count_parameters(scenario).total / 1e6,
              threads, threads > 1 ? "s" : "");
  std::printf("  step             %.3f s  (%.0f tokens/s)\n", seconds, tokens_per_s);
  std::printf("  model FLOPs      %.1f GFLOP per step (72 B s l h^2 form), %.1f GFLOP in the Program's GEMMs\n",
              model_flops / 1e9, program_flops / 1e9);
  std::printf("  achieved         %.1f GFLOP/s  = %.0f%% of the best sgemm (%.1f GFLOP/s)\n", achieved,
              100 * achieved / sgemm_best, sgemm_best);
  std::printf("  losses           %.4f -> %.4f\n", result.losses.front(), result.losses.back());

  // 3. where the time went
  std::map<std::string, double> by_kind;
  double traced = 0;
  if (result.timeline) {
    const auto& ops = program.stage_ops[0];
    for (const auto& span : result.timeline->ranks[0].spans) {
      const model::Op& op = ops[static_cast<std::size_t>(span.op)];
      std::string name = op.kind == model::OpKind::Compute
                             ? fmt::format("{} {}", model::to_string(op.phase), model::to_string(op.what))
                             : std::string(model::to_string(op.kind));
      by_kind[name] += span.end_s - span.start_s;
      traced += span.end_s - span.start_s;
    }
    std::vector<std::pair<double, std::string>> sorted;
    for (const auto& [name, t] : by_kind) sorted.emplace_back(t, name);
    std::sort(sorted.rbegin(), sorted.rend());
    std::printf("\ntime by op kind (traced step, %.3f s in ops):\n", traced);
    for (const auto& [t, name] : sorted) {
      if (t / traced < 0.005) continue;
      std::printf("  %-34s %6.3f s  %5.1f%%\n", name.c_str(), t, 100 * t / traced);
    }
  }

  if (!args.json.empty()) {
    nlohmann::json json = {{"layers", args.layers},
                           {"hidden", args.hidden},
                           {"heads", args.heads},
                           {"seq", args.seq},
                           {"batch", args.batch},
                           {"threads", threads},
                           {"step_s", seconds},
                           {"tokens_per_s", tokens_per_s},
                           {"model_gflop_per_step", model_flops / 1e9},
                           {"achieved_gflops", achieved},
                           {"sgemm_gflops", sgemm_best},
                           {"ratio_to_sgemm", achieved / sgemm_best}};
    for (const auto& [name, t] : by_kind) json["time_by_op_s"][name] = t;
    std::ofstream(args.json) << json.dump(2) << "\n";
  }
  return 0;
}
