// Hardware profiles from twin's own microbenchmarks instead of a training run's traces:
//   - bench/gpu's twin_gemm_peak printout (bench/gpu/gemm_peak.cpp writes these lines):
//       device NAME, N SMs, M MiB
//       gemm bf16 m M n N k K: median T ms (min T), R TFLOP/s                  -> [gemm], [[gemm.shape]]
//       hbm scale fp32 S MiB in place: median T ms, R GB/s read + write        -> [memory] (HBM)
//       attention_gemm_hbm_fraction F                                           -> [attention] gemm_hbm_fraction
//       flash attention bf16 causal, B x H heads of D, seq S: forward median T ms R TFLOP/s, backward T ms R TFLOP/s
//                                                                               -> [attention] (causal FLOPs)
//   - bench/kernels_cpu_bench's Google Benchmark JSON (--benchmark_format=json or --benchmark_out=FILE): each GEMM
//     with its counters m, n, k at its real time (benchmarks of more than one BLAS thread left out: a rank of the
//     threaded executor runs one), each memory-bound kernel's bytes_per_second for the kinds of twin's Program it
//     times, the fused attention's FLOP/s.
// Everything else in such a file is ignored; a file with none of these is refused.
#pragma once

#include <string>

#include "measured/calibrate.hpp"

namespace twin::measured {

enum class SourceKind { ProfilerTrace, GemmPeak, GoogleBenchmark };

// What a file is, by its first bytes (gunzipped): twin_gemm_peak's printout opens with "device " (or "gemm " when only
// GEMMs were asked for), Google Benchmark's JSON with {"context": ...; anything else is read as a trace.
SourceKind source_kind(const std::string& text);

// The profile of the GPU twin_gemm_peak ran on; throws MeasuredError naming the file when it has no measurement.
HardwareProfile profile_from_gemm_peak(const std::string& path, const std::string& text);

// The profile of the CPU kernels_cpu_bench ran on (device "cpu": nothing between operators, no framework runs them);
// throws MeasuredError naming the file when it is not Google Benchmark's JSON or has no GEMM with its shape.
HardwareProfile profile_from_google_benchmark(const std::string& path, const std::string& text);

}  // namespace twin::measured
