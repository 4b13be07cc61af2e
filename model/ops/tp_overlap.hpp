// framework.tp_comm_overlap (Megatron's LinearWithGradAccumulationAndAsyncCommunication): in the backward pass, the
// input-gradient all-reduce (reduce-scatter with sequence parallelism) of a column-parallel GEMM runs under its
// weight-gradient GEMM, and the sequence-parallel all-gather of its input under its input-gradient GEMM.
#pragma once

#include <cstdint>

#include "model/ops/op.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// The half of the backward GEMM (of the op `collective.what`) a TP collective of the backward pass runs beside.
enum class HiddenUnder : std::uint8_t { Nothing, WeightGradient, InputGradient };
HiddenUnder tp_overlap(const Scenario& scenario, const Op& collective);

}  // namespace twin::model
