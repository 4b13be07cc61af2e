// The memory model under context parallelism and FP8 (model/program/estimates.hpp), in closed form against Korthikanti et
// al.'s per-layer activations: CP keeps 1/cp of every stashed tensor, FP8 keeps its GEMM inputs in one byte and a
// weight's FP8 copies.
#include <gtest/gtest.h>

#include "model/program/estimates.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {
namespace {

Scenario llama(std::int64_t cp, std::int64_t seq) {
  Scenario s;
  s.model.layers = 8;
  s.model.hidden = 1024;
  s.model.heads = 8;
  s.model.kv_heads = 2;
  s.model.ffn_hidden = 2816;
  s.model.seq_len = seq;
  s.model.vocab = 32000;
  s.model.norm = Norm::RmsNorm;
  s.model.activation = Activation::Swiglu;
  s.model.position_embedding = PositionEmbedding::Rope;
  s.model.linear_bias = false;
  s.parallel.tp = 2;
  s.parallel.cp = cp;
  s.parallel.pp = 2;
  s.parallel.sequence_parallel = true;
  s.parallel.global_batch = 8;
  s.cluster.node = NodeKind::DgxH100;
  s.cluster.gpus_per_node = 8;
  s.parallel.dp = 8 / (2 * 2 * cp);
  s.framework.attention = AttentionKind::Flash2;
  s.framework.dropout = false;
  return s;
}

TEST(MemoryHopper, ContextParallelKeepsItsShareOfTheTokens) {
  const Scenario one = llama(1, 4096), two = llama(2, 4096);
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(two), activation_bytes_per_layer(one) / 2);
  // The same per-rank activations as a sequence of seq / cp without CP.
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(two), activation_bytes_per_layer(llama(1, 2048)));
}

TEST(MemoryHopper, Fp8KeepsGemmInputsInOneByteAndCopiesTheWeights) {
  Scenario bf16 = llama(1, 4096), fp8 = bf16;
  fp8.model.fp8 = Fp8Format::Hybrid;
  fp8.framework.transformer_engine = true;  // FP8 runs through TE's modules
  const double sbh = 4096.0 * 1 * 1024, t = 2, f = 2816, h = 1024;
  // Korthikanti's per-element terms (sequence parallel: all over t): QKV and MLP-up inputs, projection input and
  // MLP-down input halve: (1 + 1) + (1 + f / h).
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(bf16) - activation_bytes_per_layer(fp8), sbh * (2 + 1 + f / h) / t);
  const MemoryEstimate b = estimate_memory(bf16), e = estimate_memory(fp8);
  const double gemm_weights = (h * (h + 2 * 2 * 128) + h * h + h * 2 * f + f * h) / t;            // per layer and GPU
  EXPECT_DOUBLE_EQ(e.stages[0].weights_bytes - b.stages[0].weights_bytes, 2 * 4 * gemm_weights);  // 4 layers
  EXPECT_LT(e.stages[0].activations_bytes, b.stages[0].activations_bytes);
}

TEST(MemoryHopper, NoDropoutKeepsNoMasks) {
  Scenario with = llama(1, 4096), without = with;
  with.framework.dropout = true;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(with) - activation_bytes_per_layer(without), 2 * 4096.0 * 1024 / 2);
}

}  // namespace
}  // namespace twin::model
