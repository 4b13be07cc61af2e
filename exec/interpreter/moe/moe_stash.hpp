// A Mixture-of-Experts MLP's state for one (micro-batch, chunk, layer), forward to backward: what the router chose,
// the permutation, the experts' rows. T = tokens_sp, k = top_k, E = experts, R = the rows this rank's experts received
// (data-dependent), El = local experts. The token dispatcher keeps its split sizes apart (token_dispatcher.hpp).
#pragma once

#include <vector>

#include "exec/core/tensor.hpp"

namespace twin::exec {

struct MoeStash {
  Tensor scores;                        // (T, E) softmax of the router logits: the load-balancing loss's
  Tensor probs;                         // (T, k) the chosen experts' weights
  std::vector<int> chosen;              // (T, k) expert of each (token, slot), on the host
  Tensor chosen_map;                    // (T, k) int32: the same on the backend (the router's backward reads it)
  std::vector<int> rows;                // (T, k) row of each (token, slot) in the expert-major permuted buffer
  Tensor row_map;                       // (T, k) int32: the same on the backend (permute, unpermute)
  std::vector<int> rows_per_expert;     // (E) of the permuted buffer
  std::vector<float> counts;            // (E) tokens per expert of the whole micro-batch (summed over TP shards)
  std::vector<int> expert_rows;         // (El) rows of each local expert the GEMMs see: the dispatch's result
                                        // (summed over EP peers, then ETP peers)
  Tensor permuted;                      // (T k, C) rows in expert-major order (before the dispatch)
  Tensor expert_in;                     // (R, C) the local experts' input, expert-major
  Tensor expert_fc;                     // (R, F_up) before the activation
  Tensor expert_act;                    // (R, F)
  Tensor expert_out;                    // (R, C) before the combine
  Tensor combined;                      // (T k, C) the experts' outputs back in permuted order
  Tensor shared_fc, shared_act;         // (T, S_up), (T, S) the shared experts'
  Tensor d_rows;                        // backward: the gradient in flight along the expert path
  Tensor d_probs;                       // (T, k)
  bool routed_activation_next = false;  // the next activation op is the routed experts' (else the shared ones')
};

}  // namespace twin::exec
