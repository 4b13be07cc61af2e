// Training logs, read line by line. The formats, as their sources print them:
//   Megatron-LM (megatron/training/training.py training_log; megatron/training.py before 2024; Megatron-DeepSpeed):
//     " iteration       10/  500000 | consumed samples: 5120 | elapsed time per iteration (ms): 3015.6 |
//       throughput per GPU (TFLOP/s/GPU): 123.4 | learning rate: ... | global batch size:   512 | lm loss: ..."
//     and its arguments block ("  tensor_model_parallel_size ........ 8") and "using world size: 64, data-parallel
//     size: 4, ..., tensor-model-parallel size: 8, pipeline-model-parallel size: 2";
//   NeMo (PyTorch Lightning's progress bar): "... global_step=9.000, consumed_samples=5120.0, train_step_timing in
//     s=2.960]" and its model config ("tensor_model_parallel_size: 8", "num_layers: 24", ...);
//   torchtitan (torchtitan/train.py, metrics.py): "step: 10  loss:  9.2345  memory: 27.41GiB(28.84%)  tps: 7,036
//     tflops: 326.47  mfu: 33.01%" (colored with ANSI escapes; "wps" before 2024-10), and "Training starts at step 1,
//     with local batch size 8, global batch size 64, sequence length 8192".
// The first logged interval includes start-up (compilation, allocator warm-up, the first NCCL connections): it is
// left out when three or more were logged.
#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/core.h>

#include "measured/measured_run.hpp"

namespace twin::measured {
namespace {

std::string without_ansi(const std::string& line) {
  static const std::regex escape("\x1b\\[[0-9;]*m");
  return std::regex_replace(line, escape, "");
}

double number(const std::string& text) {
  std::string digits;
  for (char c : text) {
    if (c != ',') digits += c;
  }
  return std::stod(digits);
}

// Megatron's and NeMo's names of the plan and model keys -> twin's.
const std::map<std::string, std::string>& plan_keys() {
  static const std::map<std::string, std::string> keys = {
      {"tensor_model_parallel_size", "tp"},   {"pipeline_model_parallel_size", "pp"},
      {"data_parallel_size", "dp"},           {"num_layers", "layers"},
      {"hidden_size", "hidden"},              {"num_attention_heads", "heads"},
      {"seq_length", "seq_len"},              {"encoder_seq_length", "seq_len"},
      {"global_batch_size", "global_batch"},  {"micro_batch_size", "micro_batch"},
      {"world_size", "world_size"}};
  return keys;
}

std::size_t warmup_intervals(std::size_t logged) { return logged >= 3 ? 1 : 0; }

double mean_after_warmup(const std::vector<double>& values) {
  const std::size_t skip = warmup_intervals(values.size());
  double total = 0;
  for (std::size_t i = skip; i < values.size(); ++i) total += values[i];
  return total / static_cast<double>(values.size() - skip);
}

}  // namespace

MeasuredRun read_training_log(const std::string& path) {
  const std::string text = read_maybe_gzipped(path);
  static const std::regex megatron_iteration(R"(iteration\s+(\d+)\s*/\s*\d+\s*\|.*elapsed time per iteration \(ms\):\s*([0-9.]+))");
  static const std::regex megatron_tflops(R"(throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.]+))");
  static const std::regex megatron_global_batch(R"(global batch size:\s*(\d+))");
  static const std::regex nemo_step(R"(train_step_timing in s=([0-9.]+))");
  static const std::regex titan_step(R"(step:\s*(\d+)\s+loss:.*?(?:tps|wps):\s*([0-9,.]+)(?:\s+tflops:\s*([0-9,.]+))?(?:\s+mfu:\s*([0-9.]+)%)?)");
  static const std::regex argument(R"(^\s*([a-z_0-9]+)\s*(?:\.{3,}|:)\s*(\d+)\s*$)");
  static const std::regex world(R"(using world size:\s*(\d+), data-parallel[- ]size:\s*(\d+).*?, tensor-model-parallel size:\s*(\d+).*?, pipeline-model-parallel size:\s*(\d+))");
  // Megatron-LM's report_memory (megatron/training/utils.py): "memory (MB) | allocated: ... | max allocated: ...";
  // torchtitan's step line: "memory: 27.41GiB(28.84%)" (max reserved).
  static const std::regex megatron_memory(R"(memory \(MB\).*\|\s*max allocated:\s*([0-9.]+))");
  static const std::regex titan_memory(R"(memory:\s*([0-9.]+)\s*GiB)");
  static const std::regex titan_batch(R"(local batch size (\d+), global batch size (\d+), sequence length (\d+))");

  MeasuredRun run;
  run.device = "";
  std::vector<double> megatron_ms, megatron_tflops_values, nemo_s, titan_tps, titan_tflops, titan_mfu;
  std::istringstream lines(text);
  std::string raw;
  std::size_t line_number = 0;
  while (std::getline(lines, raw)) {
    ++line_number;
    // A progress bar rewrites its line with carriage returns: each piece is a line of its own.
    std::istringstream pieces(without_ansi(raw));
    std::string line;
    while (std::getline(pieces, line, '\r')) {
      std::smatch m;
      try {
        if (std::smatch memory; std::regex_search(line, memory, megatron_memory)) {
          run.max_allocated_bytes = std::max(run.max_allocated_bytes, number(memory[1]) * 1024 * 1024);
        }
        if (std::regex_search(line, m, megatron_iteration)) {
          megatron_ms.push_back(number(m[2]));
          std::smatch t;
          if (std::regex_search(line, t, megatron_tflops)) megatron_tflops_values.push_back(number(t[1]));
          if (std::regex_search(line, t, megatron_global_batch)) run.plan["global_batch"] = std::stoll(t[1]);
        } else if (std::regex_search(line, m, nemo_step)) {
          nemo_s.push_back(number(m[1]));
        } else if (std::regex_search(line, m, titan_step)) {
          titan_tps.push_back(number(m[2]));
          if (std::smatch memory; std::regex_search(line, memory, titan_memory)) {
            run.max_reserved_bytes = std::max(run.max_reserved_bytes, number(memory[1]) * 1024 * 1024 * 1024);
          }
          if (m[3].matched) titan_tflops.push_back(number(m[3]));
          if (m[4].matched) titan_mfu.push_back(number(m[4]) / 100);
        } else if (std::regex_search(line, m, world)) {
          run.plan["world_size"] = std::stoll(m[1]);
          run.plan["dp"] = std::stoll(m[2]);
          run.plan["tp"] = std::stoll(m[3]);
          run.plan["pp"] = std::stoll(m[4]);
        } else if (std::regex_search(line, m, titan_batch)) {
          run.plan["global_batch"] = std::stoll(m[2]);
          run.plan["seq_len"] = std::stoll(m[3]);
        } else if (std::regex_search(line, m, argument)) {
          if (const auto key = plan_keys().find(m[1]); key != plan_keys().end()) {
            run.plan[key->second] = std::stoll(m[2]);
          }
        }
      } catch (const std::exception&) {
        throw MeasuredError(fmt::format("'{}':{}: a number out of range in \"{}\"", path, line_number, line));
      }
    }
  }
  for (const auto& [key, value] : run.plan) {
    if (value <= 0) throw MeasuredError(fmt::format("'{}': {} = {} must be positive", path, key, value));
  }
  if (!megatron_ms.empty()) {
    run.source = "megatron-lm log";
    run.logged_iterations = static_cast<int>(megatron_ms.size());
    run.iteration_time_s = mean_after_warmup(megatron_ms) / 1e3;
    if (!megatron_tflops_values.empty()) run.tflops_per_gpu = mean_after_warmup(megatron_tflops_values);
  } else if (!nemo_s.empty()) {
    run.source = "nemo log";
    run.logged_iterations = static_cast<int>(nemo_s.size());
    run.iteration_time_s = mean_after_warmup(nemo_s);
  } else if (!titan_tps.empty()) {
    run.source = "torchtitan log";
    run.logged_iterations = static_cast<int>(titan_tps.size());
    run.tokens_per_s_per_gpu = mean_after_warmup(titan_tps);
    if (!titan_tflops.empty()) run.tflops_per_gpu = mean_after_warmup(titan_tflops);
    if (!titan_mfu.empty()) run.mfu = mean_after_warmup(titan_mfu);
  } else {
    throw MeasuredError(fmt::format(
        "'{}' is neither a PyTorch profiler trace nor a training log twin reads: no Megatron-LM line (\"elapsed time "
        "per iteration (ms)\"), NeMo line (\"train_step_timing in s=\") or torchtitan line (\"step: N loss: ... tps: "
        "...\")",
        path));
  }
  run.used_iterations =
      run.logged_iterations - static_cast<int>(warmup_intervals(static_cast<std::size_t>(run.logged_iterations)));
  if (run.iteration_time_s < 0 || run.tokens_per_s_per_gpu < 0) {
    throw MeasuredError(fmt::format("'{}': a negative iteration time or throughput", path));
  }
  if (run.plan.count("world_size")) run.world_size = static_cast<int>(run.plan["world_size"]);
  return run;
}

}  // namespace twin::measured
