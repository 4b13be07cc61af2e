// A CPU host as twin simulates it: rates measured on the machine itself (`twin calibrate` fits them on profiler traces
// and writes a profile, measured/calibrate.hpp), never typed in. The simulator reads the profile through here.
//   [gemm]        flops_per_s, overhead_s        a GEMM call: overhead + FLOPs / rate (the least-squares fit)
//   [[gemm.shape]] m, n, k, batch, flops_per_s   each shape the profile measured, at its own rate
//   [memory]      bytes_per_s, overhead_s        a memory-bound operator: overhead + bytes / rate
//   [memory.kind] KIND = bytes_per_s             each memory-bound kind of the Program at its own measured rate
//   [host]        seconds_per_operator           the framework's time between two operators
//   [attention]   flops_per_s                    a fused attention kernel's rate (optional)
// Workers (threads, MPI ranks) of one host exchange data through shared memory: a copy at the memory rate.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "topology/hardware.hpp"

namespace twin::topology {

struct HostGemmRate {
  double m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

struct HostProfile {
  std::string path;
  std::string device;
  double gemm_flops_per_s = 0;
  double gemm_overhead_s = 0;
  std::vector<HostGemmRate> gemm_shapes;
  double memory_bytes_per_s = 0;
  double memory_overhead_s = 0;
  double host_s_per_operator = 0;
  double attention_flops_per_s = 0;  // 0: not measured
  std::map<std::string, double> memory_bytes_per_s_by_kind;  // [memory.kind]: twin's kind name -> bytes/s

  // Seconds a memory-bound op of twin's kind `kind` streams `bytes` for: at its kind's measured rate, else at the
  // memory rate.
  double memory_time_s(const std::string& kind, double bytes) const;

  // Seconds of `count` GEMMs [m, k] x [k, n]: at the measured rate of the nearest shape the profile measured (log
  // distance over m, n, k), or by the fit (overhead + FLOPs / rate per GEMM) when it measured none.
  double gemm_time_s(double m, double n, double k, double count) const;
};

// Reads a profile; throws std::invalid_argument naming the file and the field that is missing or not a positive
// number.
HostProfile read_host_profile(const std::string& path);

// A CPU host of `workers` workers as the simulator's node: one "GPU" per worker whose peak is the profile's GEMM rate
// and whose memory rate is the profile's, linked through shared memory at the memory rate.
NodeSpec cpu_host_node(const HostProfile& profile, int workers);
// The fabric between hosts: one host here, so nothing crosses it; loopback-like, at the memory rate.
FabricSpec cpu_host_fabric(const HostProfile& profile);

}  // namespace twin::topology
