// A measured run, whatever it was read from: PyTorch profiler traces (one per rank) or a training log (Megatron-LM,
// NeMo, torchtitan). Per iteration: its time on each rank, and from traces the kernel time by class, the
// communication and the part of it no compute kernel hid, and every kernel no rule classified, by name.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "measured/kernel_class.hpp"
#include "measured/kineto.hpp"

namespace twin::measured {

struct NamedTime {
  std::string name;
  double seconds = 0;  // per iteration
  double count = 0;    // per iteration
};

struct RankMeasurement {
  int rank = 0;
  std::string path;
  int iterations = 0;
  std::vector<double> iteration_s;  // each iteration's time (ProfilerStep's duration, or the span / given count)
  double iteration_time_s = 0;      // their mean
  // Per iteration, mean over the iterations:
  std::array<double, kKernelClassCount> class_s{};  // kernel (or CPU operator self) time by class
  std::map<std::string, double> communication_s;     // by collective (to_string(CommKind))
  double kernel_s = 0;                                // every kernel
  double communication_total_s = 0;
  double exposed_communication_s = 0;  // communication while no other kernel ran on any stream
  double outside_operators_s = 0;      // CPU run: the iteration's time on its busiest thread in no operator
  std::vector<NamedTime> unclassified;  // largest first
  std::vector<NamedTime> top_kernels;   // the largest kernels by name, for reports
  int streams = 0;                      // streams (threads) that ran kernels
  std::size_t kernels_outside_iterations = 0;  // recorded but in no ProfilerStep: not counted
};

struct MeasuredRun {
  std::string source;  // "pytorch profiler", "megatron-lm log", "nemo log", "torchtitan log"
  std::string device;  // GPU name, "cpu", or "" when the input does not say
  double device_memory_bytes = 0;
  int world_size = 0;  // 0: not recorded
  bool gpu = true;
  std::vector<RankMeasurement> ranks;  // traces: one per file, by rank
  double iteration_time_s = 0;         // mean over ranks; from a log, its mean iteration time (0: not in the log)
  // From logs (0: not reported): per GPU.
  double tokens_per_s_per_gpu = 0;
  double tflops_per_gpu = 0;
  double mfu = 0;
  int logged_iterations = 0;  // log lines read (the first interval, warm-up, left out when three or more)
  int used_iterations = 0;    // of those, the ones the mean is over
  // Memory as the log reports it (0: not in the log): Megatron-LM's "max allocated" (the caching allocator's peak of
  // live tensors, MB), torchtitan's "memory: X GiB" (its max reserved, the allocator's peak including its cache).
  double max_allocated_bytes = 0;
  double max_reserved_bytes = 0;
  // The run's model and plan as its log states them: tp, pp, dp, layers, hidden, heads, seq_len, global_batch,
  // micro_batch, world_size (only those found).
  std::map<std::string, long long> plan;
};

// Measures traces (one per rank; several files of one run). `iterations_given` > 0: the count of iterations a trace
// without ProfilerStep ranges holds (its kernel span is divided by it). `fastest_step`: each trace's fastest
// ProfilerStep alone (keep_fastest_step), its kernel times by class included. Throws MeasuredError naming the file.
MeasuredRun measure_traces(const std::vector<std::string>& paths, int iterations_given = 0, bool fastest_step = false);

// One rank's measurement from a read trace.
RankMeasurement measure_rank(const KinetoTrace& trace, int iterations_given = 0);

// Reads a training log of Megatron-LM (also Megatron-DeepSpeed), NeMo or torchtitan. Throws MeasuredError naming the
// file when it has no iteration line of any of them.
MeasuredRun read_training_log(const std::string& path);

// A measured input by its content: a directory (every *.json / *.json.gz trace in it), a trace, or a log.
// `fastest_step`: a trace's fastest ProfilerStep alone (measure_traces).
MeasuredRun read_measured(const std::string& path, int iterations_given = 0, bool fastest_step = false);
// Whether `path` is a measurement twin reads with read_measured (a trace, a directory of them, or a training log)
// rather than twin's own JSON.
bool is_measured_input(const std::string& path);

// Each rank's iteration time becomes its fastest iteration (the one other work on a shared machine delayed least)
// instead of the mean; the run's is their mean. Kernel times per class stay means (read_measured with fastest_step
// measures them on the fastest step too).
void use_fastest_iteration(MeasuredRun& run);

// The share of kernel time classified (not Unclassified), over every rank: what the bench reports.
double classified_share(const MeasuredRun& run);

nlohmann::json measured_to_json(const MeasuredRun& run);

}  // namespace twin::measured
