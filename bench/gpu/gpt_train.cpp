// twin_gpt_train: trains the GPT of gpt.hpp on one device, on the CPU twins or the CUDA kernels, and prints one line
// per step and a summary (tokens/s, model TFLOP/s, MFU against a given peak). bench/gpu_check.sh runs it twice on the
// tiny model (cpu, cuda) to compare the loss curves, and once on a ~1B model to time the CUDA kernels.
//
//   twin_gpt_train --backend cuda --layers 20 --channels 2048 --heads 16 --seq 2048 --vocab 50257 --batch 8
//                  --steps 12 --timing-warmup 2 --peak-tflops 780
//   twin_gpt_train --backend cpu --data corpus.txt --steps 300 --losses cpu_losses.txt
//
// Data: --data FILE trains on the file's bytes (vocab 256); without it, tokens are uniform random (timing only).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/gpu/gpt.hpp"
#include "bench/gpu/ops_cpu.hpp"
#include "bench/gpu/ops_cuda.hpp"

namespace twin::bench {
namespace {

struct Options {
  std::string backend = "cuda";
  GptConfig model;
  int steps = 20;
  int timing_warmup = 2;  // steps left out of the timing
  float learning_rate = 3e-3f, min_learning_rate = 3e-4f, weight_decay = 0.1f, grad_clip = 1.0f;
  int warmup_steps = 20;
  std::uint64_t seed = 1234;
  std::string data, losses_file;
  double peak_tflops = 0.0;  // measured bf16 GEMM peak, for the MFU; 0: not reported
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "twin_gpt_train: %s\n"
               "usage: twin_gpt_train [--backend cpu|cuda] [--layers L] [--channels C] [--heads H] [--seq T]\n"
               "  [--vocab V] [--batch B] [--steps N] [--timing-warmup K] [--lr X] [--min-lr X] [--warmup N]\n"
               "  [--weight-decay X] [--clip X] [--seed S] [--data FILE] [--losses FILE] [--peak-tflops X]\n",
               problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string value = argv[++i];
    auto integer = [&] { return std::stoi(value); };
    auto real = [&] { return std::stof(value); };
    if (flag == "--backend")
      o.backend = value;
    else if (flag == "--layers")
      o.model.layers = integer();
    else if (flag == "--channels")
      o.model.channels = integer();
    else if (flag == "--heads")
      o.model.heads = integer();
    else if (flag == "--seq")
      o.model.seq = integer();
    else if (flag == "--vocab")
      o.model.vocab = integer();
    else if (flag == "--batch")
      o.model.batch = integer();
    else if (flag == "--steps")
      o.steps = integer();
    else if (flag == "--timing-warmup")
      o.timing_warmup = integer();
    else if (flag == "--lr")
      o.learning_rate = real();
    else if (flag == "--min-lr")
      o.min_learning_rate = real();
    else if (flag == "--warmup")
      o.warmup_steps = integer();
    else if (flag == "--weight-decay")
      o.weight_decay = real();
    else if (flag == "--clip")
      o.grad_clip = real();
    else if (flag == "--seed")
      o.seed = std::stoull(value);
    else if (flag == "--data")
      o.data = value;
    else if (flag == "--losses")
      o.losses_file = value;
    else if (flag == "--peak-tflops")
      o.peak_tflops = std::stod(value);
    else
      usage("unknown flag " + flag);
  }
  if (o.backend != "cpu" && o.backend != "cuda") usage("--backend is cpu or cuda");
  if (o.steps < 1 || o.timing_warmup < 0 || o.timing_warmup >= o.steps) usage("need 0 <= --timing-warmup < --steps");
  if (!o.data.empty() && o.model.vocab < 256) usage("--data trains on bytes: --vocab must be >= 256");
  return o;
}

// linear warmup to lr, then cosine decay to min_lr at the last step
float learning_rate_at(const Options& o, int step) {
  if (step <= o.warmup_steps) return o.learning_rate * static_cast<float>(step) / static_cast<float>(o.warmup_steps);
  const double progress = static_cast<double>(step - o.warmup_steps) / std::max(1, o.steps - o.warmup_steps);
  return static_cast<float>(o.min_learning_rate + 0.5 * (o.learning_rate - o.min_learning_rate) *
                                                      (1.0 + std::cos(3.141592653589793 * progress)));
}

// The step's inputs and targets (batch, seq): consecutive windows of the text, or random tokens.
class Batches {
 public:
  explicit Batches(const Options& o) : o_(o) {
    if (o.data.empty()) return;
    std::ifstream file(o.data, std::ios::binary);
    if (!file) throw std::runtime_error("cannot read --data " + o.data);
    const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (text.size() < static_cast<std::size_t>(o.model.seq) + 2) throw std::runtime_error("--data is too short");
    for (unsigned char byte : text) text_.push_back(byte);
  }
  void get(int step, std::vector<int>& inputs, std::vector<int>& targets) const {
    const int B = o_.model.batch, T = o_.model.seq;
    inputs.resize(static_cast<std::size_t>(B) * T);
    targets.resize(inputs.size());
    if (text_.empty()) {
      std::mt19937 generator(static_cast<unsigned>(o_.seed) + 7919u * static_cast<unsigned>(step));
      std::uniform_int_distribution<int> token(0, o_.model.vocab - 1);
      for (int& t : inputs) t = token(generator);
      for (int& t : targets) t = token(generator);
      return;
    }
    const std::size_t windows = text_.size() - T - 1;
    for (int b = 0; b < B; ++b) {
      const std::size_t start = ((static_cast<std::size_t>(step) * B + b) * T) % windows;
      for (int t = 0; t < T; ++t) {
        inputs[static_cast<std::size_t>(b) * T + t] = text_[start + t];
        targets[static_cast<std::size_t>(b) * T + t] = text_[start + t + 1];
      }
    }
  }

 private:
  const Options& o_;
  std::vector<int> text_;
};

template <class Ops>
int train(const Options& o) {
  Ops ops;
  Gpt<Ops> model(ops, o.model, o.seed);
  const Batches batches(o);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> losses(nullptr, &std::fclose);
  if (!o.losses_file.empty()) {
    losses.reset(std::fopen(o.losses_file.c_str(), "w"));
    if (!losses) throw std::runtime_error("cannot write --losses " + o.losses_file);
  }
  std::printf("backend %s, %zu parameters, layers %d channels %d heads %d seq %d vocab %d (padded %d) batch %d\n",
              ops.name(), model.parameter_count(), o.model.layers, o.model.channels, o.model.heads, o.model.seq,
              o.model.vocab, o.model.padded_vocab(), o.model.batch);
  std::vector<int> inputs, targets;
  using clock = std::chrono::steady_clock;
  clock::time_point timing_start = clock::now();
  for (int step = 1; step <= o.steps; ++step) {
    if (step == o.timing_warmup + 1) {
      model.synchronize();
      timing_start = clock::now();
    }
    const auto start = clock::now();
    batches.get(step - 1, inputs, targets);
    const TrainStep hp{step, learning_rate_at(o, step), o.weight_decay, o.grad_clip};
    const auto result = model.step(inputs, targets, hp);
    model.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - start).count();
    std::printf("step %4d  loss %.6f  grad_norm %.4f  lr %.3e  %.1f ms\n", step, result.loss, result.grad_norm,
                hp.learning_rate, ms);
    std::fflush(stdout);
    if (losses) std::fprintf(losses.get(), "%.8f\n", result.loss);
    if (!std::isfinite(result.loss)) {
      std::fprintf(stderr, "twin_gpt_train: loss is not finite at step %d\n", step);
      return 1;
    }
  }
  model.synchronize();
  const double seconds = std::chrono::duration<double>(clock::now() - timing_start).count();
  const int timed = o.steps - o.timing_warmup;
  const double step_s = seconds / timed;
  const double tokens_per_s = static_cast<double>(o.model.rows()) / step_s;
  const double tflops = o.model.flops_per_step() / step_s / 1e12;
  std::printf("summary: backend %s  step_time_s %.4f  tokens_per_s %.0f  model_tflops %.1f", ops.name(), step_s,
              tokens_per_s, tflops);
  if (o.peak_tflops > 0) std::printf("  mfu_vs_measured_peak %.1f%%", 100.0 * tflops / o.peak_tflops);
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace twin::bench

int main(int argc, char** argv) {
  try {
    const twin::bench::Options options = twin::bench::parse(argc, argv);
    if (options.backend == "cpu") return twin::bench::train<twin::bench::CpuOps>(options);
    return twin::bench::train<twin::bench::CudaOps>(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twin_gpt_train: %s\n", e.what());
    return 1;
  }
}
