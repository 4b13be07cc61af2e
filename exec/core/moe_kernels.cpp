// The Backend's Mixture-of-Experts methods: the shapes every backend's kernels need, checked once, then the kernel.
// The rows a permuted buffer must hold depend on the row map's contents (drops leave rows out): a backend that can
// read the map checks it (exec/cpu/cpu_moe.cpp), the others check their own bound.
#include <numeric>

#include "exec/core/check.hpp"
#include "exec/core/moe_kernels.hpp"
#include "exec/core/sizes.hpp"

namespace twin::exec {

namespace {

std::size_t total_rows(const std::vector<int>& rows) {
  return static_cast<std::size_t>(std::accumulate(rows.begin(), rows.end(), 0));
}

}  // namespace

void MoeKernels::moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                          int experts, int top_k) {
  TWIN_EXEC_CHECK(
      probs.numel == numel(tokens, top_k) && chosen.numel == probs.numel && logits.numel == numel(tokens, experts),
      "moe_topk_softmax_forward: probs {} chosen {} logits {} for T {} E {} k {}", probs.numel, chosen.numel,
      logits.numel, tokens, experts, top_k);
  before_kernel("moe_topk_softmax_forward", {{probs, "probs"}, {chosen, "chosen"}, {logits, "logits"}});
  do_moe_topk_softmax_forward(probs, chosen, logits, tokens, experts, top_k);
}

void MoeKernels::moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) {
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && logits.numel == scores.numel,
                  "moe_router_scores_forward: scores {} logits {} for T {} E {}", scores.numel, logits.numel, tokens,
                  experts);
  before_kernel("moe_router_scores_forward", {{scores, "scores"}, {logits, "logits"}});
  do_moe_router_scores_forward(scores, logits, tokens, experts);
}

double MoeKernels::moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                                        int top_k, double total_tokens, double coeff) {
  TWIN_EXEC_CHECK(scores.numel == numel(tokens, experts) && counts.size() == sz(experts),
                  "moe_aux_loss_forward: scores {} counts {} for T {} E {}", scores.numel, counts.size(), tokens,
                  experts);
  before_host_wait("moe_aux_loss_forward");
  return do_moe_aux_loss_forward(scores, counts, tokens, experts, top_k, total_tokens, coeff);
}

void MoeKernels::moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                     const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                     int tokens, int experts, int top_k, const MoeAuxLoss& aux) {
  TWIN_EXEC_CHECK(dlogits.numel == numel(tokens, experts) && dprobs.numel == numel(tokens, top_k) &&
                      probs.numel == dprobs.numel && chosen.numel == dprobs.numel,
                  "moe_router_backward: dlogits {} dprobs {} probs {} chosen {} for T {} E {} k {}", dlogits.numel,
                  dprobs.numel, probs.numel, chosen.numel, tokens, experts, top_k);
  TWIN_EXEC_CHECK(aux.coeff <= 0 || (scores.numel == numel(tokens, experts) && counts.size() == sz(experts)),
                  "moe_router_backward: scores {} counts {} for T {} E {}", scores.numel, counts.size(), tokens,
                  experts);
  before_kernel("moe_router_backward",
                {{dlogits, "dlogits"}, {dprobs, "dprobs"}, {probs, "probs"}, {chosen, "chosen"}, {scores, "scores"}});
  do_moe_router_backward(dlogits, dprobs, probs, chosen, scores, counts, tokens, experts, top_k, aux);
}

void MoeKernels::moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                                     int top_k) {
  TWIN_EXEC_CHECK(rows.numel == numel(tokens, top_k) && inp.numel >= numel(tokens, hidden),
                  "moe_permute_forward: out {} inp {} rows {} for T {} C {} k {}", out.numel, inp.numel, rows.numel,
                  tokens, hidden, top_k);
  before_kernel("moe_permute_forward", {{out, "out"}, {inp, "inp"}, {rows, "rows"}});
  do_moe_permute_forward(out, inp, rows, tokens, hidden, top_k);
}

void MoeKernels::moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                      int hidden, int top_k) {
  TWIN_EXEC_CHECK(rows.numel == numel(tokens, top_k) && dinp.numel >= numel(tokens, hidden),
                  "moe_permute_backward: dinp {} dout {} rows {} for T {} C {} k {}", dinp.numel, dout.numel,
                  rows.numel, tokens, hidden, top_k);
  before_kernel("moe_permute_backward", {{dinp, "dinp"}, {dout, "dout"}, {rows, "rows"}});
  do_moe_permute_backward(dinp, dout, rows, tokens, hidden, top_k);
}

void MoeKernels::moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                       int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(
      probs.numel == numel(tokens, top_k) && rows.numel == probs.numel && out.numel >= numel(tokens, hidden),
      "moe_unpermute_forward: out {} inp {} probs {} rows {} for T {} C {} k {}", out.numel, inp.numel, probs.numel,
      rows.numel, tokens, hidden, top_k);
  before_kernel("moe_unpermute_forward", {{out, "out"}, {inp, "inp"}, {probs, "probs"}, {rows, "rows"}});
  do_moe_unpermute_forward(out, inp, probs, rows, tokens, hidden, top_k);
}

void MoeKernels::moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout, const Tensor& inp,
                                        const Tensor& probs, const Tensor& rows, int tokens, int hidden, int top_k) {
  TWIN_EXEC_CHECK(dprobs.numel == numel(tokens, top_k) && probs.numel == dprobs.numel && rows.numel == dprobs.numel &&
                      dout.numel >= numel(tokens, hidden),
                  "moe_unpermute_backward: dinp {} dprobs {} dout {} inp {} for T {} C {} k {}", dinp.numel,
                  dprobs.numel, dout.numel, inp.numel, tokens, hidden, top_k);
  before_kernel("moe_unpermute_backward",
                {{dinp, "dinp"}, {dprobs, "dprobs"}, {dout, "dout"}, {inp, "inp"}, {probs, "probs"}, {rows, "rows"}});
  do_moe_unpermute_backward(dinp, dprobs, dout, inp, probs, rows, tokens, hidden, top_k);
}

void MoeKernels::moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                         const std::vector<int>& order, int hidden) {
  const std::size_t n = total_rows(chunk_rows) * sz(hidden);
  TWIN_EXEC_CHECK(chunk_rows.size() == order.size() && out.numel >= n && inp.numel >= n,
                  "moe_sort_chunks_forward: {} chunks, {} in the order, out {} inp {} for {} elements",
                  chunk_rows.size(), order.size(), out.numel, inp.numel, n);
  before_kernel("moe_sort_chunks_forward", {{out, "out"}, {inp, "inp"}});
  do_moe_sort_chunks_forward(out, inp, chunk_rows, order, hidden);
}

void MoeKernels::moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                          const std::vector<int>& order, int hidden) {
  const std::size_t n = total_rows(chunk_rows) * sz(hidden);
  TWIN_EXEC_CHECK(chunk_rows.size() == order.size() && dinp.numel >= n && dout.numel >= n,
                  "moe_sort_chunks_backward: {} chunks, {} in the order, dinp {} dout {} for {} elements",
                  chunk_rows.size(), order.size(), dinp.numel, dout.numel, n);
  before_kernel("moe_sort_chunks_backward", {{dinp, "dinp"}, {dout, "dout"}});
  do_moe_sort_chunks_backward(dinp, dout, chunk_rows, order, hidden);
}

void MoeKernels::moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                            const std::vector<int>& rows_per_group, int in_features, int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  TWIN_EXEC_CHECK(out.numel >= rows * sz(out_features) && inp.numel >= rows * sz(in_features) &&
                      weights.numel == groups * numel(out_features, in_features),
                  "moe_grouped_matmul_forward: out {} inp {} weights {} for {} rows of {} groups ({} -> {})", out.numel,
                  inp.numel, weights.numel, rows, groups, in_features, out_features);
  before_kernel("moe_grouped_matmul_forward", {{out, "out"}, {inp, "inp"}, {weights, "weights"}});
  do_moe_grouped_matmul_forward(out, inp, weights, rows_per_group, in_features, out_features);
}

void MoeKernels::moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                             const Tensor& inp, const Tensor& weights,
                                             const std::vector<int>& rows_per_group, int in_features,
                                             int out_features) {
  const std::size_t rows = total_rows(rows_per_group), groups = rows_per_group.size();
  TWIN_EXEC_CHECK((dinp.empty() || dinp.numel >= rows * sz(in_features)) && dout.numel >= rows * sz(out_features) &&
                      inp.numel >= rows * sz(in_features) &&
                      weights.numel == groups * numel(out_features, in_features) && dweights.numel == weights.numel,
                  "moe_grouped_matmul_backward: dinp {} dout {} inp {} weights {} dweights {} for {} rows of {} groups",
                  dinp.numel, dout.numel, inp.numel, weights.numel, dweights.numel, rows, groups);
  before_kernel("moe_grouped_matmul_backward",
                {{dinp, "dinp"}, {dweights, "dweights"}, {dout, "dout"}, {inp, "inp"}, {weights, "weights"}});
  do_moe_grouped_matmul_backward(dinp, dweights, dout, inp, weights, rows_per_group, in_features, out_features);
}

}  // namespace twin::exec
