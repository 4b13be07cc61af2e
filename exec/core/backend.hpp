// Backend: the seam between the interpreter and a device. It owns memory (allocate, host copies) and runs every kernel
// of a GPT on Tensors. The interpreter (exec/interpreter/*.cpp) only ever calls these methods, so a new device plugs in
// by implementing this class; nothing in the interpreter changes.
//
//   cpu   exec/cpu/cpu_backend.cpp: fp32 everywhere, kernels/cpu (OpenBLAS sgemm)
//   cuda  bf16 activations and working weights, fp32 gradients, fp32 master weights and Adam state,
//         cuBLASLt GEMMs, kernels/cuda; the collectives go to an NCCL Communicator on device pointers.
//
// The core is memory and the dense GPT kernels: what a new device must implement (the protected do_ methods below).
// Mixture-of-Experts, context-parallel attention and FP8 GEMMs are capabilities a backend may add
// (exec/core/moe_kernels.hpp, context_kernels.hpp, fp8_kernels.hpp; moe(), context(), fp8() return nullptr where it has
// none); check_supported (exec/train/check_supported.hpp) refuses a Program that needs a missing one before training.
//
// The public methods are not virtual: each checks its operands' shapes once, for every backend (exec/core/backend.cpp
// and each capability's .cpp), runs the kernel hook if one is set (exec/core/kernel_hook.hpp: the deferred-collective
// emulation's checks), then calls the protected virtual do_ method of the same name (the non-virtual interface idiom).
// A backend's do_ methods may assume the documented shapes; they check only what their own device needs (dtypes and
// device pointers on the GPU, a row map's contents on the host).
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

#include "exec/core/context_kernels.hpp"
#include "exec/core/fp8_kernels.hpp"
#include "exec/core/kernel_hook.hpp"
#include "exec/core/moe_kernels.hpp"
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

struct BackendOptions {
  int threads = 1;              // CPU: compute threads of this rank
  bool shares_process = false;  // CPU: other ranks run as threads of this process (process-wide settings, such as
                                // OpenBLAS's thread count, are then left at one thread per caller)
  int device = 0;               // CUDA: the GPU ordinal
};

class Backend : public HookPoint {
 public:
  virtual ~Backend();

  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;
  // true when weights are stored in a lower precision than fp32: the optimizer then keeps an fp32 master copy of the
  // rank's (ZeRO) shard and writes the rounded weights back.
  virtual bool keeps_master_weights() const = 0;

  // --- capabilities: the kernels beyond the dense core, nullptr where this backend has none (check_supported,
  // exec/train/check_supported.hpp, refuses a Program that needs one before training) ---------------------------------
  MoeKernels* moe() const { return moe_kernels_; }
  ContextKernels* context() const { return context_kernels_; }
  Fp8Kernels* fp8() const { return fp8_kernels_; }
  // The same, or a RunError naming this backend and the scenario key that asked for it
  MoeKernels& moe_kernels() const;
  ContextKernels& context_kernels() const;
  Fp8Kernels& fp8_kernels() const;

  // Runs `hook` before each kernel and host wait of this backend and its capabilities (exec/core/kernel_hook.hpp);
  // the backend owns it. nullptr removes it.
  void set_kernel_hook(std::unique_ptr<KernelHook> hook);

  // --- memory ---------------------------------------------------------------------------------------------------
  virtual Tensor allocate(std::size_t numel, DType dtype) = 0;  // contents undefined
  Tensor zeros(std::size_t numel, DType dtype);
  // dst (n) <- host values (n), converted from fp32 to dst.dtype (weights, master weights, Adam state)
  void upload_f32(const Tensor& dst, const float* host);
  // host (n) <- src (n), converted to fp32
  void download_f32(float* host, const Tensor& src);
  // host (n) <- src (n) int32 (MoE's chosen experts)
  void download_i32(int* host, const Tensor& src);
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
  virtual void do_download_i32(int* host, const Tensor& src) = 0;
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
  virtual void do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                            int vocab_start, int vocab_local, int valid_vocab) = 0;
  virtual void do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                        int shards) = 0;
  virtual void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                         const Tensor& targets, int rows, int vocab_start, int vocab_local,
                                         int valid_vocab, float scale) = 0;
  virtual void do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                               const Tensor& v, const AdamWStep& step) = 0;

  // A backend's constructor names the capabilities it implements (usually itself: class CpuBackend : public Backend,
  // public MoeKernels, ...).
  void provide(MoeKernels* moe, ContextKernels* context, Fp8Kernels* fp8) {
    moe_kernels_ = moe;
    context_kernels_ = context;
    fp8_kernels_ = fp8;
  }

 private:
  MoeKernels* moe_kernels_ = nullptr;
  ContextKernels* context_kernels_ = nullptr;
  Fp8Kernels* fp8_kernels_ = nullptr;
  std::unique_ptr<KernelHook> hook_;
};

}  // namespace twin::exec
