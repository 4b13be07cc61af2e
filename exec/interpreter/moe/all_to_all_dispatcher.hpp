// The all-to-all token dispatcher (Megatron-Core's MoEAlltoAllTokenDispatcher): the rows travel by all-to-all over
// the Expert group, and (parallel.etp > 1) by all-gather / reduce-scatter over ExpertTensor; all_to_all_dispatcher.cpp
// says how.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "exec/interpreter/moe/token_dispatcher.hpp"

namespace twin::exec {

class AllToAllDispatcher final : public TokenDispatcher {
 public:
  explicit AllToAllDispatcher(RankContext& ctx) : ctx_(ctx) {}
  void exchange(const model::Op& op, MoeStash& m) override;
  void release(const StashKey& key) override { splits_.erase(key); }
  void clear() override { splits_.clear(); }

 private:
  // The split sizes one layer's dispatch agreed on, read again by its combine and by both gradients' ways.
  struct Splits {
    std::vector<std::size_t> send_rows;  // (ep) rows sent to each EP peer in the dispatch
    std::vector<std::size_t> recv_rows;  // (ep) rows received from each
    std::vector<int> recv_chunk_rows;    // (ep, El) rows from peer i for local expert e, in the received order
    std::vector<int> etp_chunk_rows;     // (etp, El) rows of each (ETP peer, local expert) before the ETP gather
    std::vector<std::size_t> etp_rows;   // (etp) each ETP peer's rows
    std::size_t own_rows = 0;            // this rank's rows before the ETP gather
  };
  void dispatch(const model::Op& op, MoeStash& m, Splits& s, bool gradients);      // all-to-all over Expert
  void combine(const model::Op& op, MoeStash& m, Splits& s, bool gradients);       // ... its inverse
  void gather_rows(const model::Op& op, MoeStash& m, Splits& s, bool gradients);   // all-gather over ExpertTensor
  void scatter_rows(const model::Op& op, MoeStash& m, Splits& s, bool gradients);  // reduce-scatter over it
  void probabilities(const model::Op& op, const MoeStash& m, const Splits& s, bool gradients);  // beside dispatch

  RankContext& ctx_;
  std::map<StashKey, Splits> splits_;
};

}  // namespace twin::exec
