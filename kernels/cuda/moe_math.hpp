// The per-token formulas of the Mixture-of-Experts router and the per-element sums of the token permutation, shared by
// the CUDA kernels (moe.cu: one thread per token or element runs them) and the host (plain C++ when g++ compiles it).
// Each follows kernels/cpu/moe.cpp operation for operation, each fp32 operation correctly rounded (math.hpp's *_rn:
// no FMA contraction on the device), so tests/kernels_cuda/moe_host_test.cpp compares them with kernels/cpu on the CPU.
// A row is read through an accessor, value(i) -> float, so that the device reads bf16 logits and the host fp32.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/cuda/math.hpp"

namespace twin::kernels::cuda::moe_math {

// true when (value a, expert ia) comes before (value b, expert ib) in the router's order: the larger logit first,
// the lower expert first among equal logits (kernels/cpu/moe.cpp's partial_sort comparator)
TWIN_HOST_DEVICE inline bool before(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// experts (top_k) <- the top_k experts of a row of num_experts logits in the router's order (slot 0 the largest).
// Pick j is the first expert after pick j - 1 in that order: O(top_k num_experts), no scratch. A row with NaN still
// yields top_k distinct experts (the lowest not yet chosen), so a non-finite row never indexes out of range.
template <class Value>
TWIN_HOST_DEVICE void topk(int* experts, Value value, int num_experts, int top_k) {
  int previous = -1;
  float previous_value = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    int best = -1;
    float best_value = 0.0f;
    for (int e = 0; e < num_experts; ++e) {
      const float v = value(e);
      if (previous >= 0 && !before(previous_value, previous, v, e)) continue;  // chosen already
      if (best < 0 || before(v, e, best_value, best)) {
        best = e;
        best_value = v;
      }
    }
    if (best < 0) {  // NaN: no order; take the lowest expert not chosen yet
      for (int e = 0; e < num_experts && best < 0; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || experts[i] == e;
        if (!taken) best = e;
      }
      best_value = value(best);
    }
    experts[j] = best;
    previous = best;
    previous_value = best_value;
  }
}

// out (n) <- softmax of value(0 .. n): the largest subtracted first, exp_cephes, the sum in index order, then one
// multiplication by its inverse (kernels/cpu/moe.cpp's softmax_row)
template <class Value>
TWIN_HOST_DEVICE void softmax(float* out, Value value, int n) {
  float largest = value(0);
  for (int i = 1; i < n; ++i) {
    const float v = value(i);
    largest = largest < v ? v : largest;  // std::max
  }
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = math::exp_cephes(math::sub_rn(value(i), largest));
    sum = math::add_rn(sum, out[i]);
  }
  const float inverse = math::div_rn(1.0f, sum);
  for (int i = 0; i < n; ++i) out[i] = math::mul_rn(out[i], inverse);
}

// sum_i a(i) b(i) in index order, fp32 (the top-k softmax's and the load-balancing loss's row dots)
template <class A, class B>
TWIN_HOST_DEVICE float dot(A a, B b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum = math::add_rn(sum, math::mul_rn(a(i), b(i)));
  return sum;
}

// The top-k softmax's gradient at a chosen slot: p (dp - sum_i p_i dp_i)
TWIN_HOST_DEVICE inline float topk_softmax_grad(float p, float dp, float p_dot_dp) {
  return math::mul_rn(p, math::sub_rn(dp, p_dot_dp));
}

// The load-balancing loss's gradient factor, in double on the host:
//   loss_grad coeff E / (k T^2)     (kernels/cpu/moe.cpp's moe_aux_loss_backward `scale`)
inline float aux_loss_grad_scale(int num_experts, int top_k, double total_tokens, double coeff, double loss_grad) {
  return static_cast<float>(loss_grad * coeff * num_experts / (top_k * total_tokens * total_tokens));
}

// dlogit += scale s (count - sum_i s_i count_i): the loss's gradient through the scores' softmax at one expert
TWIN_HOST_DEVICE inline float aux_loss_grad_add(float dlogit, float scale, float score, float count,
                                                float score_dot_counts) {
  return math::add_rn(dlogit, math::mul_rn(math::mul_rn(scale, score), math::sub_rn(count, score_dot_counts)));
}

// One token's router gradient, expert by expert: store(e, d) with d = the top-k softmax's gradient at a chosen expert
// (0 at the others) plus, when score is given (aux_scale's loss on), aux_loss_grad_add's term; kernels/cpu/moe.cpp's
// moe_topk_softmax_backward then moe_aux_loss_backward. p, dp, chosen (top_k); score(e), count(e) (num_experts).
template <class Score, class Count, class Store>
TWIN_HOST_DEVICE void router_backward_row(Store store, const float* p, const float* dp, const int* chosen, Score score,
                                          Count count, bool aux, float aux_scale, int num_experts, int top_k) {
  const float p_dot_dp = dot([p](int j) { return p[j]; }, [dp](int j) { return dp[j]; }, top_k);
  const float s_dot_counts = aux ? dot(score, count, num_experts) : 0.0f;
  for (int e = 0; e < num_experts; ++e) {
    float d = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      if (chosen[j] == e) d = topk_softmax_grad(p[j], dp[j], p_dot_dp);
    }
    if (aux) d = aux_loss_grad_add(d, aux_scale, score(e), count(e), s_dot_counts);
    store(e, d);
  }
}

// The load-balancing loss from the scores' column sums (E, double) and the micro-batch's counts (E):
//   coeff E / (k T^2) sum_e counts[e] score_sums[e]
// (Megatron-Core's switch_load_balancing_loss_func order: the scores summed over tokens first). Host only.
inline double aux_loss(const double* score_sums, const float* counts, int num_experts, int top_k, double total_tokens,
                       double coeff) {
  double sum = 0.0;
  for (int e = 0; e < num_experts; ++e) sum += score_sums[e] * counts[e];
  return coeff * num_experts / (top_k * total_tokens * total_tokens) * sum;
}

// One element of the unpermute's weighted sum: sum over slots j in order of prob(j) x(j) (the first term a product,
// as kernels/cpu/moe.cpp starts from p x, not from 0 + p x)
template <class Prob, class X>
TWIN_HOST_DEVICE float weighted_sum(Prob prob, X x, int top_k) {
  float y = math::mul_rn(prob(0), x(0));
  for (int j = 1; j < top_k; ++j) y = math::add_rn(y, math::mul_rn(prob(j), x(j)));
  return y;
}

// One element of the permute's backward: sum over slots j in order of g(j) (the first term copied)
template <class G>
TWIN_HOST_DEVICE float slot_sum(G g, int top_k) {
  float y = g(0);
  for (int j = 1; j < top_k; ++j) y = math::add_rn(y, g(j));
  return y;
}

// ---- the permutation kernels' element bodies (moe.cu runs one thread per element i) ------------------------------
// load(index) -> float reads an input, store(index, float) writes an output (bf16 on the device, fp32 on the host);
// rows (T, k) is the permutation, probs (T, k) fp32. Slot s = t k + j is token t's j-th choice.

// i over (T k, C) by slot:  out[rows[s], c] = inp[t, c]
template <class Load, class Store>
TWIN_HOST_DEVICE void permute_forward_element(std::size_t i, Store out, Load inp, const int* rows, int hidden,
                                              int top_k) {
  const std::size_t slot = i / hidden, c = i % hidden;
  out(static_cast<std::size_t>(rows[slot]) * hidden + c, inp((slot / top_k) * hidden + c));
}

// i over (T, C):  dinp[t, c] = sum over j in slot order of dout[rows[t, j], c]
template <class Load, class Store>
TWIN_HOST_DEVICE void permute_backward_element(std::size_t i, Store dinp, Load dout, const int* rows, int hidden,
                                               int top_k) {
  const std::size_t t = i / hidden, c = i % hidden;
  const int* row = rows + t * top_k;
  dinp(i, slot_sum([=](int j) { return dout(static_cast<std::size_t>(row[j]) * hidden + c); }, top_k));
}

// i over (T, C):  out[t, c] = sum over j in slot order of probs[t, j] inp[rows[t, j], c]
template <class Load, class Store>
TWIN_HOST_DEVICE void unpermute_forward_element(std::size_t i, Store out, Load inp, const float* probs, const int* rows,
                                                int hidden, int top_k) {
  const std::size_t t = i / hidden, c = i % hidden;
  const int* row = rows + t * top_k;
  const float* p = probs + t * top_k;
  out(i, weighted_sum([p](int j) { return p[j]; },
                      [=](int j) { return inp(static_cast<std::size_t>(row[j]) * hidden + c); }, top_k));
}

// i over (T k, C) by slot:  dinp[rows[s], c] = probs[s] dout[t, c]
template <class Load, class Store>
TWIN_HOST_DEVICE void unpermute_backward_element(std::size_t i, Store dinp, Load dout, const float* probs,
                                                 const int* rows, int hidden, int top_k) {
  const std::size_t slot = i / hidden, c = i % hidden;
  dinp(static_cast<std::size_t>(rows[slot]) * hidden + c, math::mul_rn(probs[slot], dout((slot / top_k) * hidden + c)));
}

// ---- the chunk sort after the all-to-all, planned on the host (moe.cu copies each chunk) --------------------------

// One chunk's rows: its first row in the arrival (unsorted) layout and in the sorted one.
struct ChunkCopy {
  std::size_t unsorted_row = 0, sorted_row = 0, rows = 0;
};

// The copies of kernels/cpu/moe.cpp's moe_sort_chunks: sorted chunk i is unsorted chunk order[i], chunk c of
// chunk_rows[c] rows; chunks without rows left out. Returns false (and no copies) when order is no permutation of
// [0, chunks) or a chunk has negative rows.
inline bool sort_chunk_copies(std::vector<ChunkCopy>& copies, const int* chunk_rows, const int* order, int chunks) {
  copies.clear();
  std::vector<std::size_t> starts(static_cast<std::size_t>(chunks) + 1, 0);
  for (int c = 0; c < chunks; ++c) {
    if (chunk_rows[c] < 0) return false;
    starts[c + 1] = starts[c] + static_cast<std::size_t>(chunk_rows[c]);
  }
  std::vector<bool> seen(static_cast<std::size_t>(chunks), false);
  std::size_t sorted = 0;
  for (int i = 0; i < chunks; ++i) {
    const int c = order[i];
    if (c < 0 || c >= chunks || seen[c]) {
      copies.clear();
      return false;
    }
    seen[c] = true;
    if (chunk_rows[c] > 0) copies.push_back({starts[c], sorted, static_cast<std::size_t>(chunk_rows[c])});
    sorted += static_cast<std::size_t>(chunk_rows[c]);
  }
  return true;
}

}  // namespace twin::kernels::cuda::moe_math
