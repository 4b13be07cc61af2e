// How the training framework moves pipeline tensors and overlaps communication: replay details the Program leaves
// to the engine (docs/accuracy.md has the sources).
//
//   pipeline exchanges  Megatron-LM and DeepSpeed both block on their point-to-point calls: the ops of one exchange
//                       (the Send/Recv ops between two compute ops) are posted when the compute before them ends, a
//                       transfer starts once both sides have posted (NCCL send/recv and broadcast are rendezvous),
//                       and the compute after the exchange waits for every op of it, sends included.
//                         Megatron (megatron/p2p_communication.py, 2021-2022): one batch_isend_irecv per exchange
//                         (its sends and receives move at once), then torch.cuda.synchronize(); with TP and without
//                         sequence parallelism, each rank sends 1/t of the tensor and the receiver all-gathers it
//                         over NVLink (--scatter-gather-tensors-in-pipeline, on by default).
//                         DeepSpeed (deepspeed/runtime/pipe/engine.py and p2p.py, v0.5): one blocking broadcast in a
//                         two-rank group per tensor, in the TrainSchedule's order (a stage entering a backward step
//                         sends the activation before it receives the gradient; entering a forward step it receives
//                         the activation before it sends the gradient; messages of different steps go in step
//                         order, see exchange_order). Activations are partitioned across the TP
//                         group (is_pipe_partitioned: a meta tensor and 1/t of the data, all-gathered on receipt);
//                         gradients are sent whole (is_grad_partitioned = False through v0.5.3), and receiving one
//                         first all-gathers the stage's own partitioned output to run the backward. From v0.5.4
//                         (framework.deepspeed_version, or framework.bf16_optimizer: v0.6.2 on; is_grad_partitioned
//                         = is_model_parallel) gradients are partitioned too, and the backward restores both its
//                         output and the received gradient. Each such gather is
//                         PartitionedTensor.full() (runtime/utils.py): it zero-fills the full tensor, all-gathers
//                         into a list of its slices (PyTorch's NCCL group gathers into a flat buffer and copies
//                         out) and returns a clone: 5 full tensors through HBM in 3 kernels; the received 1/t
//                         partition is also cloned twice (_exec_recv_activations, _exec_forward_pass).
//   TP overlap          framework.tp_comm_overlap: in the backward pass, the input-gradient all-reduce (reduce-
//                       scatter with sequence parallelism) of a column-parallel GEMM runs under its weight-gradient
//                       GEMM, and the sequence-parallel all-gather of its input under its input-gradient GEMM
//                       (Megatron's LinearWithGradAccumulationAndAsyncCommunication). The collective's kernel
//                       holds one SM per NCCL channel while it runs, so the GEMM beside it runs on the others
//                       (exposed_beside_gemm_s).
#pragma once

#include <vector>

#include "model/program.hpp"

namespace twin::sim {

// One Send/Recv pair of the Program as the framework performs it.
struct PipelineTransfer {
  double wire_bytes = 0;           // per rank, over the link between the two stages
  int messages = 1;                // NCCL calls, each paying the point-to-point latency
  int receipt_gathers = 0;         // all-gathers of `full_bytes` the receiver runs across its TP group (NVLink)
  double full_bytes = 0;           // the tensor's full size per rank (Op::bytes)
  // The receiver's copies around that gather, through HBM on its compute stream (DeepSpeed's
  // PartitionedTensor.full(): zero-fill, the list all-gather's copy-out, a clone).
  double receipt_copy_bytes = 0;
  int receipt_copy_kernels = 0;
};
PipelineTransfer pipeline_transfer(const model::Scenario& scenario, const model::Op& p2p);

// Serialized exchanges (DeepSpeed's pipeline engine, whose only training schedule is 1F1B) or batched ones
// (Megatron; and GPipe or interleaved scenarios of either framework).
bool serialized_exchanges(const model::Scenario& scenario);

// The TrainSchedule step (deepspeed/runtime/pipe/schedule.py) in which `stage` of `stages` issues pipeline op `p2p`:
// the forward of micro-batch k runs at step 2k + stage, its backward at step 2k + 2 stages - 1 - stage; a receive
// belongs to the step of the pass that consumes it, a send to the step after the pass that produced it.
std::int64_t deepspeed_step(const model::Op& p2p, int stage, int stages);

// The order of one exchange's ops on `stage` (indices into `ops`, in Program order) as the framework issues them:
// batched exchanges keep Program order; serialized ones go by DeepSpeed step, activation ops (Phase::Forward) before
// gradient ops within a step (gradient ops first from DeepSpeed v0.8.3 on). (With fewer micro-batches than stages
// ahead, the last warm-up activation leaves in an earlier step than the first gradient arrives in: Program order
// there would deadlock.)
std::vector<std::int32_t> exchange_order(const model::Scenario& scenario, const std::vector<model::Op>& ops,
                                         std::vector<std::int32_t> exchange, int stage);

// framework.tp_comm_overlap: whether this TP collective of the backward pass runs under an independent GEMM.
enum class HiddenUnder : unsigned char { Nothing, WeightGradient, InputGradient };
HiddenUnder tp_overlap(const model::Scenario& scenario, const model::Op& collective);

// The time a collective of `collective_s` adds to a GEMM of `gemm_s` it runs beside, when the collective's thread
// blocks hold `sm_share` of the SMs meanwhile (NCCL launches one block per channel, and a cuBLAS GEMM block does not
// fit beside one: NVIDIA Developer Forums, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation
// because of Tail Effect", 2025, profiles an all-gather's 24 blocks pushing a 132-block GEMM into a second wave on
// an H100): the GEMM advances at 1 - sm_share while the collective runs, so the pair takes
// max(collective, gemm + sm_share x collective), i.e. max(collective - gemm, sm_share x collective) past the GEMM.
// The GEMM's wave quantization on the SMs left is not modelled.
double exposed_beside_gemm_s(double collective_s, double gemm_s, double sm_share);

}  // namespace twin::sim
