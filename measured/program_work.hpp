// One iteration of a plan's Program on its first rank, in the units the simulator times a CPU host by: each class's
// memory-bound bytes (Stream kernels, the unfused attention core's passes) and the kernel launches, each of which
// costs the host's per-operator time. `twin calibrate --scenario` divides a run's measured times by them, so that the
// profile's rates are per unit of the Program's own work: what the simulator multiplies them by.
#pragma once

#include <map>
#include <string>

#include "measured/kernel_class.hpp"
#include "model/program/program.hpp"

namespace twin::measured {

struct ProgramWork {
  std::map<KernelClass, double>
      stream_bytes;            // by the class of the op's kind (class_of): a GEMM op's bias pass is gemm
  double kernel_launches = 0;  // every compute op's kernels, as the cost model charges them
  // Each GEMM op's shape by its class ("forward mlp_up", model/ops/op_label.hpp): what twin's own traces, which carry
  // an op's FLOPs and not its shape, are matched with, so that they give GEMM rates by shape as PyTorch's do.
  std::map<std::string, model::GemmShape> gemm_shape_by_op_class;
  // Each GEMM op's passes beyond its GEMMs (a bias gradient's sum, a bias add), bytes by the op's class.
  std::map<std::string, double> gemm_pass_bytes_by_op_class;
};

ProgramWork program_work(const model::Program& program);

}  // namespace twin::measured
