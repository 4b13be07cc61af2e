// Pipeline exchanges as the framework performs them (docs/accuracy.md has the sources): the order a stage issues its
// Send/Recv ops in, whether they wait for their peer, and what a message costs beyond its bytes.
//
// Megatron-LM and DeepSpeed both block on their point-to-point calls: the ops of one exchange (the Send/Recv ops
// between two compute-stream ops) are posted when the compute before them ends, a transfer starts once both sides
// have posted (NCCL send/recv and broadcast are rendezvous), and the compute after the exchange waits for every op of
// it, sends included.
//   Megatron (megatron/p2p_communication.py, 2021-2022): one batch_isend_irecv per exchange (its sends and receives
//   move at once), then torch.cuda.synchronize().
//   DeepSpeed (deepspeed/runtime/pipe/engine.py and p2p.py, v0.5): one blocking broadcast in a two-rank group per
//   tensor, in the TrainSchedule's order (a stage entering a backward step sends the activation before it receives
//   the gradient; entering a forward step it receives the activation before it sends the gradient; messages of
//   different steps go in step order). Its PipelineEngine trains with TrainSchedule (1F1B) only: a GPipe scenario of
//   DeepSpeed's is issued as Megatron's are (TrainSchedule's order does not fit that op order and would deadlock).
//   The interleaved schedule's Program order pairs sends and receives differently from Megatron's combined calls, so
//   its messages leave eagerly (a send still blocks its sender until the bytes have arrived).
#pragma once

#include <cstdint>
#include <vector>

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// How the framework issues the ops of one exchange.
enum class ExchangeIssue : std::uint8_t {
  Batched,     // all at once, when the compute before them ends; each transfer once both sides have posted
  Serialized,  // one after another in PipelineExchange::ops order, each a rendezvous with its peer
  Eager,       // each as soon as its dependencies allow; a message leaves without waiting for its receiver
};
ExchangeIssue exchange_issue(const Scenario& scenario);

// The Send/Recv ops between two compute-stream ops of a stage (DataParallel-stream ops aside).
struct PipelineExchange {
  std::int32_t after = -1;        // the compute-stream op before them (-1: none)
  std::int32_t before = -1;       // the compute-stream op after them, which waits for all of them (-1: none)
  std::vector<std::int32_t> ops;  // indices into the stage's ops, in the order the framework issues them
};
// Every exchange of a stage's op list, in list order.
std::vector<PipelineExchange> pipeline_exchanges(const Scenario& scenario, const std::vector<Op>& ops, int stage);

// The TrainSchedule step (deepspeed/runtime/pipe/schedule.py) in which `stage` of `stages` issues pipeline op `p2p`:
// the forward of micro-batch k runs at step 2k + stage, its backward at step 2k + 2 stages - 1 - stage; a receive
// belongs to the step of the pass that consumes it, a send to the step after the pass that produced it.
std::int64_t deepspeed_step(const Op& p2p, int stage, int stages);

// One Send/Recv pair of the Program as the framework performs it: what crosses the link, in how many calls, and what
// the receiver does before the tensor is usable.
struct PipelineTransfer {
  double wire_bytes = 0;    // per rank, over the link between the two stages
  int messages = 1;         // NCCL calls, each paying the point-to-point latency
  int receipt_gathers = 0;  // all-gathers of `full_bytes` the receiver runs across its TP group (NVLink)
  double full_bytes = 0;    // the tensor's full size per rank (Op::bytes)
  // The receiver's copies around that gather, through HBM on its compute stream (DeepSpeed's
  // PartitionedTensor.full(): zero-fill, the list all-gather's copy-out, a clone).
  double receipt_copy_bytes = 0;
  int receipt_copy_kernels = 0;
};
PipelineTransfer pipeline_transfer(const Scenario& scenario, const Op& p2p);

}  // namespace twin::model
