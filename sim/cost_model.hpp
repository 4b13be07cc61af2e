// CostModel: how long one rank spends on a compute op. The simulator asks it for every Compute op of the Program;
// communication is timed by the flows on the platform (sim/collectives.hpp), not here.
//
// `analytical` (A100 / H100 / H200) times each kernel the Program lists for the op (model::KernelBreakdown):
//   Gemm      time = max(compute, memory). compute = waves x (one tile's FLOPs per SM) / (per-SM peak x
//             gemm_efficiency), with the CTA tile cuBLAS would pick among `tiles` (tile quantization: partial tiles
//             cost a whole tile; wave quantization: a partial last wave costs a whole wave of `sm_count` tiles).
//             memory = operand bytes / (HBM x hbm_efficiency): small or skinny GEMMs become memory bound (a dimension
//             narrower than every tile is not quantized: cuBLAS has GEMV-like kernels for it). A backward
//             GEMM op runs the input-gradient GEMM [m,n]x[n,k] and the weight-gradient GEMM [k,m]x[m,n].
//   Stream    memory bound: its bytes over HBM (elementwise passes, copies, the weight-gradient accumulation).
//   flash     FlashAttention's kernel at its measured rate on the causal FLOPs it computes.
//   attention the two batched GEMMs of each head (Q K^T [s,d]x[d,s], P V [s,s]x[s,d]) and the bytes they read beyond
//             their operands at attention_gemm_hbm_fraction of the streaming rate (one side only a head wide), the
//             softmax, dropout and layout-copy passes over HBM.
//   each kernel adds kernel_launch_s per launch.
//   layer     a fused TransformerLayer op costs the sum of its parts.
// No constant is fitted to a published training run; each one cites its source in cost_model.cpp.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/program/program.hpp"
#include "report/summary.hpp"
#include "sim/measured_tables.hpp"
#include "topology/hardware.hpp"
#include "topology/host_profile.hpp"

namespace twin::sim {

// What issuing an op costs the host thread that drives a rank's GPU (Python, the framework, PyTorch's dispatcher, the
// launch calls): `seconds` for its `kernels` launches. The GPU cannot start a kernel before the host has issued it.
// Under CUDA graphs (model/ops/host_issue.hpp) the op's captured kernels are issued by its layer's graph instead:
// `graph_launch_s` is that graph's launch, which the host pays once for every op of the same graph.
struct HostCost {
  double seconds = 0;
  int kernels = 1;
  double graph_launch_s = 0;
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual std::string name() const = 0;
  // Seconds one rank spends on `op`, a Compute op of `scenario`'s Program.
  virtual double compute_time_s(const model::Scenario& scenario, const model::Op& op) const = 0;
  // Seconds of one half of the backward of the GEMM `what` (QkvProjection, AttentionProjection, MlpUp, MlpDown,
  // LmHead) for one micro-batch: its weight-gradient GEMM, or its input-gradient GEMM. What a backward TP collective
  // can hide under (framework.tp_comm_overlap); 0 when the model does not know.
  virtual double gemm_half_s(const model::Scenario& /*scenario*/, model::ComputeKind /*what*/,
                             bool /*weight_gradient*/) const {
    return 0;
  }
  // Seconds of copies the framework makes outside the Program's ops: `bytes` through HBM in `kernels` memory-bound
  // kernels (DeepSpeed's PartitionedTensor.full() on a pipeline receipt, model/ops/exchanges.hpp); 0 when the model does
  // not know.
  virtual double memory_copy_s(double /*bytes*/, int /*kernels*/) const { return 0; }
  // What issuing `op` (any kind) costs the rank's host; nothing when the model does not know.
  virtual HostCost host_cost(const model::Scenario& /*scenario*/, const model::Op& /*op*/) const { return {}; }
};

struct GemmTile {
  int rows = 128;
  int cols = 128;
};

struct AnalyticalParameters {
  double gemm_efficiency = 1;  // of peak, for a GEMM with no tile or wave quantization loss
  double hbm_efficiency = 1;   // of datasheet HBM bandwidth, for a streaming kernel
  double kernel_launch_s = 0;  // per kernel, on the GPU: the gap between dependent kernels
  // Per kernel, on the host: the time the framework's host thread takes to issue one (the function host_s_per_kernel);
  // 0: the host is never behind the GPU.
  double host_s_per_kernel = 0;
  // Of the streaming rate (hbm_efficiency), what the attention core's batched GEMMs reach: each reads or writes an
  // s x s scores tensor per head with only a head's width on its other side (see cost_model.cpp).
  double attention_gemm_hbm_fraction = 1;
  // A fused attention kernel's measured rate (a profile's: cluster.gpu_profile), in place of flash_attention_rate's
  // cited one; 0: the cited one.
  double attention_flops_per_s = 0;
  std::vector<GemmTile> tiles;
  // A weight GEMM's measured loss by shape (sim/measured_tables.hpp): null where none was published (the A100), and
  // on a CPU host.
  const GemmShapeTable* gemm_shapes = nullptr;
  // Where the two efficiencies come from, for reports: the GEMM measurement they were derived from, and whether it
  // (and the HBM bandwidth) is this cluster's own (cluster.gemm_tflops, cluster.hbm_gb_per_s) or a cited one.
  double gemm_measured_flops_per_s = 0;
  std::array<double, 3> gemm_measured_shape{};  // m, n, k
  bool gemm_measured_here = false;
  bool hbm_measured_here = false;
  bool attention_measured_here = false;  // cluster.attention_gemm_hbm_fraction
  // A CPU host: its GEMMs at the rates its profile measured, shape by shape (topology/host_profile.hpp), in place of
  // peak x efficiency with tile quantization; empty on a GPU.
  std::shared_ptr<const topology::HostProfile> host;
};

// The parameters of a CPU host from its profile: GEMMs at its measured rates, streaming at its memory rate, each
// kernel costing its per-operator overhead and the framework's time between operators (the host and the "device"
// are one thread, so they add up).
AnalyticalParameters host_parameters(const topology::HostProfile& profile);

// FlashAttention's measured forward + backward rate under the causal mask on `gpu` (sim/cost_model.cpp cites the
// measurement) for a sequence of `seq` and heads of `head_dim`, and the head dimension its kernel computes on.
struct FlashAttentionRate {
  double flops_per_s = 0;      // of the causal FLOPs, counted with kernel_head_dim
  double kernel_head_dim = 0;  // the head dimension rounded up to the kernel's block
};
FlashAttentionRate flash_attention_rate(const topology::GpuSpec& gpu, model::AttentionKind kind, double seq,
                                        double head_dim);

// The cited parameters for a GPU (by GpuSpec::name); throws std::invalid_argument for an unknown GPU.
AnalyticalParameters analytical_parameters(const topology::GpuSpec& gpu);
// The same, with the cluster's own measurements (cluster.gemm_tflops / gemm_shape, cluster.hbm_gb_per_s) in place of
// the cited ones where given; throws std::invalid_argument naming the field when a measurement exceeds what the GPU
// can do (its datasheet peak or HBM bandwidth). The host's time per kernel: the cluster's, or its node's.
AnalyticalParameters analytical_parameters(const topology::GpuSpec& gpu, const model::ClusterSpec& cluster);
// The host's seconds to issue one kernel: cluster.host_us_per_kernel where given, else the node's measured host's.
double host_s_per_kernel(const model::ClusterSpec& cluster, const topology::NodeSpec& node);

class AnalyticalCostModel : public CostModel {
 public:
  explicit AnalyticalCostModel(topology::GpuSpec gpu);
  AnalyticalCostModel(topology::GpuSpec gpu, AnalyticalParameters parameters);

  std::string name() const override { return "analytical"; }
  double compute_time_s(const model::Scenario& scenario, const model::Op& op) const override;

  // Pieces, for tests and for later refinements.
  // `count` GEMMs [m, k] x [k, n] on one GPU (no launch overhead), their operands moving at `hbm_fraction` of the
  // streaming rate when memory bound.
  double gemm_time_s(double m, double n, double k, double count, model::DType dtype, double hbm_fraction = 1) const;
  // The same GEMMs with FP8 operands under `recipe`: at the GPU's FP8 peak times the efficiency its measured FP8 GEMM
  // leaves (sim/fp8_gemm.hpp), tiles and waves as for 16-bit GEMMs; memory bound on one-byte operands and a 16-bit
  // output. Throws std::invalid_argument for a GPU without FP8 (fp8_gemm_measurement).
  double fp8_gemm_time_s(double m, double n, double k, double count, model::Fp8Recipe recipe) const;
  // `count` weight GEMMs (a linear layer's, or one per local expert, launched one after another): gemm_time_s or
  // fp8_gemm_time_s (`recipe` set), but no faster than each at the large-GEMM rate times the measured shape factor
  // (AnalyticalParameters::gemm_shapes). The rule, on every GPU: the large-GEMM rate is a cited measured GEMM of the
  // software generation the GPU's runs used, tile and wave quantization price shapes above the table's grid, the table
  // the losses below and inside it (latency, pipeline fill), whichever is slower.
  double weight_gemm_time_s(double m, double n, double k, double count, model::DType dtype,
                            const model::Fp8Recipe* recipe = nullptr) const;
  double memory_time_s(double bytes) const;
  // The rate of a weight GEMM without tile or wave loss: the dtype's peak (FP8's with `recipe`) times its efficiency.
  // No weight GEMM runs faster (the quantization and the shape table only slow it): the search's bound divides by it.
  double large_gemm_flops_per_s(model::DType dtype, const model::Fp8Recipe* recipe = nullptr) const;
  double gemm_half_s(const model::Scenario& scenario, model::ComputeKind what, bool weight_gradient) const override;
  double memory_copy_s(double bytes, int kernels) const override;
  HostCost host_cost(const model::Scenario& scenario, const model::Op& op) const override;
  // Kernels a compute op launches (a fused layer op: its parts'), as its launch overhead counts them.
  int kernel_count(const model::Scenario& scenario, const model::Op& op) const { return timed(scenario, op).second; }
  const topology::GpuSpec& gpu() const { return gpu_; }
  const AnalyticalParameters& parameters() const { return parameters_; }

 private:
  // Seconds of a compute op that is not a fused layer; `kernels` gets the kernels it launches.
  double op_time_s(const model::Scenario& scenario, const model::Op& op, int& kernels) const;
  double gemm_kernels_s(const model::Scenario& scenario, const model::Op& op) const;
  // A streaming kernel of `op` moving `bytes`: on a CPU host at the rate its profile measured for the op's kind.
  double stream_time_s(const model::Op& op, double bytes) const;
  double fp8_gemm_kernels_s(const model::Scenario& scenario, const model::Op& op) const;
  double attention_gemms_s(const model::Scenario& scenario, const model::Op& op) const;
  double flash_attention_s(const model::Scenario& scenario, const model::Op& op) const;
  std::pair<double, int> timed(const model::Scenario& scenario, const model::Op& op) const;  // seconds, kernels
  // An FP8 recipe's measured GEMM (sim/fp8_gemm.hpp): the efficiency it leaves once the tile model's loss at its
  // shape is divided out, and its rate, which no FP8 GEMM of the recipe exceeds (sim/cost_model.cpp, ceiling_s).
  struct Fp8Rate {
    double efficiency = 0;
    double measured_flops_per_s = 0;
  };
  const Fp8Rate& fp8_rate(model::Fp8Recipe recipe) const;
  // The measured rate no 16-bit GEMM of `dtype` exceeds (ceiling_s); 0 where none was measured.
  double gemm_ceiling_flops_per_s(model::DType dtype) const;

  topology::GpuSpec gpu_;
  AnalyticalParameters parameters_;
  struct Issued {
    int kernels = 0;        // launches outside a CUDA graph
    bool in_graph = false;  // whether a CUDA graph issues any of it
    double host_s = 0;      // the host's time for what it issues itself
  };
  struct FusedLayerTime {
    std::shared_ptr<const model::KernelBreakdown> breakdown;  // kept alive: its address is the key
    std::pair<double, int> timed;                             // seconds, kernels
    std::optional<Issued> issued;  // host_cost's, summed over the parts
  };
  // What the host issues itself for compute op `op` (a fused op: its parts'), and whether a CUDA graph issues any of it.
  Issued issued(const model::Scenario& scenario, const model::Op& op) const;
  // The host's seconds for compute op `op` (no parts) that it issues itself, `kernels` launches.
  double issue_s(const model::Scenario& scenario, const model::Op& op, int kernels) const;
  mutable std::map<const model::KernelBreakdown*, FusedLayerTime> layer_cache_;
  mutable std::map<model::Fp8Recipe, Fp8Rate> fp8_rates_;  // by recipe, from its measured FP8 GEMM
};

// Fixed times per phase: what the ideal-pipeline tests need (a forward op costs `forward_s`, a recompute op
// `recompute_s`, a backward op `backward_s`, the optimizer `optimizer_s`).
class FixedCostModel : public CostModel {
 public:
  // `weight_grad_s`: a zero-bubble schedule's W of a layer (its B takes `backward_s`).
  FixedCostModel(double forward_s, double backward_s, double recompute_s = 0, double optimizer_s = 0,
                 double weight_grad_s = 0)
      : forward_s_(forward_s),
        backward_s_(backward_s),
        recompute_s_(recompute_s),
        optimizer_s_(optimizer_s),
        weight_grad_s_(weight_grad_s) {}
  std::string name() const override { return "fixed"; }
  double compute_time_s(const model::Scenario& scenario, const model::Op& op) const override;

 private:
  double forward_s_, backward_s_, recompute_s_, optimizer_s_, weight_grad_s_;
};

// What `cost` charges each part of a fused layer op of `scenario` (its KernelBreakdown's parts), for a summary's
// compute_by_kind at layer granularity. Both must outlive the returned function.
report::LayerParts layer_parts(const CostModel& cost, const model::Scenario& scenario);

}  // namespace twin::sim
