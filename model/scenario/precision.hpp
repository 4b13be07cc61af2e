// FP8 training as Megatron-Core runs it through Transformer Engine: which format (model.fp8, --fp8-format) and which
// scaling recipe (framework.fp8_recipe, --fp8-recipe; megatron/core/transformer/transformer_config.py):
//   none     16-bit GEMMs (bf16 / fp16): no FP8
//   hybrid   E4M3 for activations and weights, E5M2 for the gradients of the output (TE's Format.HYBRID)
//   e4m3     E4M3 everywhere
// and the recipes (TE transformer_engine/common/recipe/__init__.py):
//   delayed     per-tensor scales from earlier steps' amaxes (DelayedScaling): one all-reduce (max) of the amaxes
//               over the amax reduction group (TP x DP x CP: parallel_state.get_amax_reduction_group) per forward
//               and per backward of a micro-batch
//   tensorwise  per-tensor scales from the tensor itself (Float8CurrentScaling): an amax pass before each cast
//   blockwise   1 x 128 tiles of activations and gradients, 128 x 128 blocks of weights (Float8BlockScaling; Hopper)
//   mxfp8       32-element blocks with E8M0 scales (MXFP8BlockScaling; Blackwell's tensor cores scale them natively)
// What runs in FP8 (Megatron-Core with TE): the four GEMMs of every transformer layer (QKV, attention projection, MLP
// up and down) in their forward (fprop), input-gradient (dgrad) and weight-gradient (wgrad) passes; the attention
// core, the LM head, the embedding and every elementwise kernel stay in the 16-bit dtype (fp8_dot_product_attention
// and fp8_output_proj off, their defaults).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace twin::model {

enum class Fp8Format : std::uint8_t { None, Hybrid, E4M3 };
enum class Fp8Recipe : std::uint8_t { Delayed, Tensorwise, Blockwise, Mxfp8 };

std::string_view to_string(Fp8Format format);  // "none", "hybrid", "e4m3"
std::string_view to_string(Fp8Recipe recipe);  // "delayed", "tensorwise", "blockwise", "mxfp8"
std::optional<Fp8Format> fp8_format_from_name(std::string_view name);
std::optional<Fp8Recipe> fp8_recipe_from_name(std::string_view name);

// The element format of a GEMM operand: the output's gradient (what the backward GEMMs read besides the saved
// input and the weight) is E5M2 under hybrid, every other operand E4M3.
enum class Fp8Element : std::uint8_t { E4M3, E5M2 };
Fp8Element fp8_element(Fp8Format format, bool output_gradient);

// Whether the recipe needs an amax all-reduce per forward and backward region (delayed scaling only: the others
// scale from the tensor at hand, per tensor or per block).
bool fp8_recipe_reduces_amax(Fp8Recipe recipe);

// Scale bytes per FP8 element a recipe keeps beside the data: one fp32 per 128 elements (blockwise 1 x 128), one
// E8M0 byte per 32 (mxfp8), nothing worth counting per tensor.
double fp8_scale_bytes_per_element(Fp8Recipe recipe);

}  // namespace twin::model
