// Pipeline schedules as plain data: for every stage, the ordered list of (micro-batch, chunk, forward|backward).
//
//   GPipe            all forwards, then all backwards.
//   1F1B             Megatron's PipeDream-Flush: warmup = min(p - stage - 1, m) forwards, then one forward / one
//                    backward pairs, then the remaining backwards.
//   interleaved 1F1B Megatron's schedule with v model chunks per stage: micro-batches go in groups of p, chunk
//                    order 0..v-1 forward and v-1..0 backward; warmup = (p - stage - 1) * 2 + (v - 1) * p, capped at
//                    m * v (all warmup when m == p).
//     with groups    of N micro-batches instead of p (Megatron-Core's --microbatch-group-size-per-virtual-pipeline-
//                    stage; the flexible N of the Llama 3 paper, arXiv:2407.21783, section 3.3.2 and Figure 6): each
//                    group of N runs through chunk 0, then chunk 1, ..., the last group holding what is left; warmup
//                    = (p - stage - 1) * 2 + (v - 1) * N, capped at m * v (schedules.py get_schedule_table and
//                    get_pp_rank_microbatches). So m need not be a multiple of p: any m works with N = m.
//   ZB-H1            Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024): 1F1B with each backward split into B
//                    and W, stage s deferring its W by s steps into the cooldown.
//   ZB-V             the same paper's V schedule, two chunks per stage placed in a V (ParallelSpec::virtual_stage):
//                    chunk 0 forward 2(p - s) - 1 times, then s pairs (chunk 1, chunk 0), then p - s of (F1, B1, W1),
//                    then (F0, B0, W0, F1, B1, W1) until the forwards are done, the cooldown s pairs (B0, B1) and
//                    p - s (B0, W0), then the deferred W. The authors' handcrafted_zb_v (sail-sg/zero-bubble-
//                    pipeline-parallelism at 106e470, get_zb_v_schedule), for m < 2p - 1 with the missing
//                    micro-batches' steps dropped as it does. Same peak of activations as 1F1B: 2p chunks of half a
//                    stage each on every stage.
//   DualPipeV        DeepSeek's V (deepseek-ai/DualPipe at 3da1bbe, dualpipev.py, DualPipeV.step), on the same V,
//                    m >= 2p: 2(p - s - 1) F0, s + 1 (F0, F1), p - s - 1 (B1, W, F1), m - 2p + s + 1 of the main step
//                    (F0 with B1, F1 with B0: the overlapped pairs), p - s - 1 (B1, F1 with B0), s + 1 (B1, B0), p - s - 1
//                    (W, B0), s + 1 W. Steps 4 and 5 overlap each forward with the backward after it (PipelineStep::
//                    overlapped), but for the last stage's first pair, which dualpipev.py runs apart. Its backwards are whole (B then its W at once) except where it enables
//                    zero bubble: step 3's, the second half of step 6's and step 7's, whose W wait in a queue that each
//                    lone W takes the oldest of. 2p + 1 chunks' activations at the peak (its table's PP + 1).
//   DualPipe         DeepSeek-V3's bidirectional schedule (deepseek-ai/DualPipe at 3da1bbe, dualpipe.py,
//                    DualPipe.step), p even, m even and >= 2p: the first m / 2 micro-batches go down through chunk 0
//                    of stages 0..p-1, the others up through chunk 1 of stages p-1..0 (ParallelSpec::bidirectional).
//                    Stage s runs DualPipeV's eight steps as its stage min(s, p-1-s) of p / 2 with m / 2
//                    micro-batches, its "chunk 0" the direction entering at its own end (dualpipe.py's phases and
//                    half_rank): DualPipeV is DualPipe cut in half, and DualPipe's two halves mirror each other.
//                    p + 1 chunks' activations at the peak (its table's PP + 1), each chunk a block (1 / p) of the
//                    model.
//   extra_warmup     forwards added to the warmup of 1F1B and interleaved 1F1B (capped like it): Megatron-Core's
//                    combined 1F1B (framework.moe_a2a_overlap) runs one more, so that the forward and backward it
//                    merges in each steady step are independent (schedules.py get_pp_rank_microbatches at
//                    b0cc2706; combined_1f1b_schedule_for_no_pipelining runs micro-batch 0's forward alone).
#pragma once

#include <cstdint>
#include <vector>

#include "model/scenario/scenario.hpp"

namespace twin::model {

// Backward: the whole backward, or under a schedule that splits it (splits_backward) its B, the input gradient;
// WeightGrad: W, the weight gradients it deferred.
enum class Pass : std::uint8_t { Forward, Backward, WeightGrad };

// Whether `kind` splits each backward into B and W steps (the zero-bubble schedules).
inline bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleV || kind == ScheduleKind::DualPipeV ||
         kind == ScheduleKind::DualPipe;
}

struct PipelineStep {
  int micro_batch = 0;
  int chunk = 0;  // model chunk on this stage, 0..v-1
  Pass pass = Pass::Forward;
  // A forward that runs merged with the backward step after it, layer by layer, so that each one's all-to-alls run
  // under the other's compute (DualPipeV's F&B pairs; the stage builder merges them as the combined 1F1B does).
  bool overlapped = false;
  bool operator==(const PipelineStep&) const = default;
};

using StageSchedule = std::vector<PipelineStep>;

// One StageSchedule per stage. Requires stages >= 1, micro_batches >= 1, chunks >= 1 (chunks > 1 only for
// Interleaved). `group` (Interleaved only): micro-batches per group, 1 <= group <= micro_batches; 0: groups of
// `stages`, which requires micro_batches % stages == 0. Throws std::invalid_argument otherwise.
std::vector<StageSchedule> build_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks, int group = 0,
                                          int extra_warmup = 0);

// Number of forward steps a stage runs before its first backward.
int warmup_steps(ScheduleKind kind, int stage, int stages, int micro_batches, int chunks, int group = 0,
                 int extra_warmup = 0);

// Megatron-Core's rule for a group size it runs without "dependency bubbles": stages <= group <= micro_batches and
// micro_batches % group either 0 or at least `stages` (schedules.py raises otherwise). Other groups (fewer
// micro-batches than stages, as Llama 3 allows) run every forward first: in Megatron-Core's order a stage would wait
// forever on one of them.
bool group_without_dependency_bubbles(int stages, int micro_batches, int group);

// The schedule a scenario's plan runs: parallel.schedule, pp, micro-batches, virtual stages and micro-batch group.
std::vector<StageSchedule> build_schedule(const ParallelSpec& parallel, int extra_warmup = 0);

// The schedule's bubble with every pass of equal time, idle over busy plus idle: (p - 1) / (v m + p - 1) for GPipe,
// 1F1B and the interleaved schedule (v chunks), and for ZB-H1 with F = B = W (Qi et al.: (p - 1)(F + B - W) idle
// against m (F + B + W) busy) (p - 1) / (3 m + p - 1); for ZB-V with m >= 2p - 1, in a chunk's (half a stage's)
// times F, B, W, (p - 1)(F + B - W) idle against 2 m (F + B + W) busy: (p - 1) / (6 m + p - 1), the least a V can
// idle when every stage ends the iteration together (its last stage's first forward waits p - 1 chunk forwards; the
// paper's zero needs its optimizer post-validation, which lets a stage start the next iteration early); DualPipeV's
// too (replay_test.cpp: with equal times it idles the V's start alone, half its table's (p - 1)(F&B + B - 3W));
// DualPipe's, in a chunk's (a block's) times, idles (p/2 - 1) F against m (F + B + W) busy:
// (p/2 - 1) / (3 m + p/2 - 1), half its table's (p/2 - 1)(F&B + B - 3W) with F&B = F + B + W and B a whole backward
// (replay_test.cpp). What `twin search` orders its plans by before simulating.
double ideal_bubble_fraction(const ParallelSpec& parallel);

// The most (micro-batch, chunk) pairs whose forward has run and backward has not, at any point of the schedule:
// how many chunks' activations the stage stashes at its peak.
int max_in_flight(const StageSchedule& schedule);
// The most micro-batches whose B has run and W has not (their W inputs kept), at any point of the schedule.
int max_deferred_weight_grads(const StageSchedule& schedule);
// The same, each micro-batch's pending W counted with its chunk's weight (its W inputs' bytes): their peak.
double max_deferred_weight_grads_weighted(const StageSchedule& schedule, const std::vector<double>& chunk_weight);
// The same, each pair counted with its chunk's weight (its layers, when chunks differ): the most layers' activations
// the stage stashes at once.
std::int64_t max_in_flight_weighted(const StageSchedule& schedule, const std::vector<std::int64_t>& chunk_weight);
// The same where some forwards run merged, layer by layer, with the backward after them (`merged[i]`: step i, a
// forward, and step i + 1, a backward, as Megatron-Core's combined 1F1B runs them: forward layer j beside backward
// layer n - 1 - j, so the forward's layers stash as the backward's free theirs). A merged pair peaks at what its
// forward adds beyond what its backward frees, plus the one layer both hold at once; the weights are layers.
std::int64_t max_in_flight_weighted(const StageSchedule& schedule, const std::vector<std::int64_t>& chunk_weight,
                                    const std::vector<bool>& merged);


}  // namespace twin::model
