// PyTorch profiler (Kineto) traces: the Chrome-trace JSON (or .json.gz) that torch.profiler's
// export_chrome_trace / tensorboard_trace_handler writes, one file per rank. What twin reads from one:
//   - iterations: the "ProfilerStep#N" ranges that profiler.step() records (or a count given by the user);
//   - GPU kernels ("cat": "kernel"): name, stream, start and duration, classified (kernel_class.hpp), each assigned to
//     the iteration its launch (the "cuda_runtime" event of the same "correlation") fell in; from the operator that
//     launched it (around the launch on the launching thread) when the profiler recorded shapes (record_shapes=True):
//     a GEMM's shape, a memory-bound kernel's bytes, a fused attention kernel's FLOPs; a collective's size and group
//     from the NCCL kernel's args or its record_param_comms operator's (op_args.hpp);
//   - for a trace of a CPU run (no kernels): the CPU operators ("cat": "cpu_op") by their self time, each classified
//     by its own name or by the nearest operator around it that has a class (an optimizer step's adds are the
//     optimizer's);
//   - the device (deviceProperties: GPU name and memory) and the rank and world size (distributedInfo).
// Format: Kineto's output_json.cpp (github.com/pytorch/kineto, libkineto/src/output_json.cpp) and the traces of
// github.com/facebookresearch/HolisticTraceAnalysis tests/data.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "measured/kernel_class.hpp"
#include "measured/op_args.hpp"

namespace twin::measured {

// A malformed or unusable input file: the message names the file and what is wrong (the CLI prints it as one
// `twin: error:` line).
class MeasuredError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The text of a file (its first `max_bytes`), gunzipped when it is gzip-compressed (any name); throws MeasuredError
// naming the file.
std::string read_maybe_gzipped(const std::string& path, std::size_t max_bytes = std::string::npos);

// One GPU kernel, or for a CPU run one operator's self time.
struct TracedKernel {
  std::string name;
  Classified kind;
  std::int64_t stream = 0;  // CUDA stream (GPU), thread id (CPU)
  double start_s = 0, duration_s = 0;
  int iteration = -1;  // index into KinetoTrace::steps; -1: outside every step
  MatmulShape shape;   // GEMMs whose launching operator recorded its input shapes
  // A memory-bound operator's (CPU) or kernel's (GPU: the operator that launched it alone) traffic estimated from the
  // operator's recorded input shapes and types (op_args.hpp traffic_bytes); 0 when no shapes were recorded.
  double bytes = 0;
  // FLOPs when known: a GEMM's shape's, a fused attention kernel's from its operator's shapes (op_args.hpp
  // attention_flops), or what the trace states (twin's own traces).
  double flops = 0;
  CollectiveCall collective;  // a communication kernel's size and group, when recorded (bytes 0: not recorded)
};

struct ProfilerStep {
  std::int64_t number = 0;  // the N of ProfilerStep#N
  double start_s = 0, duration_s = 0;
};

struct KinetoTrace {
  std::string path;
  int rank = -1;       // distributedInfo.rank, else a "rank-N" / "rank_N" / "rankN" in the file name, else -1
  int world_size = 0;  // distributedInfo.world_size; 0: not recorded
  bool gpu = false;    // kernels recorded (a GPU run); false: a CPU run's operators
  std::string device;  // deviceProperties[0].name ("NVIDIA A100-SXM4-80GB"); "cpu" for a CPU run
  double device_memory_bytes = 0;
  std::vector<ProfilerStep> steps;  // in time order
  std::vector<TracedKernel> kernels;
};

// Reads one trace (plain or gzipped JSON). twin's own traces (`twin run --trace`: "otherData": {"engine": "exec"})
// are read too, as a CPU run of one iteration: each compute op of the first rank one kernel, its class from its kind,
// its FLOPs and bytes from the op's arguments. Throws MeasuredError naming the file and, for a malformed event, its
// index and field.
KinetoTrace read_kineto_trace(const std::string& path);

// Keeps only the trace's fastest profiled step (ProfilerStep#N) and the kernels in it, renumbered as step 0: the step
// other work on a shared machine delayed least, so that a profile fitted on it is the same statistic as `twin compare
// --fastest-step` measures. A trace without steps is left as it is.
void keep_fastest_step(KinetoTrace& trace);

// Whether `text` (a file's first bytes, gunzipped) looks like a Chrome trace: an object with "traceEvents".
bool looks_like_chrome_trace(const std::string& text);

}  // namespace twin::measured
