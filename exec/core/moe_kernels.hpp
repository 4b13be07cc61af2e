// MoeKernels: the Mixture-of-Experts kernels a backend may provide (Backend::moe()), apart from the dense core that
// every device implements. A backend without them trains no MoE model: check_supported (exec/train/check_supported.hpp)
// refuses such a Program by name before training. As Backend, the public methods check shapes (moe_kernels.cpp) and
// call the protected do_ kernels.
#pragma once

#include <vector>

#include "exec/core/kernel_hook.hpp"
#include "exec/core/tensor.hpp"

namespace twin::exec {

// The load-balancing loss's gradient in an MoE router's backward (kernels/cpu/moe.hpp, moe_aux_loss_backward):
// total_tokens of the micro-batch, the loss coefficient (0: no loss), the loss's own gradient (1 / micro-batches).
struct MoeAuxLoss {
  double total_tokens = 1, coeff = 0, loss_grad = 0;
};

class MoeKernels : public HookPoint {
 public:
  virtual ~MoeKernels() = default;

  // --- Mixture-of-Experts (kernels/cpu/moe.hpp) ---------------------------------------------------------------------
  // T tokens, E experts, k = top_k, C = hidden. Router logits, token rows and their gradients in activation_dtype();
  // probs, scores and their gradients fp32; chosen experts and row maps int32 tensors. The integer bookkeeping
  // (permutation rows, tokens per expert, split sizes) runs on the host from the downloaded chosen experts: the one
  // host wait per layer Megatron-Core also pays (model/ops/moe_host_sync.hpp). Counts, chunk sizes and rows per local
  // probs (T, k) fp32, chosen (T, k) int32 <- logits (T, E): the top k (ties: the lower expert), softmax over them
  void moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                int experts, int top_k);
  // scores (T, E) fp32 <- softmax of each row of logits over every expert (the load-balancing loss's)
  void moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts);
  // The load-balancing loss of this rank's tokens (moe_aux_loss_forward), to the host; counts (E) of the micro-batch
  double moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                              int top_k, double total_tokens, double coeff);
  // dlogits (T, E) OVERWRITTEN <- the top-k softmax's backward, plus (aux.coeff > 0) the load-balancing loss's gradient
  // from scores (T, E) and counts (E), scaled by aux.loss_grad
  void moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs, const Tensor& chosen,
                           const Tensor& scores, const std::vector<float>& counts, int tokens, int experts, int top_k,
                           const MoeAuxLoss& aux);
  // out (T k, C): out[rows[t, j]] = inp[t] (inp (T, C), rows (T, k) int32);  the backward sums in slot order
  void moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden, int top_k);
  void moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens, int hidden,
                            int top_k);
  // out (T, C) = sum_j probs[t, j] inp[rows[t, j]];  backward: dinp (T k, C), dprobs (T, k) fp32, both OVERWRITTEN
  void moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows, int tokens,
                             int hidden, int top_k);
  void moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout, const Tensor& inp,
                              const Tensor& probs, const Tensor& rows, int tokens, int hidden, int top_k);
  // out's chunk i = inp's chunk order[i], chunk c of chunk_rows[c] rows (hidden wide); the backward is the inverse
  void moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                               const std::vector<int>& order, int hidden);
  void moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                const std::vector<int>& order, int hidden);
  // One GEMM per group (local expert) on its consecutive rows, groups with no rows skipped: out (rows, out_f) =
  // inp (rows, in_f) @ weights[g]^T, weights (groups, out_f, in_f); rows = sum of rows_per_group (host), out and inp
  // may be longer. The backward: dinp OVERWRITTEN (empty: skipped), dweights (groups, out_f, in_f) fp32 ACCUMULATED.
  void moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                  const std::vector<int>& rows_per_group, int in_features, int out_features);
  void moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout, const Tensor& inp,
                                   const Tensor& weights, const std::vector<int>& rows_per_group, int in_features,
                                   int out_features);

 protected:
  virtual void do_moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                           int experts, int top_k) = 0;
  virtual void do_moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) = 0;
  virtual double do_moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens,
                                         int experts, int top_k, double total_tokens, double coeff) = 0;
  virtual void do_moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                      const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                      int tokens, int experts, int top_k, const MoeAuxLoss& aux) = 0;
  virtual void do_moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                                      int top_k) = 0;
  virtual void do_moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                       int hidden, int top_k) = 0;
  virtual void do_moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                        int tokens, int hidden, int top_k) = 0;
  virtual void do_moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout,
                                         const Tensor& inp, const Tensor& probs, const Tensor& rows, int tokens,
                                         int hidden, int top_k) = 0;
  virtual void do_moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                          const std::vector<int>& order, int hidden) = 0;
  virtual void do_moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                           const std::vector<int>& order, int hidden) = 0;
  virtual void do_moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                             const std::vector<int>& rows_per_group, int in_features,
                                             int out_features) = 0;
  virtual void do_moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                              const Tensor& inp, const Tensor& weights,
                                              const std::vector<int>& rows_per_group, int in_features,
                                              int out_features) = 0;
};

}  // namespace twin::exec
