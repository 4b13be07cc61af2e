// How each row-major GEMM of the model maps onto cuBLASLt's column-major one, as plain data (no CUDA header), so the
// tests execute the very same plans on the CPU and compare them with kernels/cpu (tests/kernels_cuda/plan_test.cpp).
//
// cuBLASLt computes, per batch entry i, in column-major storage:
//   D_i (m, n) = alpha op(A_i) (m, k) op(B_i) (k, n) + beta D_i
// with X_i = X + offset_x + i * stride_x, element (r, c) of a column-major X at r + c * ld_x, and op(X) = X^T when
// trans_x (A is then stored (k, m), B stored (n, k)). A row-major (R, C) matrix with row stride ld is the column-major
// (C, R) matrix with the same ld: every plan below is a row-major product read backwards.
#pragma once

#include <cstdint>

namespace twin::kernels::cuda {

struct GemmPlan {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_d = 0;  // elements between batch entries
  std::int64_t offset_a = 0, offset_b = 0, offset_d = 0;  // elements from the base pointer to batch entry 0
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: D is overwritten (may hold NaN), 1: accumulated
};

// --- linear layers (kernels/cuda/matmul.cuh), weight (out_f, in_f) row-major as nn.Linear -------------------------
// out (rows, out_f) = inp (rows, in_f) @ weight^T:  col-major out^T (out_f, rows) = op(A) B with
//   A = weight, col-major (in_f, out_f), transposed -> (out_f, in_f);  B = inp, col-major (in_f, rows)
inline GemmPlan plan_linear_forward(int rows, int in_features, int out_features) {
  GemmPlan p;
  p.trans_a = true;
  p.m = out_features, p.n = rows, p.k = in_features;
  p.lda = in_features, p.ldb = in_features, p.ldd = out_features;
  return p;
}

// dinp (rows, in_f) = dout (rows, out_f) @ weight (out_f, in_f):  col-major dinp^T (in_f, rows) = A B with
//   A = weight, col-major (in_f, out_f);  B = dout, col-major (out_f, rows)
inline GemmPlan plan_linear_backward_input(int rows, int in_features, int out_features) {
  GemmPlan p;
  p.m = in_features, p.n = rows, p.k = out_features;
  p.lda = in_features, p.ldb = out_features, p.ldd = in_features;
  return p;
}

// dweight (out_f, in_f) += dout^T (out_f, rows) @ inp (rows, in_f):  col-major dweight^T (in_f, out_f) += A op(B) with
//   A = inp, col-major (in_f, rows);  B = dout, col-major (out_f, rows), transposed -> (rows, out_f)
inline GemmPlan plan_linear_backward_weight(int rows, int in_features, int out_features) {
  GemmPlan p;
  p.trans_b = true;
  p.m = in_features, p.n = out_features, p.k = rows;
  p.lda = in_features, p.ldb = out_features, p.ldd = in_features;
  p.beta = 1.0f;
  return p;
}

// --- attention (kernels/cuda/attention.cuh), one batch element b at a time, batched over its H heads ---------------
// qkv_b (T, 3, H, D): q of head h is the row-major (T, D) matrix at offset h*D with row stride 3HD (k: + HD, v: + 2HD),
// i.e. the col-major (D, T) matrix with ld 3HD. Head h is batch entry h: stride D. Scores and probabilities are
// row-major (H, T_query, T_key) scratch: head h at h*T*T, row stride T, i.e. col-major (T_key, T_query) with ld T.
struct AttentionShape {
  int seq = 0, heads = 0, head_dim = 0;
  std::int64_t hidden() const { return static_cast<std::int64_t>(heads) * head_dim; }
  std::int64_t qkv_row() const { return 3 * hidden(); }
  std::int64_t scores_per_head() const { return static_cast<std::int64_t>(seq) * seq; }
};

namespace detail {
inline GemmPlan head_batched(const AttentionShape& s, int m, int n, int k) {
  GemmPlan p;
  p.m = m, p.n = n, p.k = k;
  p.batch = s.heads;
  return p;
}
}  // namespace detail

// scores (H, Tq, Tk) = scale * q k^T:  col-major scores^T (Tk, Tq) = scale * k_cm^T (Tk, D) q_cm (D, Tq)
//   A = k (offset HD), B = q (offset 0), D = scores (fp32 scratch)
inline GemmPlan plan_attention_scores(const AttentionShape& s, float scale) {
  GemmPlan p = detail::head_batched(s, s.seq, s.seq, s.head_dim);
  p.trans_a = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.hidden();
  p.ldb = s.qkv_row(), p.stride_b = s.head_dim, p.offset_b = 0;
  p.ldd = s.seq, p.stride_d = s.scores_per_head();
  p.alpha = scale;
  return p;
}

// out_h (Tq, D) = P_h (Tq, Tk) v_h (Tk, D), out (T, H, D):  col-major out^T (D, Tq) = v_cm (D, Tk) P^T (Tk, Tq)
//   A = v (offset 2HD), B = probabilities (bf16 scratch), D = out (row stride HD, head offset h*D)
inline GemmPlan plan_attention_output(const AttentionShape& s) {
  GemmPlan p = detail::head_batched(s, s.head_dim, s.seq, s.seq);
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = 2 * s.hidden();
  p.ldb = s.seq, p.stride_b = s.scores_per_head();
  p.ldd = s.hidden(), p.stride_d = s.head_dim;
  return p;
}

// dP_h (Tq, Tk) = dout_h (Tq, D) v_h^T:  col-major dP^T (Tk, Tq) = v_cm^T (Tk, D) dout_cm (D, Tq)
//   A = v (offset 2HD), B = dout (row stride HD), D = dP (fp32 scratch)
inline GemmPlan plan_attention_dprobs(const AttentionShape& s) {
  GemmPlan p = detail::head_batched(s, s.seq, s.seq, s.head_dim);
  p.trans_a = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = 2 * s.hidden();
  p.ldb = s.hidden(), p.stride_b = s.head_dim;
  p.ldd = s.seq, p.stride_d = s.scores_per_head();
  return p;
}

// dv_h (Tk, D) = P_h^T (Tk, Tq) dout_h (Tq, D):  col-major dv^T (D, Tk) = dout_cm (D, Tq) op(P_cm) (Tq, Tk), P_cm is
// (Tk, Tq): transposed.  A = dout, B = probabilities (bf16 scratch), D = dqkv (offset 2HD)
inline GemmPlan plan_attention_dvalue(const AttentionShape& s) {
  GemmPlan p = detail::head_batched(s, s.head_dim, s.seq, s.seq);
  p.trans_b = true;
  p.lda = s.hidden(), p.stride_a = s.head_dim;
  p.ldb = s.seq, p.stride_b = s.scores_per_head();
  p.ldd = s.qkv_row(), p.stride_d = s.head_dim, p.offset_d = 2 * s.hidden();
  return p;
}

// dq_h (Tq, D) = dS_h (Tq, Tk) k_h (Tk, D):  col-major dq^T (D, Tq) = k_cm (D, Tk) dS_cm (Tk, Tq)
//   A = k (offset HD), B = dS (bf16 scratch, already times the softmax scale), D = dqkv (offset 0)
inline GemmPlan plan_attention_dquery(const AttentionShape& s) {
  GemmPlan p = detail::head_batched(s, s.head_dim, s.seq, s.seq);
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.hidden();
  p.ldb = s.seq, p.stride_b = s.scores_per_head();
  p.ldd = s.qkv_row(), p.stride_d = s.head_dim;
  return p;
}

// dk_h (Tk, D) = dS_h^T (Tk, Tq) q_h (Tq, D):  col-major dk^T (D, Tk) = q_cm (D, Tq) op(dS_cm) (Tq, Tk): transposed.
//   A = q (offset 0), B = dS, D = dqkv (offset HD)
inline GemmPlan plan_attention_dkey(const AttentionShape& s) {
  GemmPlan p = detail::head_batched(s, s.head_dim, s.seq, s.seq);
  p.trans_b = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim;
  p.ldb = s.seq, p.stride_b = s.scores_per_head();
  p.ldd = s.qkv_row(), p.stride_d = s.head_dim, p.offset_d = s.hidden();
  return p;
}

// --- the GEMM plans of grouped-query attention (gemm_plan.hpp's conventions), one sequence b at a time ---------------
// qkv_b (T, (H + 2 KV) D): q of query head h is the col-major (D, T) matrix at offset h D with ld (H + 2 KV) D; k of kv
// head g at (H + g) D, v at (H + KV + g) D. Every plan is batched over the KV kv heads g and serves query head
// h = g G + j (G = H / KV) for one j: q, out, dout and the scores of those heads step by G D (G T^2 for the scores),
// k and v by D. Scores and probabilities are (H, T, T) as multi-head attention's; the dk and dv sums fp32 scratch
// (KV, T, D), kv head g at g T D, row stride D (col-major (D, T) with ld D). With KV == H (G = 1, j = 0) every plan is
// its plan_attention_* twin.
struct GroupedAttentionShape {
  int seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int group() const { return heads / kv_heads; }
  std::int64_t hidden() const { return static_cast<std::int64_t>(heads) * head_dim; }  // q and out row: H D
  std::int64_t qkv_row() const { return static_cast<std::int64_t>(heads + 2 * kv_heads) * head_dim; }
  std::int64_t k_offset() const { return hidden(); }                                                   // H D
  std::int64_t v_offset() const { return hidden() + static_cast<std::int64_t>(kv_heads) * head_dim; }  // (H + KV) D
  std::int64_t scores_per_head() const { return static_cast<std::int64_t>(seq) * seq; }
  std::int64_t kv_sum_per_head() const { return static_cast<std::int64_t>(seq) * head_dim; }  // T D of the scratch
  // query head j of group g, in q, out, dout and dq (per token: offset j D + g G D) and in the scores (j T^2 + g G T^2)
  std::int64_t head_offset(int j) const { return static_cast<std::int64_t>(j) * head_dim; }
  std::int64_t head_stride() const { return static_cast<std::int64_t>(group()) * head_dim; }
  std::int64_t scores_offset(int j) const { return j * scores_per_head(); }
  std::int64_t scores_stride() const { return group() * scores_per_head(); }
};

namespace detail {
inline GemmPlan kv_head_batched(const GroupedAttentionShape& s, int m, int n, int k) {
  GemmPlan p;
  p.m = m, p.n = n, p.k = k;
  p.batch = s.kv_heads;
  return p;
}
}  // namespace detail

// scores of heads g G + j (Tq, Tk) = scale * q k^T:  A = k (offset H D, stride D), B = q (offset j D, stride G D),
// D = scores (fp32 scratch, offset j T^2, stride G T^2)
inline GemmPlan plan_grouped_attention_scores(const GroupedAttentionShape& s, int j, float scale) {
  GemmPlan p = detail::kv_head_batched(s, s.seq, s.seq, s.head_dim);
  p.trans_a = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.k_offset();
  p.ldb = s.qkv_row(), p.stride_b = s.head_stride(), p.offset_b = s.head_offset(j);
  p.ldd = s.seq, p.stride_d = s.scores_stride(), p.offset_d = s.scores_offset(j);
  p.alpha = scale;
  return p;
}

// out_h (Tq, D) = P_h v_g:  A = v (offset (H + KV) D, stride D), B = probabilities (offset j T^2, stride G T^2),
// D = out (row stride H D, offset j D, stride G D)
inline GemmPlan plan_grouped_attention_output(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.v_offset();
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.hidden(), p.stride_d = s.head_stride(), p.offset_d = s.head_offset(j);
  return p;
}

// dP_h (Tq, Tk) = dout_h v_g^T:  A = v (transposed), B = dout (row stride H D, offset j D, stride G D), D = dP (fp32
// scratch, offset j T^2, stride G T^2)
inline GemmPlan plan_grouped_attention_dprobs(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.seq, s.seq, s.head_dim);
  p.trans_a = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.v_offset();
  p.ldb = s.hidden(), p.stride_b = s.head_stride(), p.offset_b = s.head_offset(j);
  p.ldd = s.seq, p.stride_d = s.scores_stride(), p.offset_d = s.scores_offset(j);
  return p;
}

// dq_h (Tq, D) = dS_h k_g:  A = k, B = dS (bf16 scratch, already times the softmax scale; offset j T^2, stride G T^2),
// D = dqkv (offset j D, stride G D): q's slot, overwritten
inline GemmPlan plan_grouped_attention_dquery(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.lda = s.qkv_row(), p.stride_a = s.head_dim, p.offset_a = s.k_offset();
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.qkv_row(), p.stride_d = s.head_stride(), p.offset_d = s.head_offset(j);
  return p;
}

// dk_g (Tk, D) (+)= dS_h^T q_h:  A = q (offset j D, stride G D), B = dS (transposed), D = the fp32 dk sums
// (KV, T, D); beta 0 for j = 0 (overwritten), 1 after (the group's heads summed in order)
inline GemmPlan plan_grouped_attention_dkey(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.trans_b = true;
  p.lda = s.qkv_row(), p.stride_a = s.head_stride(), p.offset_a = s.head_offset(j);
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.head_dim, p.stride_d = s.kv_sum_per_head();
  p.beta = j == 0 ? 0.0f : 1.0f;
  return p;
}

// dv_g (Tk, D) (+)= P_h^T dout_h:  A = dout (row stride H D, offset j D, stride G D), B = probabilities (transposed),
// D = the fp32 dv sums (KV, T, D); beta as plan_grouped_attention_dkey's
inline GemmPlan plan_grouped_attention_dvalue(const GroupedAttentionShape& s, int j) {
  GemmPlan p = detail::kv_head_batched(s, s.head_dim, s.seq, s.seq);
  p.trans_b = true;
  p.lda = s.hidden(), p.stride_a = s.head_stride(), p.offset_a = s.head_offset(j);
  p.ldb = s.seq, p.stride_b = s.scores_stride(), p.offset_b = s.scores_offset(j);
  p.ldd = s.head_dim, p.stride_d = s.kv_sum_per_head();
  p.beta = j == 0 ? 0.0f : 1.0f;
  return p;
}

}  // namespace twin::kernels::cuda
