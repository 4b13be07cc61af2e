// A hardware profile measured from real runs: the rates twin's cost model times ops with, fitted op by op.
//   GEMMs        time = overhead + FLOPs / rate, least squares over every GEMM whose shape the profiler recorded
//                (record_shapes), and each distinct shape's own rate at the median of its calls (GEMM efficiency by
//                shape; another plan's GEMM is timed at its nearest measured shape's rate); from twin's own traces
//                (FLOPs per op, no shapes) the median of the ops' rates;
//   memory       time = overhead + bytes / rate over the memory-bound operators (CPU) or kernels (GPU: HBM) whose
//                bytes their operator's recorded shapes and types give (op_args.hpp);
//   attention    time = overhead + FLOPs / rate over fused attention kernels (FLOPs as the cost model counts them);
//   collectives  per collective, group size and span (nodes): time = latency + bus bytes / bus bandwidth (nccl-tests'
//                bus bytes: the size times op_args.hpp bus_factor), with each message size's own bus bandwidth;
//   host         a CPU run's time between operators, per operator (Python and the framework).
// Each fit comes with its residual: the root mean square of its ops' errors over that of their times. A profile fitted
// on one plan is checked on another (`check`): the time that plan's ops take by the profile against what they took,
// class by class: the out-of-sample error. Profiles also come from twin's own microbenchmarks (microbenchmarks.hpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "measured/kineto.hpp"
#include "measured/program_work.hpp"

namespace twin::measured {

struct LinearFit {
  double overhead_s = 0;    // per op
  double rate_per_s = 0;    // FLOP/s or bytes/s
  double residual_rms = 0;  // rms(fitted - measured) / rms(measured), over the ops fitted
  std::size_t samples = 0;
  double predict_s(double work) const { return overhead_s + (rate_per_s > 0 ? work / rate_per_s : 0); }
};

// One op's work (FLOPs or bytes) and its time: a sample of a fit.
struct WorkSample {
  double work = 0, seconds = 0;
};

// Least squares of seconds = overhead + work / rate, the overhead kept >= 0 (else the line through the origin), with
// its residual.
LinearFit fit_linear(const std::vector<WorkSample>& samples);

struct ShapeRate {
  MatmulShape shape;
  double flops_per_s = 0;
  std::size_t calls = 0;
};

// One message size of a collective: its calls' median time as a bus bandwidth.
struct MessageRate {
  double bytes = 0;
  double bus_bytes_per_s = 0;
  std::size_t calls = 0;
};

// A collective of one kind over groups of one size and span: latency and bus bandwidth, and each size's own rate.
struct CollectiveFit {
  CommKind kind = CommKind::Other;
  int ranks = 0;
  int nodes = 0;                   // nodes the group spans (0: its ranks were not recorded)
  LinearFit fit;                   // overhead_s: the latency; rate_per_s: the bus bandwidth (bus bytes per second)
  std::vector<MessageRate> sizes;  // smallest first
};

struct OutOfSample {
  std::string path;
  // Per iteration, each class's kernels (operators) that the profile times: by it, and as measured.
  double gemm_predicted_s = 0, gemm_measured_s = 0;
  double memory_predicted_s = 0, memory_measured_s = 0;
  double attention_predicted_s = 0, attention_measured_s = 0;
  double collective_predicted_s = 0, collective_measured_s = 0;
};

struct CalibrateOptions {
  int gpus_per_node = 8;  // to count the nodes a collective's group spans from its ranks
  // The Program of the plan a CPU run's traces ran (twin calibrate --scenario): a PyTorch trace's memory-bound classes
  // are then fitted per byte the Program counts for them, and the time no Program op stands for (copies, reductions,
  // the framework between operators) per kernel the Program launches: the units the simulator times a host by.
  std::optional<ProgramWork> program;
};

struct HardwareProfile {
  std::string device;  // "cpu" or the GPU's name
  std::vector<std::string> sources;
  LinearFit gemm;
  std::vector<ShapeRate> gemm_shapes;      // largest FLOPs first
  LinearFit memory;                        // CPU: memory-bound operators; GPU: memory-bound kernels (HBM)
  LinearFit attention;                     // fused attention kernels (GPU)
  double attention_gemm_hbm_fraction = 0;  // the unfused attention's GEMMs, of the streaming rate (microbenchmark)
  std::vector<CollectiveFit> collectives;  // GPU runs whose collectives' sizes were recorded
  // CPU runs: each memory-bound kind of twin's Program (layernorm_attention, gelu, optimizer_step, ...) at the rate
  // its operators reached (their bytes over their time): a norm, an activation and an optimizer stream at different
  // rates. From a PyTorch trace every kind of a class gets the class's rate; from twin's own trace each kind its own.
  std::map<std::string, double> memory_bytes_per_s_by_kind;
  double host_s_per_operator = 0;  // CPU runs only
  // host_s_per_operator is the time outside the Program's ops per kernel the Program launches (--scenario), not the
  // time between a run's operators per operator.
  bool host_per_program_kernel = false;
  std::vector<OutOfSample> checks;
};

// Fits a profile on traces of one plan (one or more ranks); throws MeasuredError when they hold no GEMM with a
// recorded shape (the profiler ran without record_shapes=True).
HardwareProfile calibrate(const std::vector<KinetoTrace>& traces, const CalibrateOptions& options = {});

// The GEMM and memory time of another plan's trace by `profile` (each GEMM at its nearest measured shape's rate, as
// the simulator times it), against what they measured.
OutOfSample check_profile(const HardwareProfile& profile, const KinetoTrace& trace,
                          const CalibrateOptions& options = {});

// The nodes a group spans: its ranks' distinct nodes at `gpus_per_node` (0 when its ranks were not recorded).
int nodes_spanned(const CollectiveCall& call, int gpus_per_node);

// The profile as TOML (what --out writes; cluster.gpu_profile and twin sim --profile read it: topology/
// host_profile.hpp for a CPU, topology/gpu_profile.hpp for a GPU).
std::string profile_to_toml(const HardwareProfile& profile);

// A readable summary: the fits, their residuals, the out-of-sample errors.
std::string profile_table(const HardwareProfile& profile);

}  // namespace twin::measured
