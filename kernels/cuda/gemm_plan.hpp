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

}  // namespace twin::kernels::cuda
