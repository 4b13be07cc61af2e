// Context parallelism, the a2a way (framework.cp_comm = "a2a", DeepSpeed-Ulysses): all-to-alls over the Context group
// trade the rank's two chunks of every sequence for the whole sequence of 1 / cp of its heads around the attention
// core, and back (ulysses_attention.cpp says how).
#pragma once

#include <map>

#include "exec/interpreter/context/context_attention.hpp"

namespace twin::exec {

class UlyssesAttention final : public ContextAttention {
 public:
  explicit UlyssesAttention(RankContext& ctx) : ctx_(ctx) {}
  void forward(const model::Op& op) override;
  void backward(const model::Op& op) override;
  void exchange(const model::Op& op) override;  // the Ulysses* payloads
  void drop_forward(const StashKey& key) override;
  void begin_iteration() override { layers_.clear(); }
  void release(int micro_batch, int chunk) override;

 private:
  // One layer's head-group tensors over the whole sequence, (B, seq, ...).
  struct HeadGroup {
    Tensor qkv, out;    // the forward's: kept for the backward unless the layer recomputes
    Tensor dout, dqkv;  // the backward's
  };
  // Where a payload's tensor lies: its heads and first column in this rank's packed qkv (or output) row, and in the
  // head group's packed row.
  struct Section {
    int heads;         // of this TP rank, in the range
    int column;        // the range's first element in the rank's packed row
    int group_column;  // ... in the head group's packed row
  };
  Section section(model::Payload payload) const;
  int qkv_width() const;     // of the head group's packed qkv row
  int whole_tokens() const;  // the rows of a head group's tensors: the whole sequences of the micro-batch
  void all_to_all(const model::Op& op, const Tensor& send, const Tensor& recv);
  void to_heads(const model::Op& op, const Tensor& local, int local_width, const Tensor& full, int full_width);
  void to_tokens(const model::Op& op, const Tensor& full, int full_width, const Tensor& local, int local_width);
  void qkv_to_heads(const model::Op& op, HeadGroup& h);          // UlyssesQueries, UlyssesKeys, UlyssesValues
  void output_to_tokens(const model::Op& op, HeadGroup& h);      // UlyssesOutput
  void output_grad_to_heads(const model::Op& op, HeadGroup& h);  // UlyssesOutputGrad
  void grads_to_tokens(const model::Op& op, HeadGroup& h);       // UlyssesQueryGrads, UlyssesKeyGrads, ...ValueGrads

  RankContext& ctx_;
  std::map<StashKey, HeadGroup> layers_;
};

}  // namespace twin::exec
