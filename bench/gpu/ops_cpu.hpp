// The GPT trainer's kernel calls on the CPU twins (kernels/cpu): fp32 everywhere, the weights are their own master
// copy. The same calls as ops_cuda.hpp, so that gpt.hpp runs one model on either side and the loss curves can be
// compared.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/kernels.hpp"

namespace twin::bench {

class CpuOps {
 public:
  using act = float;  // activations and working weights
  static constexpr bool kMasterWeights = false;
  const char* name() const { return "cpu"; }

  // --- memory: owned here, zeroed, freed with the object ------------------------------------------------------------
  template <class T>
  T* allocate(std::size_t n) {
    buffers_.push_back(std::make_unique<unsigned char[]>(n * sizeof(T) + 1));
    std::memset(buffers_.back().get(), 0, n * sizeof(T) + 1);
    return reinterpret_cast<T*>(buffers_.back().get());
  }
  // weights (n) <- host fp32 values; master is nullptr here
  void upload_weights(float* weights, float* /*master*/, const float* host, std::size_t n) {
    std::memcpy(weights, host, n * sizeof(float));
  }
  void upload_tokens(int* dst, const int* host, std::size_t n) { std::memcpy(dst, host, n * sizeof(int)); }
  void synchronize() {}

  // --- kernels ------------------------------------------------------------------------------------------------------
  void zero(float* x, std::size_t n) { kernels::cpu::fill(x, n, 0.0f); }
  void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int batch, int seq, int C,
                       int vocab) {
    kernels::cpu::embedding_forward(out, tokens, wte, batch * seq, C, 0, vocab);
    kernels::cpu::position_embedding_forward(out, wpe, batch, seq, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int batch, int seq, int C,
                        int vocab) {
    kernels::cpu::embedding_backward(dwte, dout, tokens, batch * seq, C, 0, vocab);
    kernels::cpu::position_embedding_backward(dwpe, dout, batch, seq, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int rows, int C) {
    kernels::cpu::layernorm_forward(out, mean, rstd, inp, w, b, rows, C);
  }
  void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b,
                                  const float* w, const float* bias, int rows, int C) {
    kernels::cpu::residual_forward(residual, a, b, static_cast<std::size_t>(rows) * C);
    kernels::cpu::layernorm_forward(out, mean, rstd, residual, w, bias, rows, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int rows, int C) {
    kernels::cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* b, int rows, int in, int out_f) {
    kernels::cpu::matmul_forward(out, inp, w, b, rows, in, out_f);
  }
  void matmul_forward_gelu(float* out, float* pre, const float* inp, const float* w, const float* b, int rows, int in,
                           int out_f) {
    kernels::cpu::matmul_forward(pre, inp, w, b, rows, in, out_f);
    kernels::cpu::gelu_forward(out, pre, static_cast<std::size_t>(rows) * out_f);
  }
  void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, int rows,
                       int in, int out_f) {
    kernels::cpu::matmul_backward(dinp, dw, db, dout, inp, w, rows, in, out_f);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) {
    kernels::cpu::gelu_backward(dinp, inp, dout, n);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int D) {
    kernels::cpu::attention_forward(out, lse, qkv, B, T, H, D);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int H,
                          int D) {
    kernels::cpu::attention_backward(dqkv, dout, qkv, lse, B, T, H, D);
  }
  // losses (rows), lse (rows) <- logits (rows, padded_vocab); one shard, scratch stats (rows, 3)
  void cross_entropy_forward(float* losses, float* lse, float* stats, const float* logits, const int* targets, int rows,
                             int padded_vocab, int vocab) {
    kernels::cpu::cross_entropy_local_stats(stats, logits, targets, rows, 0, padded_vocab, vocab);
    kernels::cpu::cross_entropy_combine(losses, lse, stats, rows, 1);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int* targets, int rows,
                              int padded_vocab, int vocab, float scale) {
    kernels::cpu::cross_entropy_backward(dlogits, logits, lse, targets, rows, 0, padded_vocab, vocab, scale);
  }
  double sum(const float* x, std::size_t n) {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
  double squared_norm(const float* x, std::size_t n) { return kernels::cpu::squared_norm(x, n); }
  void adamw(float* weights, float* /*master*/, const float* grad, float* m, float* v, std::size_t n, float lr,
             float weight_decay, int step, float grad_scale) {
    kernels::cpu::adamw_update(weights, grad, m, v, n, lr, 0.9f, 0.95f, 1e-8f, weight_decay, step, grad_scale);
  }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> buffers_;
};

}  // namespace twin::bench
