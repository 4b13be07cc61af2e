// Pipeline schedules as plain data: for every stage, the ordered list of (micro-batch, chunk, forward|backward).
//
//   GPipe            all forwards, then all backwards.
//   1F1B             Megatron's PipeDream-Flush: warmup = min(p - stage - 1, m) forwards, then one forward / one
//                    backward pairs, then the remaining backwards.
//   interleaved 1F1B Megatron's schedule with v model chunks per stage: micro-batches go in groups of p, chunk
//                    order 0..v-1 forward and v-1..0 backward; warmup = (p - stage - 1) * 2 + (v - 1) * p, capped at
//                    m * v (all warmup when m == p).
#pragma once

#include <cstdint>
#include <vector>

#include "model/scenario.hpp"

namespace twin::model {

enum class Pass : std::uint8_t { Forward, Backward };

struct PipelineStep {
  int micro_batch = 0;
  int chunk = 0;  // model chunk on this stage, 0..v-1
  Pass pass = Pass::Forward;
  bool operator==(const PipelineStep&) const = default;
};

using StageSchedule = std::vector<PipelineStep>;

// One StageSchedule per stage. Requires stages >= 1, micro_batches >= 1, chunks >= 1 (chunks > 1 only for
// Interleaved, which also requires micro_batches % stages == 0); throws std::invalid_argument otherwise.
std::vector<StageSchedule> build_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks);

// Number of forward steps a stage runs before its first backward.
int warmup_steps(ScheduleKind kind, int stage, int stages, int micro_batches, int chunks);

// The most (micro-batch, chunk) pairs whose forward has run and backward has not, at any point of the schedule:
// how many chunks' activations the stage stashes at its peak.
int max_in_flight(const StageSchedule& schedule);

// Virtual stage of a chunk on a stage: chunk * stages + stage. Layers are assigned to virtual stages in order.
inline int virtual_stage(int stage, int chunk, int stages) { return chunk * stages + stage; }

}  // namespace twin::model
