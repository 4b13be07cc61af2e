// A hardware profile measured from real runs' traces: the rates twin's cost model times ops with, fitted op by op.
//   GEMMs      time = overhead + FLOPs / rate, least squares over every GEMM whose shape the profiler recorded
//              (record_shapes), and each distinct shape's own rate at its fastest call (GEMM efficiency by shape;
//              another plan's GEMM is timed at its nearest measured shape's rate); from twin's own traces (FLOPs
//              per op, no shapes) the median of the ops' rates;
//   memory     time = overhead + bytes / rate over the memory-bound operators (norms, elementwise) of a CPU run, their
//              bytes estimated from their recorded input shapes (kineto.hpp);
//   host       a CPU run's time between operators, per operator (Python and the framework).
// Each fit comes with its residual: the root mean square of its ops' errors over that of their times. A profile fitted
// on one plan is checked on another (`check`): the GEMM and memory time that plan's ops take by the profile against
// what they took, the out-of-sample error.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "measured/kineto.hpp"

namespace twin::measured {

struct LinearFit {
  double overhead_s = 0;        // per op
  double rate_per_s = 0;        // FLOP/s or bytes/s
  double residual_rms = 0;      // rms(fitted - measured) / rms(measured), over the ops fitted
  std::size_t samples = 0;
  double predict_s(double work) const { return overhead_s + (rate_per_s > 0 ? work / rate_per_s : 0); }
};

struct ShapeRate {
  MatmulShape shape;
  double flops_per_s = 0;
  std::size_t calls = 0;
};

struct OutOfSample {
  std::string path;
  double gemm_predicted_s = 0, gemm_measured_s = 0;      // per iteration
  double memory_predicted_s = 0, memory_measured_s = 0;  // per iteration (CPU runs)
};

struct HardwareProfile {
  std::string device;  // "cpu" or the GPU's name
  std::vector<std::string> sources;
  LinearFit gemm;
  std::vector<ShapeRate> gemm_shapes;  // largest FLOPs first
  LinearFit memory;                    // CPU runs only (GPU kernels carry no shapes of their own)
  // CPU runs: each memory-bound kind of twin's Program (layernorm_attention, gelu, optimizer_step, ...) at the rate
  // its operators reached (their bytes over their time): a norm, an activation and an optimizer stream at different
  // rates. From a PyTorch trace every kind of a class gets the class's rate; from twin's own trace each kind its own.
  std::map<std::string, double> memory_bytes_per_s_by_kind;
  double host_s_per_operator = 0;      // CPU runs only
  std::vector<OutOfSample> checks;
};

// Fits a profile on traces of one plan (one or more ranks); throws MeasuredError when they hold no GEMM with a
// recorded shape (the profiler ran without record_shapes=True).
HardwareProfile calibrate(const std::vector<KinetoTrace>& traces);

// The GEMM and memory time of another plan's trace by `profile` (each GEMM at its nearest measured shape's rate, as
// the simulator times it), against what they measured.
OutOfSample check_profile(const HardwareProfile& profile, const KinetoTrace& trace);

// The profile as TOML (what --out writes; cluster.gpu_profile will read it).
std::string profile_to_toml(const HardwareProfile& profile);

// A readable summary: the fits, their residuals, the out-of-sample errors.
std::string profile_table(const HardwareProfile& profile);

}  // namespace twin::measured
