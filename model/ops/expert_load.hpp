// What model.expert_load_skew does to a plan: a question the CLI asks before it prints a prediction.
#pragma once

#include "model/scenario/scenario.hpp"

namespace twin::model {

// Whether model.expert_load_skew > 0 leaves the prediction where balanced routing puts it because
// model.capacity_factor caps it: Megatron-Core drops the tokens an expert receives beyond its capacity
// (--moe-expert-capacity-factor, moe_utils.py's token drop), so the hottest EP rank, whose rows set every member's pace
// (moe_ops.hpp), receives no more rows than with skew 0. False without skew or without a capacity factor.
bool expert_load_skew_capped(const Scenario& s);

}  // namespace twin::model
