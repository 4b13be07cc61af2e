// The CUDA backend: one GPU per backend (several backends, one per rank thread, may share a GPU). bf16 activations,
// working weights and activation gradients; fp32 parameter gradients, Adam state and master weights (the optimizer
// updates the fp32 master copy and writes the weights back rounded, keeps_master_weights() = true); kernels/cuda for
// every kernel, cuBLASLt for the GEMMs. Every kernel runs on the backend's compute stream, asynchronously; host copies
// and the reductions that return a value to the host (squared_norm, sum) synchronize that stream.
//
// Memory: stream-ordered (cudaMallocAsync / cudaFreeAsync on the compute stream, pool kept across steps), so a
// training step allocates from the pool without device synchronization; a Tensor's storage keeps the stream alive.
//
// Communication: the interpreter hands tensors' device pointers to its Communicator; make_device_communicator
// (cuda_exec.hpp) wraps the host communicator so that it accepts them, ordered with this compute stream
// (device_context()).
#pragma once

#include <cuda_bf16.h>

#include <array>
#include <memory>

#include "exec/core/backend.hpp"
#include "exec/cuda/device_context.hpp"

namespace twin::kernels::cuda {
class Cublas;
class Fp8GemmPlans;
}  // namespace twin::kernels::cuda

namespace twin::exec::cuda {

class CudaBackend final : public Backend, public MoeKernels, public ContextKernels, public Fp8Kernels {
 public:
  // options.device: the GPU ordinal (cudaSetDevice on the calling thread).
  explicit CudaBackend(const BackendOptions& options = {});
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::Cuda; }
  DType activation_dtype() const override { return DType::BF16; }
  bool keeps_master_weights() const override { return true; }

  Tensor allocate(std::size_t numel, DType dtype) override;

 protected:  // the kernels, after the shape checks of Backend and its capabilities
  void do_upload_f32(const Tensor& dst, const float* host) override;
  void do_download_f32(float* host, const Tensor& src) override;
  void do_upload_i32(const Tensor& dst, const int* host) override;
  void do_synchronize() override;

  void do_fill(const Tensor& x, float value) override;
  void do_copy(const Tensor& dst, const Tensor& src) override;
  void do_accumulate(const Tensor& y, const Tensor& x) override;
  void do_residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void do_bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) override;
  void do_bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) override;
  double do_squared_norm(const Tensor& x) override;
  double do_squared_norm_sum(const std::vector<Tensor>& xs) override;  // one synchronization for all of them
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
  void do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq, int heads,
                            int kv_heads, int head_dim, const Tensor& alibi_slopes) override;
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

  // --- context parallelism: the all_gather way, the p2p ring, the a2a way (exec/cuda/cuda_backend_context.cpp,
  // kernels/cuda/context_parallel.cuh); bf16 tensors, fp32 lse and delta
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
  void do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                              const ContextShape& shape) override;
  void do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                             const ContextShape& shape) override;
  void do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                     const ContextShape& shape) override;
  void do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                     const ContextShape& shape) override;
  // --- end of context parallelism

  void do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                    int vocab_start, int vocab_local, int valid_vocab) override;
  void do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                int shards) override;
  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                 int rows, int vocab_start, int vocab_local, int valid_vocab, float scale) override;

  void do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWStep& step) override;

  // --- MoE (exec/cuda/cuda_backend_moe.cpp: kernels/cuda/moe.cuh; grouped GEMMs one cuBLASLt GEMM per local expert)
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

 private:
  // The grouped GEMMs' cuBLASLt handle, made at the first one: without autotuning (the rows per expert change every
  // micro-batch, and autotuning times each new problem with a host wait); the heuristic's first algorithm
  kernels::cuda::Cublas& expert_blas();
  std::unique_ptr<kernels::cuda::Cublas> expert_blas_;

 public:
  // --- end MoE

  // The device and compute stream of this rank, for the communicators (and deferred waits, see device_context.hpp).
  DeviceContext& device_context() { return *context_; }

 private:
  double read_result();  // the device double of squared_norm / sum, after synchronizing

  // The device pointer of a tensor that must be on this backend's device, with this dtype, and not empty. The kernel
  // about to touch it is ordered after the deferred collectives that hold its memory (DeviceContext::order_touch).
  void* checked(const Tensor& t, DType dtype, const char* kernel, const char* tensor);
  __nv_bfloat16* b16(const Tensor& t, const char* kernel, const char* tensor) {
    return static_cast<__nv_bfloat16*>(checked(t, DType::BF16, kernel, tensor));
  }
  float* f32(const Tensor& t, const char* kernel, const char* tensor) {
    return static_cast<float*>(checked(t, DType::F32, kernel, tensor));
  }
  int* i32(const Tensor& t, const char* kernel, const char* tensor) {
    return static_cast<int*>(checked(t, DType::I32, kernel, tensor));
  }
  // nullptr for an empty (optional) tensor
  __nv_bfloat16* optional_b16(const Tensor& t, const char* kernel, const char* tensor) {
    return t.empty() ? nullptr : b16(t, kernel, tensor);
  }
  float* optional_f32(const Tensor& t, const char* kernel, const char* tensor) {
    return t.empty() ? nullptr : f32(t, kernel, tensor);
  }

  std::shared_ptr<DeviceContext> context_;  // shared with every Tensor's deleter: the stream outlives the memory
  std::unique_ptr<kernels::cuda::Cublas> blas_;
  Tensor result_;  // (1) f64 on the device
  Tensor norms_;   // (tensors) f64 on the device: squared_norm_sum's terms
  // Pinned host slots of upload_i32 (token ids, every micro-batch): the copy runs after the call returns, with no host
  // wait; a slot is reused once the copy that read it kUploadSlots uploads ago has finished (long done by then).
  struct Upload {
    int* host = nullptr;
    std::size_t capacity = 0;  // ints
    cudaEvent_t done = nullptr;
  };
  static constexpr std::size_t kUploadSlots = 4;
  std::array<Upload, kUploadSlots> uploads_{};
  std::size_t next_upload_ = 0;

  // --- FP8: cuBLASLt's FP8 GEMMs on sm_90 and later (exec/cuda/cuda_backend_fp8.cpp, kernels/cuda/fp8_matmul.cuh) ---
 protected:
  // Per-tensor recipes (delayed, tensorwise) on cuBLASLt's FP8 GEMM, block-scaled ones (blockwise, mxfp8) quantized
  // then dequantized to bf16 and multiplied at the bf16 rate. The returned amaxes are read back (one synchronization
  // per call).
  Fp8Amaxes do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                  int rows, int in_features, int out_features, const Fp8Operand& input,
                                  const Fp8Operand& weights) override;
  Fp8Amaxes do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features,
                                   const Fp8Operand& input, const Fp8Operand& weights,
                                   const Fp8Operand& gradient) override;
 public:
  int compute_capability() const;  // 10 * major + minor of this backend's GPU (90: sm_90)

 private:
  std::shared_ptr<kernels::cuda::Fp8GemmPlans> fp8_plans_;  // made on the first FP8 call
  Tensor fp8_amaxes_;                                       // (3) f32: input, weight, gradient of the last call
};

}  // namespace twin::exec::cuda
