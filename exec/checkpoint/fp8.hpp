// FP8 delayed scaling's state in a checkpoint (framework.fp8_recipe = "delayed"): each rank writes
// DIR/step-NNNNNNNN/fp8-rank-RRRRR.bin beside its shard, atomically as the shards are written, holding every FP8 GEMM
// of its layers' scales and amax histories (Fp8State::saved); the manifest lists the files under fp8_states with
// their sizes and checksums. Resuming puts them back, so that the resumed run quantizes with the scales the
// uninterrupted one would have: bit for bit. Every rank of an amax reduction group (TP x DP x CP) holds the same
// state for a layer, so under another plan each layer's state is read from the first rank of its old stage.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/interpreter/fp8_state.hpp"
#include "exec/shard/model_shard.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::exec {

std::string fp8_state_file_name(int rank);

// Writes this rank's delayed-scaling state into `step_dir` atomically; returns its record (size and checksum).
ShardRecord write_fp8_state(const std::filesystem::path& step_dir, int rank, int world_size, int step,
                            const std::vector<Fp8TensorScales>& scales, const std::string& kill_writing = {});

// This rank's state, from a checkpoint of the same plan. RunError naming the manifest when it has no fp8_states (a
// checkpoint of an older twin, which did not keep them), or naming the file when it is missing, truncated, corrupt or
// another rank's.
std::vector<Fp8TensorScales> read_fp8_state(const std::filesystem::path& step_dir, const Manifest& manifest, int rank);

// The state of every layer `shard` holds, from a checkpoint written under the plan of `then`: each from the first
// rank (tp, cp and dp 0) of the old stage that held the layer. The same errors as read_fp8_state.
std::vector<Fp8TensorScales> read_fp8_state_resharded(const std::filesystem::path& step_dir, const Manifest& manifest,
                                                      const model::Scenario& then, const ModelShard& shard);

}  // namespace twin::exec
