// Goodput's numbers: the cited failure rates, the checkpoint's size and times, the closed form and its Monte Carlo.
#include "model/program/goodput.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "model/plan/parameters.hpp"
#include "model/program/estimates.hpp"

namespace twin::model {
namespace {

// Llama 3 405B (arXiv:2407.21783, sec. 3.3.4): a 54-day snapshot of pre-training on 16,384 H100, 419 unexpected
// interruptions; Table 5 by root cause, grouped here by the component a planner would spare or harden.
constexpr double kLlama3GpuHours = 54.0 * 24.0 * 16384.0;
constexpr double kLlama3GpuInterruptions = 148 + 72 + 19 + 17 + 6 + 6;   // faulty GPU, HBM3, SRAM, GSP, SDC, thermal
constexpr double kLlama3HostInterruptions = 32 + 3 + 3 + 2 + 2 + 2 + 2;  // maintenance, SSD, PSU, chassis, IO, CPU,
                                                                         // system memory
constexpr double kLlama3NicInterruptions = 7;
constexpr double kLlama3NetworkInterruptions = 35;           // network switch / cable
constexpr double kLlama3SoftwareInterruptions = 54 + 2 + 7;  // software bug, dependency, NCCL watchdog timeouts
static_assert(kLlama3GpuInterruptions + kLlama3HostInterruptions + kLlama3NicInterruptions +
                      kLlama3NetworkInterruptions + kLlama3SoftwareInterruptions ==
                  419,
              "Table 5 sums to 419");

// Llama 3 sec. 3.3.1: Tectonic "supports a sustainable throughput of 2 TB/s" for the 16,384-GPU cluster.
constexpr double kLlama3StorageBytesPerS = 2e12;
constexpr double kLlama3Gpus = 16384;

// From an interruption to training again, the checkpoint's load excluded: no fleet publishes it (Llama 3 reports only
// that most interruptions were handled by automation), so this is an assumption, 10 minutes, stated as one in
// docs/goodput.md: set cluster.restart_s to your scheduler's.
constexpr double kDefaultRestartS = 600;

// Optimizer bytes per parameter in a checkpoint: Adam's m and v in fp32, and the fp32 master copy when the weights
// are 16-bit (with fp32 weights the weights are the master copy).
double optimizer_checkpoint_bytes(DType dtype) {
  return dtype == DType::FP32 ? 8.0 : 12.0;
}

void require(bool ok, const char* what, double value) {
  if (!ok) throw std::invalid_argument(fmt::format("goodput: {} (got {})", what, value));
}

double lambda_per_s(const GoodputInputs& in) {
  return in.failures_per_gpu_hour * in.gpus / 3600.0;
}

// The shortest interval a run can take: one iteration, and under asynchronous saving the previous write must have
// landed before the next snapshot (Megatron-Core waits for it).
double shortest_interval_s(const GoodputInputs& in) {
  return std::max({in.iteration_time_s, in.commit_s - in.blocking_s, 1e-9});
}

// The interval that minimises E(interval) / interval: golden-section search over log(interval), on which the ratio
// is unimodal (E grows exponentially, the checkpoint's share falls as 1 / interval).
double optimal_interval_s(const GoodputInputs& in, double mtbf_s) {
  const double lo = shortest_interval_s(in);
  double a = std::log(lo), b = std::log(std::max(lo, 100 * mtbf_s + in.blocking_s));
  const auto cost = [&](double log_interval) {
    const double interval = std::exp(log_interval);
    return expected_segment_s(in, interval) / interval;
  };
  const double ratio = (std::sqrt(5.0) - 1) / 2;
  double c = b - ratio * (b - a), d = a + ratio * (b - a);
  double fc = cost(c), fd = cost(d);
  for (int i = 0; i < 200 && b - a > 1e-12; ++i) {
    if (fc <= fd) {
      b = d, d = c, fd = fc;
      c = b - ratio * (b - a), fc = cost(c);
    } else {
      a = c, c = d, fc = fd;
      d = a + ratio * (b - a), fd = cost(d);
    }
  }
  return std::exp((a + b) / 2);
}

}  // namespace

FailureRates llama3_failure_rates() {
  return {kLlama3GpuInterruptions / kLlama3GpuHours, kLlama3HostInterruptions / kLlama3GpuHours,
          kLlama3NicInterruptions / kLlama3GpuHours, kLlama3NetworkInterruptions / kLlama3GpuHours,
          kLlama3SoftwareInterruptions / kLlama3GpuHours};
}

FailureRates failure_rates(const Scenario& scenario) {
  const ClusterSpec& c = scenario.cluster;
  const FailureRates cited = llama3_failure_rates();
  return {c.gpu_failures_per_gpu_hour.value_or(cited.gpu), c.host_failures_per_gpu_hour.value_or(cited.host),
          c.nic_failures_per_gpu_hour.value_or(cited.nic), c.switch_failures_per_gpu_hour.value_or(cited.network),
          c.software_failures_per_gpu_hour.value_or(cited.software)};
}

double default_storage_bytes_per_s(const Scenario& scenario) {
  return kLlama3StorageBytesPerS * static_cast<double>(scenario.cluster.total_gpus()) / kLlama3Gpus;
}

double default_restart_s() {
  return kDefaultRestartS;
}

CheckpointCost checkpoint_cost(const Scenario& scenario, double host_copy_bytes_per_s) {
  require(host_copy_bytes_per_s > 0, "the host link's rate must be positive", host_copy_bytes_per_s);
  CheckpointCost cost;
  const double per_parameter = dtype_bytes(scenario.model.dtype) + optimizer_checkpoint_bytes(scenario.model.dtype);
  cost.bytes = count_parameters(scenario).total * per_parameter;
  cost.storage_bytes_per_s = scenario.cluster.storage_gb_per_s ? *scenario.cluster.storage_gb_per_s * 1e9
                                                               : default_storage_bytes_per_s(scenario);
  cost.write_s = cost.bytes / cost.storage_bytes_per_s;
  cost.load_s = cost.write_s;
  // Each GPU copies its own weights and optimizer shard to host memory (the memory estimate's, per stage).
  double largest_gpu_bytes = 0;
  for (const StageMemory& stage : estimate_memory(scenario).stages) {
    largest_gpu_bytes = std::max(largest_gpu_bytes, stage.weights_bytes + stage.optimizer_bytes);
  }
  cost.snapshot_s = largest_gpu_bytes / host_copy_bytes_per_s;
  cost.async = scenario.framework.async_checkpoint;
  return cost;
}

GoodputInputs goodput_inputs(const Scenario& scenario, double iteration_time_s, const CheckpointCost& checkpoint) {
  GoodputInputs in;
  in.iteration_time_s = iteration_time_s;
  in.gpus = static_cast<double>(scenario.cluster.total_gpus());
  in.failures_per_gpu_hour = failure_rates(scenario).total();
  in.blocking_s = checkpoint.blocking_s();
  in.commit_s = checkpoint.commit_s();
  in.restart_s = scenario.cluster.restart_s.value_or(default_restart_s()) + checkpoint.load_s;
  return in;
}

double expected_segment_s(const GoodputInputs& in, double interval_s) {
  const double lambda = lambda_per_s(in);
  const double segment_s = interval_s + in.blocking_s;
  if (lambda == 0) return segment_s;
  return std::expm1(lambda * segment_s) * (1 / lambda + in.restart_s + in.commit_s);
}

GoodputEstimate goodput_closed_form(const GoodputInputs& in) {
  require(in.iteration_time_s > 0 && std::isfinite(in.iteration_time_s), "the iteration time must be positive",
          in.iteration_time_s);
  require(in.gpus >= 1, "the job needs at least one GPU", in.gpus);
  require(in.failures_per_gpu_hour >= 0 && std::isfinite(in.failures_per_gpu_hour),
          "the failure rate must be a number >= 0", in.failures_per_gpu_hour);
  require(in.blocking_s >= 0 && in.commit_s >= 0 && in.restart_s >= 0, "checkpoint and restart times must be >= 0",
          std::min({in.blocking_s, in.commit_s, in.restart_s}));
  GoodputEstimate e;
  const double lambda = lambda_per_s(in);
  e.failures_per_day = lambda * 86400;
  e.downtime_per_failure_s = in.restart_s;
  if (lambda == 0) {  // nothing to recover from: one checkpoint at the end, none on the way
    e.mtbf_s = std::numeric_limits<double>::infinity();
    e.interval_s = in.interval_s;
    return e;
  }
  e.mtbf_s = 1 / lambda;
  const double c = in.blocking_s, m = e.mtbf_s;
  e.young_interval_s = std::sqrt(2 * c * m);
  e.daly_interval_s = c < 2 * m ? std::sqrt(2 * c * m) * (1 + std::sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c : m;
  e.optimal_interval_s = optimal_interval_s(in, m);
  if (in.interval_s > 0 && in.interval_s < shortest_interval_s(in) * (1 - 1e-12)) {
    throw std::invalid_argument(fmt::format(
        "goodput: a checkpoint interval of {:g} s is shorter than {}: {:g} s", in.interval_s,
        in.interval_s < in.iteration_time_s ? "one iteration" : "the asynchronous write of the previous checkpoint",
        shortest_interval_s(in)));
  }
  e.interval_s = in.interval_s > 0 ? in.interval_s : e.optimal_interval_s;
  const double segment_s = e.interval_s + c;
  const double expected_s = expected_segment_s(in, e.interval_s);
  e.goodput_fraction = e.interval_s / expected_s;
  e.checkpoint_overhead_fraction = c / expected_s;
  e.failure_loss_fraction = 1 - e.goodput_fraction - e.checkpoint_overhead_fraction;
  // E[X | X < T] for an exponential X: the work (and checkpoint time) lost, plus under asynchronous saving the
  // segment whose write had not landed (first order).
  const double survive = std::exp(-lambda * segment_s);
  e.lost_work_per_failure_s = m - segment_s * survive / (1 - survive) + in.commit_s;
  return e;
}

MonteCarloGoodput goodput_monte_carlo(const GoodputInputs& in, double useful_s, int trials, std::uint64_t seed) {
  require(trials >= 2, "the Monte Carlo needs at least 2 trials", trials);
  require(useful_s > 0 && std::isfinite(useful_s), "the Monte Carlo's useful time must be positive", useful_s);
  const GoodputEstimate closed = goodput_closed_form(in);
  const double interval = closed.interval_s > 0 ? closed.interval_s : useful_s;
  const double lambda = lambda_per_s(in);
  // Each segment is tried e^{lambda T} times on average: a process that almost never gets through one would draw
  // for hours. Refuse past a billion draws, naming the way out.
  const double tries_per_segment = std::exp(std::min(700.0, lambda * (interval + in.blocking_s)));
  const double draws = trials * std::ceil(useful_s / interval) * tries_per_segment;
  if (draws > 1e9) {
    throw std::invalid_argument(fmt::format(
        "goodput: the Monte Carlo would draw about {:.2g} times ({} runs, each segment tried {:.3g} times on "
        "average): ask for fewer runs, or read the closed form alone",
        draws, trials, tries_per_segment));
  }
  std::mt19937_64 random(seed);
  // Inverse transform (std::exponential_distribution's algorithm is the library's own: not the same on every one).
  const auto next_failure_s = [&]() {
    if (lambda == 0) return std::numeric_limits<double>::infinity();
    const double u = (static_cast<double>(random() >> 11) + 0.5) * 0x1.0p-53;  // in (0, 1)
    return -std::log(u) / lambda;
  };
  MonteCarloGoodput mc;
  mc.trials = trials;
  std::vector<double> walls;
  walls.reserve(static_cast<std::size_t>(trials));
  double failures = 0;
  for (int trial = 0; trial < trials; ++trial) {
    double done = 0, committed = 0, clock = 0;
    double pending_work = -1, pending_at = 0;  // asynchronous: the checkpoint being written, and when it lands
    while (done < useful_s) {
      const double work = std::min(interval, useful_s - done);
      const double segment = work + in.blocking_s;
      const double failure_in = next_failure_s();  // memoryless: a fresh draw per segment
      if (pending_work >= 0 && pending_at <= clock + std::min(failure_in, segment)) {
        committed = pending_work, pending_work = -1;
      }
      if (failure_in >= segment) {
        clock += segment;
        done += work;
        if (in.commit_s > 0) {
          pending_work = done, pending_at = clock + in.commit_s;
        } else {
          committed = done;
        }
      } else {
        clock += failure_in + in.restart_s;
        done = committed;
        pending_work = -1;
        failures += 1;
      }
    }
    walls.push_back(clock);
  }
  double sum = 0, squares = 0;
  for (double wall : walls) sum += wall;
  mc.wall_s_mean = sum / trials;
  for (double wall : walls) squares += (wall - mc.wall_s_mean) * (wall - mc.wall_s_mean);
  mc.wall_s_stddev = std::sqrt(squares / (trials - 1));
  std::sort(walls.begin(), walls.end());
  const auto quantile = [&](double q) { return walls[static_cast<std::size_t>(q * (trials - 1) + 0.5)]; };
  mc.wall_s_p05 = quantile(0.05), mc.wall_s_p95 = quantile(0.95);
  mc.goodput_fraction = useful_s / mc.wall_s_mean;
  // g = U / mean(W): its standard error is g x sd(W) / (mean(W) sqrt(n)) (delta method); 1.96 of them for 95 %.
  mc.confidence95 = 1.96 * mc.goodput_fraction * mc.wall_s_stddev / (mc.wall_s_mean * std::sqrt(trials));
  mc.failures_mean = failures / trials;
  return mc;
}

}  // namespace twin::model
