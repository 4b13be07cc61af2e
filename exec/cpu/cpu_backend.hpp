// The CPU backend: fp32 activations, weights, gradients and Adam state in host memory; kernels/cpu for every kernel
// (OpenBLAS sgemm for the linear layers and the blocked causal attention).
// Allocations come from a per-backend cache of 64-byte aligned blocks, so a training step maps no new pages.
// Threads: row-independent kernels (attention per sequence, GELU, layernorm and cross-entropy rows) run on a pool of
// options.threads. OpenBLAS's thread count is process-wide: a rank alone in its process sets it to options.threads
// (and to 1 while sequences run in parallel); ranks sharing a process all leave it at 1.
#pragma once

#include <functional>
#include <memory>

#include "exec/core/backend.hpp"

namespace twin::exec::cpu {

class ThreadPool;
struct BlockCache;

class CpuBackend final : public Backend, public MoeKernels, public ContextKernels, public Fp8Kernels {
 public:
  explicit CpuBackend(const BackendOptions& options = {});
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::Host; }
  DType activation_dtype() const override { return DType::F32; }
  bool keeps_master_weights() const override { return false; }

  Tensor allocate(std::size_t numel, DType dtype) override;

 protected:  // the kernels, after Backend's shape checks
  void do_upload_f32(const Tensor& dst, const float* host) override;
  void do_download_f32(float* host, const Tensor& src) override;
  void do_upload_i32(const Tensor& dst, const int* host) override;
  void do_synchronize() override {}

  void do_fill(const Tensor& x, float value) override;
  void do_copy(const Tensor& dst, const Tensor& src) override;
  void do_accumulate(const Tensor& y, const Tensor& x) override;
  void do_residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void do_bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) override;
  void do_bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) override;
  double do_squared_norm(const Tensor& x) override;
  double do_sum(const Tensor& x) override;

  void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows, int channels,
                            int vocab_start, int vocab_local) override;
  void do_embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows, int channels,
                             int vocab_start, int vocab_local) override;
  void do_position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq, int channels) override;
  void do_position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq,
                                      int channels) override;

  void do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                            const Tensor& weight, const Tensor& bias, int rows, int channels) override;
  void do_layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd, int rows,
                             int channels) override;
  void do_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int rows,
                         int in_features, int out_features) override;
  void do_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, int rows, int in_features,
                          int out_features) override;
  // FP8 emulated: kernels/cpu/fp8_matmul.hpp (its backward computes dX and dW apart where one is not asked for)
  bool splits_fp8_backward() const override { return true; }
  Fp8Amaxes do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                  int rows, int in_features, int out_features, const Fp8Operand& input,
                                  const Fp8Operand& weights) override;
  Fp8Amaxes do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features,
                                   const Fp8Operand& input, const Fp8Operand& weights,
                                   const Fp8Operand& gradient) override;
  void do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq, int heads,
                            int kv_heads, int head_dim, const Tensor& alibi_slopes) override;
  // the plain attention's backward (kernels/cpu/attention.hpp): it recomputes the probabilities and needs no `out`
  void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                             const Tensor& alibi_slopes) override;
  void do_gelu_forward(const Tensor& out, const Tensor& inp) override;
  void do_gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override;

  void do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, int rows,
                          int channels) override;
  void do_rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd, int rows, int channels) override;
  void do_swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) override;
  void do_swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) override;
  void do_rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                       int rotary_dim) override;
  void do_rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                        int rotary_dim) override;

  // context parallelism, the all_gather way: exec/cpu/cpu_context_parallel.cpp
  void do_context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim) override;
  void do_context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim) override;
  void do_context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                    const ContextShape& shape) override;
  void do_context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& keys,
                                    const Tensor& values, const ContextShape& shape) override;
  void do_context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues, const Tensor& dout,
                                     const Tensor& qkv, const Tensor& keys, const Tensor& values, const Tensor& out,
                                     const Tensor& lse, const ContextShape& shape) override;
  void do_context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                     const ContextShape& shape) override;
  // context parallelism, the p2p ring: exec/cpu/cpu_context_ring.cpp
  void do_context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& shape) override;
  void do_context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                    int source, const ContextShape& shape) override;
  void do_context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out,
                             const ContextShape& shape) override;
  void do_context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                     const Tensor& kv, const Tensor& lse, const Tensor& delta, int source,
                                     const ContextShape& shape) override;
  void do_context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                 const ContextShape& shape) override;

  // context parallelism, the a2a way: exec/cpu/cpu_context_a2a.cpp
  void do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                              const ContextShape& shape) override;
  void do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                             const ContextShape& shape) override;
  void do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                     const ContextShape& shape) override;
  void do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                     const ContextShape& shape) override;

  // Mixture-of-Experts: exec/cpu/cpu_moe.cpp
  void do_download_i32(int* host, const Tensor& src) override;
  void do_moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                   int experts, int top_k) override;
  void do_moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) override;
  double do_moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                                 int top_k, double total_tokens, double coeff) override;
  void do_moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs, const Tensor& chosen,
                              const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                              int top_k, const MoeAuxLoss& aux) override;
  void do_moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                              int top_k) override;
  void do_moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens, int hidden,
                               int top_k) override;
  void do_moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                int tokens, int hidden, int top_k) override;
  void do_moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout, const Tensor& inp,
                                 const Tensor& probs, const Tensor& rows, int tokens, int hidden, int top_k) override;
  void do_moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                  const std::vector<int>& order, int hidden) override;
  void do_moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                   const std::vector<int>& order, int hidden) override;
  void do_moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                     const std::vector<int>& rows_per_group, int in_features,
                                     int out_features) override;
  void do_moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout, const Tensor& inp,
                                      const Tensor& weights, const std::vector<int>& rows_per_group, int in_features,
                                      int out_features) override;

  void do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                    int vocab_start, int vocab_local, int valid_vocab) override;
  void do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                int shards) override;
  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                 int rows, int vocab_start, int vocab_local, int valid_vocab, float scale) override;

  void do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWStep& step) override;

 private:
  // fn(begin, end) over [0, rows) in a few contiguous ranges, on the pool when there is one
  void for_rows(int rows, const std::function<void(int, int)>& fn);
  // the attention GEMMs run one head per pool thread, each GEMM on one BLAS thread
  template <typename Fn>
  void with_single_threaded_blas(Fn&& fn);

  int threads_ = 1;
  bool owns_blas_ = false;  // alone in the process: may set OpenBLAS's thread count
  std::unique_ptr<ThreadPool> pool_;
  std::shared_ptr<BlockCache> cache_;
};

}  // namespace twin::exec::cpu
