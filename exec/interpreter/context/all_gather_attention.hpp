// Context parallelism, the all_gather way (framework.cp_comm = "all_gather"): the keys and values of the whole
// sequence are all-gathered around each attention core, and their gradients reduce-scattered back to their ranks
// (all_gather_attention.cpp says how).
#pragma once

#include <map>

#include "exec/interpreter/context/context_attention.hpp"

namespace twin::exec {

class AllGatherAttention final : public ContextAttention {
 public:
  explicit AllGatherAttention(RankContext& ctx) : ctx_(ctx) {}
  void forward(const model::Op& op) override;
  void backward(const model::Op& op) override;
  void exchange(const model::Op& op) override;  // ContextKeys, ContextValues, ContextKeyGrads, ContextValueGrads
  void drop_forward(const StashKey& key) override { layers_.erase(key); }
  void begin_iteration() override { layers_.clear(); }
  void release(int micro_batch, int chunk) override;

 private:
  // One layer's gathered keys and values, for one attention forward or backward (not kept past it), and the backward's
  // gradients of them.
  struct Gathered {
    Tensor keys, values;      // every CP rank's (cp, tokens, KV/t D)
    Tensor values_local;      // this rank's values, between the keys' all-gather and the values'
    Tensor d_keys, d_values;  // this rank's share of every CP rank's dK, dV (cp, tokens, KV/t D)
  };
  void gather_keys(const model::Op& op, Gathered& g);
  void gather_values(const model::Op& op, Gathered& g);
  void scatter_grads(const model::Op& op, Gathered& g, bool values);

  RankContext& ctx_;
  std::map<StashKey, Gathered> layers_;
};

}  // namespace twin::exec
