// The GPT trainer's kernel calls on the CUDA twins (kernels/cuda): bf16 activations and working weights, fp32
// gradients, fp32 master weights and AdamW state, one stream, one cuBLASLt handle. The same calls as ops_cpu.hpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cuda/kernels.cuh"

namespace twin::bench {

class CudaOps {
 public:
  using act = __nv_bfloat16;
  static constexpr bool kMasterWeights = true;
  const char* name() const { return "cuda"; }

  CudaOps() {
    TWIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // the kernels' scratch (attention scores, column sums) comes from the stream-ordered pool: keep it across steps
    int device = 0;
    TWIN_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPool_t pool = nullptr;
    TWIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    std::uint64_t threshold = UINT64_MAX;
    TWIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    TWIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&result_), 2 * sizeof(double)));
    blas_ = std::make_unique<kernels::cuda::Cublas>();
  }
  ~CudaOps() {
    blas_.reset();
    for (void* p : buffers_) cudaFree(p);
    cudaFree(result_);
    cudaStreamDestroy(stream_);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  cudaStream_t stream() const { return stream_; }

  // --- memory -----------------------------------------------------------------------------------------------------
  template <class T>
  T* allocate(std::size_t n) {
    void* p = nullptr;
    TWIN_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T) + 1));
    buffers_.push_back(p);
    TWIN_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T) + 1));
    return static_cast<T*>(p);
  }
  // master (n) <- host fp32, weights (n) = bf16(master)
  void upload_weights(act* weights, float* master, const float* host, std::size_t n) {
    TWIN_CUDA_CHECK(cudaMemcpy(master, host, n * sizeof(float), cudaMemcpyHostToDevice));
    kernels::cuda::cast_float_to_bf16(weights, master, n, stream_);
    synchronize();
  }
  void upload_tokens(int* dst, const int* host, std::size_t n) {
    TWIN_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    synchronize();  // host memory is pageable and reused by the caller
  }
  void synchronize() { TWIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // --- kernels ------------------------------------------------------------------------------------------------------
  void zero(float* x, std::size_t n) { kernels::cuda::fill(x, n, 0.0f, stream_); }
  void zero(act* x, std::size_t n) { kernels::cuda::fill(x, n, 0.0f, stream_); }
  void encoder_forward(act* out, const int* tokens, const act* wte, const act* wpe, int batch, int seq, int C,
                       int vocab) {
    kernels::cuda::embedding_forward(out, tokens, wte, batch * seq, C, 0, vocab, stream_);
    kernels::cuda::position_embedding_forward(out, wpe, batch, seq, C, stream_);
  }
  void encoder_backward(float* dwte, float* dwpe, const act* dout, const int* tokens, int batch, int seq, int C,
                        int vocab) {
    kernels::cuda::embedding_backward(dwte, dout, tokens, batch * seq, C, 0, vocab, stream_);
    kernels::cuda::position_embedding_backward(dwpe, dout, batch, seq, C, stream_);
  }
  void layernorm_forward(act* out, float* mean, float* rstd, const act* inp, const act* w, const act* b, int rows,
                         int C) {
    kernels::cuda::layernorm_forward(out, mean, rstd, inp, w, b, rows, C, stream_);
  }
  void residual_layernorm_forward(act* residual, act* out, float* mean, float* rstd, const act* a, const act* b,
                                  const act* w, const act* bias, int rows, int C) {
    kernels::cuda::residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, rows, C, stream_);
  }
  void layernorm_backward(act* dinp, float* dw, float* db, const act* dout, const act* inp, const act* w,
                          const float* mean, const float* rstd, int rows, int C) {
    kernels::cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, C, stream_);
  }
  void matmul_forward(act* out, const act* inp, const act* w, const act* b, int rows, int in, int out_f) {
    kernels::cuda::matmul_forward(out, inp, w, b, rows, in, out_f, *blas_, stream_);
  }
  void matmul_forward_gelu(act* out, act* pre, const act* inp, const act* w, const act* b, int rows, int in,
                           int out_f) {
    if (out_f % 8 == 0) {
      kernels::cuda::matmul_forward_gelu(out, pre, inp, w, b, rows, in, out_f, *blas_, stream_);
    } else {
      kernels::cuda::matmul_forward(pre, inp, w, b, rows, in, out_f, *blas_, stream_);
      kernels::cuda::gelu_forward(out, pre, static_cast<std::size_t>(rows) * out_f, stream_);
    }
  }
  void matmul_backward(act* dinp, float* dw, float* db, const act* dout, const act* inp, const act* w, int rows, int in,
                       int out_f) {
    kernels::cuda::matmul_backward(dinp, dw, db, dout, inp, w, rows, in, out_f, *blas_, stream_);
  }
  void gelu_backward(act* dinp, const act* inp, const act* dout, std::size_t n) {
    kernels::cuda::gelu_backward(dinp, inp, dout, n, stream_);
  }
  void attention_forward(act* out, float* lse, const act* qkv, int B, int T, int H, int D) {
    kernels::cuda::attention_forward(out, lse, qkv, B, T, H, D, *blas_, stream_);
  }
  void attention_backward(act* dqkv, const act* dout, const act* qkv, const float* lse, int B, int T, int H, int D) {
    kernels::cuda::attention_backward(dqkv, dout, qkv, lse, B, T, H, D, *blas_, stream_);
  }
  void cross_entropy_forward(float* losses, float* lse, float* stats, const act* logits, const int* targets, int rows,
                             int padded_vocab, int vocab) {
    kernels::cuda::cross_entropy_local_stats(stats, logits, targets, rows, 0, padded_vocab, vocab, stream_);
    kernels::cuda::cross_entropy_combine(losses, lse, stats, rows, 1, stream_);
  }
  void cross_entropy_backward(act* dlogits, const act* logits, const float* lse, const int* targets, int rows,
                              int padded_vocab, int vocab, float scale) {
    kernels::cuda::cross_entropy_backward(dlogits, logits, lse, targets, rows, 0, padded_vocab, vocab, scale, stream_);
  }
  double sum(const float* x, std::size_t n) {
    kernels::cuda::sum(result_, x, n, stream_);
    return read_result();
  }
  double squared_norm(const float* x, std::size_t n) {
    kernels::cuda::squared_norm(result_, x, n, stream_);
    return read_result();
  }
  void adamw(act* weights, float* master, const float* grad, float* m, float* v, std::size_t n, float lr,
             float weight_decay, int step, float grad_scale) {
    kernels::cuda::adamw_update(weights, master, grad, m, v, n, lr, 0.9f, 0.95f, 1e-8f, weight_decay, step, grad_scale,
                                stream_);
  }

 private:
  double read_result() {
    double value = 0.0;
    TWIN_CUDA_CHECK(cudaMemcpyAsync(&value, result_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return value;
  }

  cudaStream_t stream_ = nullptr;
  double* result_ = nullptr;
  std::unique_ptr<kernels::cuda::Cublas> blas_;
  std::vector<void*> buffers_;
};

}  // namespace twin::bench
