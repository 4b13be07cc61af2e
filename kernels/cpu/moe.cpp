#include "kernels/cpu/moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/cpu/check.hpp"
#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/matmul.hpp"

namespace twin::kernels::cpu {

namespace {

std::size_t at(int row, int width) {
  return static_cast<std::size_t>(row) * static_cast<std::size_t>(width);
}

// out (n) <- softmax of x (n); x's largest first subtracted, so exp's argument is <= 0.
void softmax_row(float* out, const float* x, int n) {
  float largest = x[0];
  for (int i = 1; i < n; ++i) largest = std::max(largest, x[i]);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = detail::exp_cephes(x[i] - largest);
    sum += out[i];
  }
  const float inverse = 1.0f / sum;
  for (int i = 0; i < n; ++i) out[i] *= inverse;
}

}  // namespace

// ---- Routing -------------------------------------------------------------------------------------------------------

void moe_topk_softmax_forward(float* probs, int* experts, const float* logits, int tokens, int num_experts, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0);
  TWIN_KERNEL_CHECK(top_k > 0 && top_k <= num_experts);
  TWIN_KERNEL_CHECK(probs != nullptr && experts != nullptr && logits != nullptr);
  std::vector<int> order(num_experts);
  std::vector<float> chosen(top_k);
  for (int t = 0; t < tokens; ++t) {
    const float* row = logits + at(t, num_experts);
    for (int e = 0; e < num_experts; ++e) order[e] = e;
    // The top_k largest, the lower index first among equals: a strict weak order on (value desc, index asc).
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [row](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int j = 0; j < top_k; ++j) {
      experts[at(t, top_k) + j] = order[j];
      chosen[j] = row[order[j]];
    }
    softmax_row(probs + at(t, top_k), chosen.data(), top_k);
  }
}

void moe_topk_softmax_backward(float* dlogits, const float* dprobs, const float* probs, const int* experts, int tokens,
                               int num_experts, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0);
  TWIN_KERNEL_CHECK(top_k > 0 && top_k <= num_experts);
  TWIN_KERNEL_CHECK(dlogits != nullptr && dprobs != nullptr && probs != nullptr && experts != nullptr);
  std::memset(dlogits, 0, at(tokens, num_experts) * sizeof(float));
  for (int t = 0; t < tokens; ++t) {
    const float* p = probs + at(t, top_k);
    const float* dp = dprobs + at(t, top_k);
    float dot = 0.0f;
    for (int j = 0; j < top_k; ++j) dot += p[j] * dp[j];
    for (int j = 0; j < top_k; ++j) {
      const int expert = experts[at(t, top_k) + j];
      TWIN_KERNEL_CHECK(expert >= 0 && expert < num_experts);
      dlogits[at(t, num_experts) + expert] = p[j] * (dp[j] - dot);
    }
  }
}

// ---- Load-balancing loss -------------------------------------------------------------------------------------------

void moe_router_scores_forward(float* scores, const float* logits, int tokens, int num_experts) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0);
  TWIN_KERNEL_CHECK(scores != nullptr && logits != nullptr && scores != logits);
  for (int t = 0; t < tokens; ++t) softmax_row(scores + at(t, num_experts), logits + at(t, num_experts), num_experts);
}

void moe_tokens_per_expert(float* counts, const int* experts, int tokens, int num_experts, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0 && top_k > 0);
  TWIN_KERNEL_CHECK(counts != nullptr && experts != nullptr);
  std::fill(counts, counts + num_experts, 0.0f);
  for (std::size_t i = 0; i < at(tokens, top_k); ++i) {
    TWIN_KERNEL_CHECK(experts[i] >= 0 && experts[i] < num_experts);
    counts[experts[i]] += 1.0f;
  }
}

double moe_aux_loss_forward(const float* scores, const float* counts, int tokens, int num_experts, int top_k,
                            double total_tokens, double coeff) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0 && top_k > 0 && total_tokens > 0);
  TWIN_KERNEL_CHECK(scores != nullptr && counts != nullptr);
  // sum_i counts_i * sum_t scores[t, i], accumulated in double token by token (the order is fixed: same bits).
  double sum = 0.0;
  for (int t = 0; t < tokens; ++t) {
    const float* row = scores + at(t, num_experts);
    for (int e = 0; e < num_experts; ++e) sum += static_cast<double>(row[e]) * counts[e];
  }
  return coeff * num_experts / (top_k * total_tokens * total_tokens) * sum;
}

void moe_aux_loss_backward(float* dlogits, const float* scores, const float* counts, int tokens, int num_experts,
                           int top_k, double total_tokens, double coeff, double loss_grad) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0 && top_k > 0 && total_tokens > 0);
  TWIN_KERNEL_CHECK(dlogits != nullptr && scores != nullptr && counts != nullptr);
  // d loss / d scores[t, i] = scale * counts_i; through the softmax: ds_j (g_j - sum_i s_i g_i).
  const auto scale = static_cast<float>(loss_grad * coeff * num_experts / (top_k * total_tokens * total_tokens));
  for (int t = 0; t < tokens; ++t) {
    const float* s = scores + at(t, num_experts);
    float* d = dlogits + at(t, num_experts);
    float dot = 0.0f;
    for (int e = 0; e < num_experts; ++e) dot += s[e] * counts[e];
    for (int e = 0; e < num_experts; ++e) d[e] += scale * s[e] * (counts[e] - dot);
  }
}

// ---- Permutation ---------------------------------------------------------------------------------------------------

void moe_permutation(int* rows, int* rows_per_expert, const int* experts, int tokens, int num_experts, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0 && top_k > 0);
  TWIN_KERNEL_CHECK(rows != nullptr && rows_per_expert != nullptr && experts != nullptr);
  std::fill(rows_per_expert, rows_per_expert + num_experts, 0);
  for (std::size_t i = 0; i < at(tokens, top_k); ++i) {
    TWIN_KERNEL_CHECK(experts[i] >= kMoeDropped && experts[i] < num_experts);
    if (experts[i] != kMoeDropped) ++rows_per_expert[experts[i]];
  }
  std::vector<int> next(num_experts, 0);  // each expert's next free row
  for (int e = 1; e < num_experts; ++e) next[e] = next[e - 1] + rows_per_expert[e - 1];
  for (int t = 0; t < tokens; ++t) {  // token order within an expert
    for (int j = 0; j < top_k; ++j) {
      const int expert = experts[at(t, top_k) + j];
      TWIN_KERNEL_CHECK(expert == kMoeDropped || j == 0 ||
                        std::find(experts + at(t, top_k), experts + at(t, top_k) + j, expert) ==
                            experts + at(t, top_k) + j);  // a token picks an expert once
      rows[at(t, top_k) + j] = expert == kMoeDropped ? kMoeDropped : next[expert]++;
    }
  }
}

int moe_capacity(int tokens, int num_experts, int top_k, double capacity_factor) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0 && top_k > 0 && capacity_factor > 0);
  // get_capacity(num_tokens = tokens * top_k, ...): ceil(num_tokens / num_experts * capacity_factor), in double as
  // Python computes it; no expert can take more than every token, so the top-k below never asks for more.
  const double capacity = std::ceil(static_cast<double>(tokens) * top_k / num_experts * capacity_factor);
  return static_cast<int>(std::min(capacity, static_cast<double>(tokens)));
}

int moe_capacity_drop(int* experts, const float* probs, int tokens, int num_experts, int top_k, int capacity) {
  TWIN_KERNEL_CHECK(tokens > 0 && num_experts > 0 && top_k > 0 && capacity >= 0);
  TWIN_KERNEL_CHECK(experts != nullptr && probs != nullptr);
  std::vector<std::vector<std::size_t>> slots(num_experts);  // each expert's (token, slot) indices, token order
  for (std::size_t i = 0; i < at(tokens, top_k); ++i) {
    TWIN_KERNEL_CHECK(experts[i] >= 0 && experts[i] < num_experts);
    slots[experts[i]].push_back(i);
  }
  int dropped = 0;
  for (auto& mine : slots) {
    if (mine.size() <= static_cast<std::size_t>(capacity)) continue;
    // the highest probabilities first; equal ones: the earlier token (a stable sort of token-ordered slots)
    std::stable_sort(mine.begin(), mine.end(), [&](std::size_t a, std::size_t b) { return probs[a] > probs[b]; });
    for (std::size_t r = static_cast<std::size_t>(capacity); r < mine.size(); ++r) {
      experts[mine[r]] = kMoeDropped;
      ++dropped;
    }
  }
  return dropped;
}

void moe_permute_forward(float* out, const float* inp, const int* rows, int tokens, int hidden, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && hidden > 0 && top_k > 0);
  TWIN_KERNEL_CHECK(out != nullptr && inp != nullptr && rows != nullptr && out != inp);
  const int total = tokens * top_k;
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < top_k; ++j) {
      const int row = rows[at(t, top_k) + j];
      TWIN_KERNEL_CHECK(row >= kMoeDropped && row < total);
      if (row == kMoeDropped) continue;
      std::memcpy(out + at(row, hidden), inp + at(t, hidden), hidden * sizeof(float));
    }
  }
}

void moe_permute_backward(float* dinp, const float* dout, const int* rows, int tokens, int hidden, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && hidden > 0 && top_k > 0);
  TWIN_KERNEL_CHECK(dinp != nullptr && dout != nullptr && rows != nullptr && dinp != dout);
  const int total = tokens * top_k;
  for (int t = 0; t < tokens; ++t) {
    float* d = dinp + at(t, hidden);
    bool first = true;  // the first kept slot overwrites (a token with every slot dropped gets 0)
    for (int j = 0; j < top_k; ++j) {
      const int row = rows[at(t, top_k) + j];
      TWIN_KERNEL_CHECK(row >= kMoeDropped && row < total);
      if (row == kMoeDropped) continue;
      const float* g = dout + at(row, hidden);
      if (first) {
        std::memcpy(d, g, hidden * sizeof(float));
      } else {
        for (int c = 0; c < hidden; ++c) d[c] += g[c];
      }
      first = false;
    }
    if (first) std::fill(d, d + hidden, 0.0f);
  }
}

void moe_unpermute_forward(float* out, const float* inp, const float* probs, const int* rows, int tokens, int hidden,
                           int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && hidden > 0 && top_k > 0);
  TWIN_KERNEL_CHECK(out != nullptr && inp != nullptr && probs != nullptr && rows != nullptr && out != inp);
  const int total = tokens * top_k;
  for (int t = 0; t < tokens; ++t) {
    float* y = out + at(t, hidden);
    bool first = true;  // the first kept slot overwrites (a token with every slot dropped gets 0)
    for (int j = 0; j < top_k; ++j) {
      const int row = rows[at(t, top_k) + j];
      TWIN_KERNEL_CHECK(row >= kMoeDropped && row < total);
      if (row == kMoeDropped) continue;
      const float p = probs[at(t, top_k) + j];
      const float* x = inp + at(row, hidden);
      if (first) {
        for (int c = 0; c < hidden; ++c) y[c] = p * x[c];
      } else {
        for (int c = 0; c < hidden; ++c) y[c] += p * x[c];
      }
      first = false;
    }
    if (first) std::fill(y, y + hidden, 0.0f);
  }
}

void moe_unpermute_backward(float* dinp, float* dprobs, const float* dout, const float* inp, const float* probs,
                            const int* rows, int tokens, int hidden, int top_k) {
  TWIN_KERNEL_CHECK(tokens > 0 && hidden > 0 && top_k > 0);
  TWIN_KERNEL_CHECK(dinp != nullptr && dprobs != nullptr && dout != nullptr && inp != nullptr && probs != nullptr &&
                    rows != nullptr);
  TWIN_KERNEL_CHECK(dinp != dout && dinp != inp);
  const int total = tokens * top_k;
  for (int t = 0; t < tokens; ++t) {
    const float* g = dout + at(t, hidden);
    for (int j = 0; j < top_k; ++j) {
      const int row = rows[at(t, top_k) + j];
      TWIN_KERNEL_CHECK(row >= kMoeDropped && row < total);
      if (row == kMoeDropped) {  // dropped: no row, and no gradient to its probability
        dprobs[at(t, top_k) + j] = 0.0f;
        continue;
      }
      const float p = probs[at(t, top_k) + j];
      const float* x = inp + at(row, hidden);
      float* d = dinp + at(row, hidden);
      float dot = 0.0f;
      for (int c = 0; c < hidden; ++c) {
        d[c] = p * g[c];
        dot += g[c] * x[c];
      }
      dprobs[at(t, top_k) + j] = dot;
    }
  }
}

// ---- Chunk sort ----------------------------------------------------------------------------------------------------

namespace {

// The first row of each chunk of inp.
std::vector<std::size_t> chunk_starts(const int* chunk_rows, int chunks) {
  std::vector<std::size_t> starts(chunks + 1, 0);
  for (int c = 0; c < chunks; ++c) starts[c + 1] = starts[c] + static_cast<std::size_t>(chunk_rows[c]);
  return starts;
}

template <bool kForward>
void move_chunks(float* to, const float* from, const int* chunk_rows, const int* order, int chunks, int hidden) {
  const std::vector<std::size_t> starts = chunk_starts(chunk_rows, chunks);
  std::vector<bool> seen(chunks, false);
  std::size_t sorted_start = 0;  // first row of chunk i in the sorted layout
  for (int i = 0; i < chunks; ++i) {
    const int c = order[i];
    TWIN_KERNEL_CHECK(c >= 0 && c < chunks && !seen[c]);  // order is a permutation
    seen[c] = true;
    const std::size_t count = static_cast<std::size_t>(chunk_rows[c]) * hidden;
    const std::size_t unsorted = starts[c] * hidden, sorted = sorted_start * hidden;
    if (count > 0)
      std::memcpy(to + (kForward ? sorted : unsorted), from + (kForward ? unsorted : sorted), count * sizeof(float));
    sorted_start += chunk_rows[c];
  }
}

}  // namespace

void moe_sort_chunks_forward(float* out, const float* inp, const int* chunk_rows, const int* order, int chunks,
                             int hidden) {
  TWIN_KERNEL_CHECK(chunks > 0 && hidden > 0);
  TWIN_KERNEL_CHECK(out != nullptr && inp != nullptr && chunk_rows != nullptr && order != nullptr && out != inp);
  for (int c = 0; c < chunks; ++c) TWIN_KERNEL_CHECK(chunk_rows[c] >= 0);
  move_chunks<true>(out, inp, chunk_rows, order, chunks, hidden);
}

void moe_sort_chunks_backward(float* dinp, const float* dout, const int* chunk_rows, const int* order, int chunks,
                              int hidden) {
  TWIN_KERNEL_CHECK(chunks > 0 && hidden > 0);
  TWIN_KERNEL_CHECK(dinp != nullptr && dout != nullptr && chunk_rows != nullptr && order != nullptr && dinp != dout);
  for (int c = 0; c < chunks; ++c) TWIN_KERNEL_CHECK(chunk_rows[c] >= 0);
  move_chunks<false>(dinp, dout, chunk_rows, order, chunks, hidden);
}

// ---- Grouped GEMM --------------------------------------------------------------------------------------------------

void moe_grouped_matmul_forward(float* out, const float* inp, const float* weights, const int* rows_per_group,
                                int groups, int in_features, int out_features) {
  TWIN_KERNEL_CHECK(groups > 0 && in_features > 0 && out_features > 0);
  TWIN_KERNEL_CHECK(out != nullptr && inp != nullptr && weights != nullptr && rows_per_group != nullptr);
  std::size_t row = 0;
  for (int g = 0; g < groups; ++g) {
    const int rows = rows_per_group[g];
    TWIN_KERNEL_CHECK(rows >= 0);
    if (rows > 0) {
      matmul_forward(out + row * out_features, inp + row * in_features, weights + at(g, out_features) * in_features,
                     nullptr, rows, in_features, out_features);
    }
    row += rows;
  }
}

void moe_grouped_matmul_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                                 const float* weights, const int* rows_per_group, int groups, int in_features,
                                 int out_features) {
  TWIN_KERNEL_CHECK(groups > 0 && in_features > 0 && out_features > 0);
  TWIN_KERNEL_CHECK(dweights != nullptr && dout != nullptr && inp != nullptr && rows_per_group != nullptr);
  TWIN_KERNEL_CHECK(dinp == nullptr || weights != nullptr);
  std::size_t row = 0;
  for (int g = 0; g < groups; ++g) {
    const int rows = rows_per_group[g];
    TWIN_KERNEL_CHECK(rows >= 0);
    if (rows > 0) {
      const std::size_t weight = at(g, out_features) * in_features;
      matmul_backward(dinp == nullptr ? nullptr : dinp + row * in_features, dweights + weight, nullptr,
                      dout + row * out_features, inp + row * in_features,
                      weights == nullptr ? nullptr : weights + weight, rows, in_features, out_features);
    }
    row += rows;
  }
}

}  // namespace twin::kernels::cpu
