// The optimizer's part of the op list: the gradient reductions (TP-replicated parameters, the tied embedding,
// DualPipe's two copies, DP / ZeRO-1 / ZeRO-3), the global gradient norm, the AdamW step and the parameter gathers
// (ZeRO-1 after the step, ZeRO-3 before each layer). It owns what passes between them within an iteration (the squared
// norm); the parameters, gradients and Adam state are the shard's (exec/shard/model_shard.hpp). optimizer.cpp says how.
#pragma once

#include "exec/interpreter/rank_context.hpp"

namespace twin::exec {

class Optimizer {
 public:
  explicit Optimizer(RankContext& ctx) : ctx_(ctx) {}

  void reduce_layernorm_grads(const model::Op& op);      // LayerNormGrads
  void reduce_embedding_grads(const model::Op& op);      // EmbeddingGrads
  void reduce_data_parallel_grads(const model::Op& op);  // Gradients
  void gradient_norm(const model::Op& op);               // GradNormSquared
  void step(const model::Op& op);                        // OptimizerStep
  void gather_parameters(const model::Op& op);           // Parameters
  double learning_rate(int iteration) const;             // of iteration `iteration` (0-based)

 private:
  void sum_mirror_grads();  // DualPipe: the stage's gradients summed with its mirror stage's copy
  RankContext& ctx_;
  double grad_norm_squared_ = 0;  // the world's, from gradient_norm to step
};

}  // namespace twin::exec
