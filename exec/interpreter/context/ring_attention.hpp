// Context parallelism, the p2p ring (framework.cp_comm = "p2p"; model/ops/context_parallel_ring.hpp has the messages
// and why): each CP rank attends its queries to one K/V block per step while the next block arrives from CP rank - 1
// (ring_attention.cpp says how).
#pragma once

#include <map>

#include "exec/interpreter/context/context_attention.hpp"

namespace twin::exec {

class RingAttention final : public ContextAttention {
 public:
  explicit RingAttention(RankContext& ctx) : ctx_(ctx) {}
  void forward(const model::Op& op) override;   // one block: its ring step's
  void backward(const model::Op& op) override;  // one block, or (step cp) the return of this rank's dK/dV
  void exchange(const model::Op& op) override;  // a Send or Recv over the Context group
  void drop_forward(const StashKey& key) override { layers_.erase(key); }
  void begin_iteration() override { layers_.clear(); }
  void release(int micro_batch, int chunk) override;

 private:
  // One layer's ring, from step to step.
  struct Ring {
    Tensor kv, kv_next;  // the K/V block this step computes on, the one arriving for the next
    // The backward: dq summed over the steps, this rank's own block's dK/dV (step 0), the travelling accumulator of
    // the block held last (sent on), the one received with it, rowsum(dout * out)
    Tensor dq, own_dkv, acc, acc_in, delta;
  };
  void send(const model::Op& op, Ring& r);          // a ring message to CP rank + 1: K/V, dK/dV or both
  void recv(const model::Op& op, Ring& r);          // ... from CP rank - 1
  void return_grads(const model::Op& op, Ring& r);  // the owner's add of its block's returned dK/dV
  int peer_rank(const model::Op& op) const;

  RankContext& ctx_;
  std::map<StashKey, Ring> layers_;
};

}  // namespace twin::exec
