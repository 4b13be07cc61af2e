// Backend: the seam between the interpreter and a device. It owns memory (allocate, host copies) and runs every kernel
// of a GPT on Tensors. The interpreter (exec/interpreter/*.cpp) only ever calls these methods, so a new device plugs in
// by implementing this class; nothing in the interpreter changes.
//
//   cpu   exec/cpu/cpu_backend.cpp: fp32 everywhere, kernels/cpu (OpenBLAS sgemm)
//   cuda  bf16 activations and working weights, fp32 gradients, fp32 master weights and Adam state,
//         cuBLASLt GEMMs, kernels/cuda; the collectives go to an NCCL Communicator on device pointers.
//
// The public methods are not virtual: each checks its operands' shapes once, for every backend (exec/core/backend.cpp,
// moe_kernels.cpp, context_kernels.cpp), then calls the protected virtual do_ method of the same name, which a backend
// implements (the non-virtual interface idiom). A backend's do_ methods may assume the documented shapes; they check
// only what their own device needs (dtypes and device pointers on the GPU, a row map's contents on the host).
//
// Conventions, the same as kernels/cpu/kernels.hpp: outputs first; shapes in comments; parameter gradients ACCUMULATE
// (+=); activation gradients are OVERWRITTEN except layernorm_backward's dinp (the residual stream's gradient).
// Dtypes: activations, weights and activation gradients are in activation_dtype(); parameter gradients, Adam state,
// master weights, layernorm statistics, attention lse, cross-entropy statistics and losses are fp32; token ids int32.
// Every call may be asynchronous on its device; synchronize() waits for all of them (the timeline calls it when it
// times ops; host copies synchronize by themselves).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/core/tensor.hpp"

namespace twin::exec {

// One AdamW step's hyper-parameters (kernels/cpu/adamw.hpp has the formulas).
struct AdamWStep {
  float learning_rate = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0;
  int step = 1;          // 1-based: the bias corrections use it
  float grad_scale = 1;  // global-norm clipping factor
};

// How one operand of an FP8 GEMM is quantized (model.fp8, framework.fp8_recipe; kernels/cpu/fp8_matmul.hpp).
struct Fp8Operand {
  enum class Scaling : unsigned char {
    PerTensor,  // one given scale (delayed scaling)
    Current,    // one scale from the tensor's own amax (tensorwise)
    Tiles,      // a power-of-2 scale per 1 x 128 tile along K (blockwise: activations and gradients)
    Blocks,     // a power-of-2 scale per 128 x 128 block (blockwise: weights)
    Mx,         // an E8M0 scale per 32 elements along K (mxfp8)
  };
  bool e5m2 = false;  // E5M2 (the output gradient under the hybrid format), else E4M3
  Scaling scaling = Scaling::Current;
  float scale = 1.0f;  // PerTensor only
};
// The amaxes of the high-precision operands an FP8 GEMM call quantized (what delayed scaling records).
struct Fp8Amaxes {
  float input = 0, weight = 0, gradient = 0;
};

// A context-parallel rank's attention (model/ops/context_parallel.hpp, kernels/cpu/ring_attention.hpp): `cp` ranks
// share each of the `batch` sequences of `seq` tokens; rank `cp_rank` holds two chunks of seq / (2 cp) tokens of each
// (model::cp_sequence_chunk), L = seq / cp local tokens in that order. H, KV: the rank's query and key/value heads.
struct ContextShape {
  int batch = 1, seq = 0, heads = 1, kv_heads = 1, head_dim = 1;
  int cp = 1, cp_rank = 0;
};

// The load-balancing loss's gradient in an MoE router's backward (kernels/cpu/moe.hpp, moe_aux_loss_backward):
// total_tokens of the micro-batch, the loss coefficient (0: no loss), the loss's own gradient (1 / micro-batches).
struct MoeAuxLoss {
  double total_tokens = 1, coeff = 0, loss_grad = 0;
};

struct BackendOptions {
  int threads = 1;              // CPU: compute threads of this rank
  bool shares_process = false;  // CPU: other ranks run as threads of this process (process-wide settings, such as
                                // OpenBLAS's thread count, are then left at one thread per caller)
  int device = 0;               // CUDA: the GPU ordinal
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;
  // true when weights are stored in a lower precision than fp32: the optimizer then keeps an fp32 master copy of the
  // rank's (ZeRO) shard and writes the rounded weights back.
  virtual bool keeps_master_weights() const = 0;

  // --- memory ---------------------------------------------------------------------------------------------------
  virtual Tensor allocate(std::size_t numel, DType dtype) = 0;  // contents undefined
  Tensor zeros(std::size_t numel, DType dtype);
  // dst (n) <- host values (n), converted from fp32 to dst.dtype (weights, master weights, Adam state)
  void upload_f32(const Tensor& dst, const float* host);
  // host (n) <- src (n), converted to fp32
  void download_f32(float* host, const Tensor& src);
  // dst (n) <- host int32 values (token ids)
  void upload_i32(const Tensor& dst, const int* host);
  void synchronize();

  // --- element-wise helpers -------------------------------------------------------------------------------------
  void fill(const Tensor& x, float value);                                              // x (n) = value
  void copy(const Tensor& dst, const Tensor& src);                                      // dst (n) = src (n), same dtype
  void accumulate(const Tensor& y, const Tensor& x);                                    // y (n) += x (n)
  void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b);           // out = a + b
  void bias_add(const Tensor& out, const Tensor& bias, int rows, int channels);         // out (rows, C) += bias (C)
  void bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels);  // dbias += sum_r
  double squared_norm(const Tensor& x);  // sum x^2 in double, to the host
  // sum over the tensors of their squared_norm, added in their order in double: one host read where a device
  // backend would otherwise wait for each tensor (the gradient norm reads ~300 of them a step)
  double squared_norm_sum(const std::vector<Tensor>& xs);
  double sum(const Tensor& x);  // sum x in double, to the host

  // --- embeddings -------------------------------------------------------------------------------------------------
  // out (rows, C) = wte_local[token - vocab_start] or 0 outside the shard;  tokens (rows) int32
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows, int channels,
                         int vocab_start, int vocab_local);
  void embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows, int channels,
                          int vocab_start, int vocab_local);
  // out (B, T, C) += wpe (>= T, C);  dwpe (>= T, C) += sum_b dout (B, T, C)
  void position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq, int channels);
  void position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq, int channels);

  // --- layernorm, linear, attention, GELU ---------------------------------------------------------------------------
  // out (rows, C), mean (rows), rstd (rows) <- inp (rows, C), weight (C), bias (C)
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, int rows, int channels);
  // dinp (rows, C) +=, dweight (C) +=, dbias (C) += <- dout (rows, C), inp, weight, mean, rstd
  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd, int rows,
                          int channels);
  // out (rows, out_f) = inp (rows, in_f) @ weight^T (weight (out_f, in_f)) + bias (out_f, or empty)
  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int rows,
                      int in_features, int out_features);
  // dinp (rows, in_f) = dout @ weight (empty: skipped); dweight (out_f, in_f) += dout^T @ inp (empty: skipped, a
  // zero-bubble B); dbias += sum_r dout
  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features);
  // The same GEMMs with FP8 operands: each operand quantized as its Fp8Operand says, along the GEMM's own K (TE's
  // rowwise / columnwise copies), and multiplied in fp32; the bias gradient from the unquantized dout. Returns the
  // amaxes of what it quantized. A backend without FP8 throws a RunError naming itself (the default).
  Fp8Amaxes fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int rows,
                               int in_features, int out_features, const Fp8Operand& input, const Fp8Operand& weights);
  Fp8Amaxes fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features,
                                const Fp8Operand& input, const Fp8Operand& weights, const Fp8Operand& gradient);
  // out (B, T, H*D), lse (B, H, T) fp32 <- qkv (B, T, (H + 2 KV) D) as [q | k | v]; causal, H = the rank's query
  // heads, KV its key/value heads (grouped-query attention; KV = H: multi-head, qkv (B, T, 3, H, D));
  // alibi_slopes (H) fp32: ALiBi's slope of each query head (kernels/cpu/attention.hpp), or empty for no bias
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq, int heads,
                         int kv_heads, int head_dim, const Tensor& alibi_slopes);
  // dqkv (B, T, (H + 2 KV) D) = ... <- dout (B, T, H*D), qkv, the forward's out (B, T, H*D) and lse, its
  // alibi_slopes (out gives a fused backward its rowsum(dout * out) without recomputing the probabilities' rows)
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                          const Tensor& alibi_slopes);
  void gelu_forward(const Tensor& out, const Tensor& inp);                        // out (n) = gelu(inp)
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout);  // dinp = gelu'(inp) dout

  // --- Llama-style blocks (kernels/cpu/rmsnorm.hpp, swiglu.hpp, rope.hpp) ---------------------------------------
  // out (rows, C), rstd (rows) <- inp (rows, C), weight (C)
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, int rows,
                       int channels);
  // dinp (rows, C) +=, dweight (C) += <- dout (rows, C), inp, weight, rstd
  void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd, int rows, int channels);
  // out (rows, width) = silu(gate) * up <- inp (rows, 2 width) as [gate | up]
  void swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width);
  // dinp (rows, 2 width) = ... <- inp, dout (rows, width)
  void swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width);
  // qkv (B, T, (H + 2 KV) D): rotate q and k in place by position; the backward rotates dq and dk back
  void rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim, int rotary_dim);
  void rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim, int rotary_dim);

  // --- context parallelism, the all_gather way (kernels/cpu/ring_attention.hpp) -----------------------------------
  // A backend without it throws a RunError naming itself (the default).
  // qkv (B, L, (H + 2 KV) D): rotate q and k in place by their tokens' positions in the whole sequence; the backward
  // rotates dq and dk back
  void context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim);
  void context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim);
  // keys, values (B, L, KV D) <- the key and value parts of this rank's qkv (what the all-gathers send)
  void context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                 const ContextShape& shape);
  // out (B, L, H D), lse (2, B, H, C) fp32 (per local chunk), OVERWRITTEN <- this rank's qkv against every CP rank's
  // keys and values (cp, B, L, KV D) in rank order (the all-gathers' output), causal by position in the sequence
  void context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& keys,
                                 const Tensor& values, const ContextShape& shape);
  // dqkv (B, L, (H + 2 KV) D) OVERWRITTEN: dq, and zeros where the key and value gradients go; dkeys, dvalues
  // (cp, B, L, KV D) OVERWRITTEN: this rank's share of every rank's key and value gradients (to be reduce-scattered)
  // <- dout (B, L, H D), qkv, keys, values, and the forward's out and lse
  void context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues, const Tensor& dout,
                                  const Tensor& qkv, const Tensor& keys, const Tensor& values, const Tensor& out,
                                  const Tensor& lse, const ContextShape& shape);
  // dqkv's key part (values: its value part) = grad (B, L, KV D): the reduce-scattered gradient of this rank's keys
  void context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values, const ContextShape& shape);

  // --- context parallelism, the p2p ring (kernels/cpu/ring_attention.hpp's ring steps) -----------------------------
  // A K/V block (B, L, 2 KV D): one rank's keys then values per token, what the ring moves. A backend without it
  // throws a RunError naming itself (the default).
  // kv <- the key and value parts of this rank's qkv (B, L, (H + 2 KV) D)
  void context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& shape);
  // out (B, L, H D), lse (2, B, H, C) <- merged with this rank's queries against CP rank `source`'s block kv
  // (OVERWRITTEN when source is this rank: the first step)
  void context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv, int source,
                                 const ContextShape& shape);
  // delta (2, B, H, C) fp32 <- rowsum(dout * out) of each local chunk
  void context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out, const ContextShape& shape);
  // dq (B, L, H D) += and dkv (B, L, 2 KV D) += the gradients of one step's block pairs (source's block kv)
  void context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& kv, const Tensor& lse, const Tensor& delta, int source,
                                  const ContextShape& shape);
  // dqkv (B, L, (H + 2 KV) D) OVERWRITTEN <- dq in its query part, dkv (this rank's own block's) in the rest
  void context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv, const ContextShape& shape);
  // --- context parallelism, the a2a way (DeepSpeed-Ulysses; exec/interpreter/context_a2a.cpp) ----------------------
  // A column range of a token-major tensor cut into the CP group's all-to-all blocks and back. L = seq / cp local
  // tokens (the rank's two chunks of each sequence), shape.seq the whole sequence; `heads` the range's heads of this
  // TP rank, `column` its first element of a row of `width`. A backend without it throws a RunError (the default).
  // send (cp, B, L, heads / cp D) <- the range of local (B, L, width): block d is head group d (for CP rank d)
  void ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                           const ContextShape& shape);
  // The range of local (B, L, width) <- recv (cp, B, L, heads / cp D), block d being head group d
  void ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                          const ContextShape& shape);
  // The range of full (B, seq, width), in sequence order <- blocks (cp, B, L, heads D), block r being CP rank r's
  // tokens
  void ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                  const ContextShape& shape);
  // blocks (cp, B, L, heads D) <- the range of full (B, seq, width): block r is CP rank r's tokens
  void ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                  const ContextShape& shape);

  // --- Mixture-of-Experts (kernels/cpu/moe.hpp) ---------------------------------------------------------------------
  // T tokens, E experts, k = top_k, C = hidden. Router logits, token rows and their gradients in activation_dtype();
  // probs, scores and their gradients fp32; chosen experts and row maps int32 tensors. The integer bookkeeping
  // (permutation rows, tokens per expert, split sizes) runs on the host from the downloaded chosen experts: the one
  // host wait per layer Megatron-Core also pays (model/ops/moe_host_sync.hpp). Counts, chunk sizes and rows per local
  // expert are host vectors. A backend without MoE throws a RunError naming itself (the default).
  // host (n) <- src (n) int32
  void download_i32(int* host, const Tensor& src);
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

  // --- vocab-parallel cross-entropy (kernels/cpu/cross_entropy.hpp) -----------------------------------------------
  // stats (rows, 3) fp32 <- logits (rows, V_local), targets (rows) int32
  void cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                 int vocab_start, int vocab_local, int valid_vocab);
  // losses (rows), lse (rows) fp32 <- gathered stats (shards, rows, 3)
  void cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                             int shards);
  // dlogits (rows, V_local) = scale * (softmax - onehot); may alias logits
  void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              int rows, int vocab_start, int vocab_local, int valid_vocab, float scale);

  // --- optimizer
  // ------------------------------------------------------------------------------------------------------ AdamW on n
  // elements: param (n, activation dtype), master (n fp32; empty unless keeps_master_weights()), grad, m, v (n fp32).
  // With a master copy the update runs on it and param receives it rounded.
  void adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const AdamWStep& step);

 protected:
  // The kernels, as the public methods of the same name describe them, called after their shape checks.
  virtual void do_upload_f32(const Tensor& dst, const float* host) = 0;
  virtual void do_download_f32(float* host, const Tensor& src) = 0;
  virtual void do_upload_i32(const Tensor& dst, const int* host) = 0;
  virtual void do_synchronize() = 0;
  virtual void do_fill(const Tensor& x, float value) = 0;
  virtual void do_copy(const Tensor& dst, const Tensor& src) = 0;
  virtual void do_accumulate(const Tensor& y, const Tensor& x) = 0;
  virtual void do_residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  virtual void do_bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) = 0;
  virtual void do_bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) = 0;
  virtual double do_squared_norm(const Tensor& x) = 0;
  virtual double do_squared_norm_sum(const std::vector<Tensor>& xs);
  virtual double do_sum(const Tensor& x) = 0;
  virtual void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows,
                                    int channels, int vocab_start, int vocab_local) = 0;
  virtual void do_embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows,
                                     int channels, int vocab_start, int vocab_local) = 0;
  virtual void do_position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq,
                                             int channels) = 0;
  virtual void do_position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq,
                                              int channels) = 0;
  virtual void do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                    const Tensor& weight, const Tensor& bias, int rows, int channels) = 0;
  virtual void do_layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     int rows, int channels) = 0;
  virtual void do_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                 int rows, int in_features, int out_features) = 0;
  virtual void do_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, int rows, int in_features,
                                  int out_features) = 0;
  virtual Fp8Amaxes do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                          const Tensor& bias, int rows, int in_features, int out_features,
                                          const Fp8Operand& input, const Fp8Operand& weights);
  virtual Fp8Amaxes do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                           const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                           int in_features, int out_features, const Fp8Operand& input,
                                           const Fp8Operand& weights, const Fp8Operand& gradient);
  virtual void do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq,
                                    int heads, int kv_heads, int head_dim, const Tensor& alibi_slopes) = 0;
  virtual void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                                     const Tensor& alibi_slopes) = 0;
  virtual void do_gelu_forward(const Tensor& out, const Tensor& inp) = 0;
  virtual void do_gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) = 0;
  virtual void do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                  int rows, int channels) = 0;
  virtual void do_rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                   const Tensor& weight, const Tensor& rstd, int rows, int channels) = 0;
  virtual void do_swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) = 0;
  virtual void do_swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) = 0;
  virtual void do_rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                               int rotary_dim) = 0;
  virtual void do_rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                                int rotary_dim) = 0;
  virtual void do_context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim);
  virtual void do_context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim);
  virtual void do_context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                            const ContextShape& shape);
  virtual void do_context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& keys,
                                            const Tensor& values, const ContextShape& shape);
  virtual void do_context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues,
                                             const Tensor& dout, const Tensor& qkv, const Tensor& keys,
                                             const Tensor& values, const Tensor& out, const Tensor& lse,
                                             const ContextShape& shape);
  virtual void do_context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                             const ContextShape& shape);
  virtual void do_context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& shape);
  virtual void do_context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                            int source, const ContextShape& shape);
  virtual void do_context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out,
                                     const ContextShape& shape);
  virtual void do_context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                             const Tensor& kv, const Tensor& lse, const Tensor& delta, int source,
                                             const ContextShape& shape);
  virtual void do_context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                         const ContextShape& shape);
  virtual void do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                                      const ContextShape& shape);
  virtual void do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                                     const ContextShape& shape);
  virtual void do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                             const ContextShape& shape);
  virtual void do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                             const ContextShape& shape);
  virtual void do_download_i32(int* host, const Tensor& src);
  virtual void do_moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                           int experts, int top_k);
  virtual void do_moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts);
  virtual double do_moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens,
                                         int experts, int top_k, double total_tokens, double coeff);
  virtual void do_moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs,
                                      const Tensor& chosen, const Tensor& scores, const std::vector<float>& counts,
                                      int tokens, int experts, int top_k, const MoeAuxLoss& aux);
  virtual void do_moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                                      int top_k);
  virtual void do_moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens,
                                       int hidden, int top_k);
  virtual void do_moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                        int tokens, int hidden, int top_k);
  virtual void do_moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout,
                                         const Tensor& inp, const Tensor& probs, const Tensor& rows, int tokens,
                                         int hidden, int top_k);
  virtual void do_moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                          const std::vector<int>& order, int hidden);
  virtual void do_moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                           const std::vector<int>& order, int hidden);
  virtual void do_moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                             const std::vector<int>& rows_per_group, int in_features, int out_features);
  virtual void do_moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                              const Tensor& inp, const Tensor& weights,
                                              const std::vector<int>& rows_per_group, int in_features,
                                              int out_features);
  virtual void do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                            int vocab_start, int vocab_local, int valid_vocab) = 0;
  virtual void do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                        int shards) = 0;
  virtual void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                         const Tensor& targets, int rows, int vocab_start, int vocab_local,
                                         int valid_vocab, float scale) = 0;
  virtual void do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                               const Tensor& v, const AdamWStep& step) = 0;
};

}  // namespace twin::exec
