#include "exec/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "exec/core/check.hpp"
#include "kernels/cpu/cast.hpp"
#include "kernels/cuda/kernels.cuh"

namespace twin::exec::cuda {

namespace k = twin::kernels::cuda;
using bf16 = __nv_bfloat16;

CudaBackend::CudaBackend(const BackendOptions& options)
    : context_(std::make_shared<DeviceContext>(options.device)), blas_(std::make_unique<k::Cublas>()) {
  // keep freed blocks in the device's pool across steps (the default threshold returns them at every synchronize)
  cudaMemPool_t pool = nullptr;
  TWIN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, context_->device()));
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  TWIN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  result_ = allocate(1, DType::F64);
  provide(this, this, this);  // MoE, context parallelism, FP8 (on sm_90 and later: require_fp8_gemms)
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(context_->device());  // no throw from a destructor
  for (Upload& slot : uploads_) {
    if (slot.done != nullptr) {
      cudaEventSynchronize(slot.done);
      cudaEventDestroy(slot.done);
    }
    if (slot.host != nullptr) cudaFreeHost(slot.host);
  }
}

void* CudaBackend::checked(const Tensor& t, DType dtype, const char* kernel, const char* tensor) {
  TWIN_EXEC_CHECK(!t.empty(), "cuda {}: {} is empty", kernel, tensor);
  TWIN_EXEC_CHECK(t.device == Device::Cuda && t.dtype == dtype,
                  "cuda {}: {} must be a {} tensor on the GPU, not {} on the {}", kernel, tensor, to_string(dtype),
                  to_string(t.dtype), t.device == Device::Cuda ? "GPU" : "host");
  context_->order_touch(t.data, t.bytes());
  return t.data;
}

// --- memory ----------------------------------------------------------------------------------------------------------

Tensor CudaBackend::allocate(std::size_t numel, DType dtype) {
  Tensor t;
  t.dtype = dtype;
  t.device = Device::Cuda;
  t.numel = numel;
  if (numel == 0) return t;
  // whole 256-byte units: every tensor starts 256-byte aligned (cuBLASLt's fastest kernels want 16)
  const std::size_t bytes = (numel * dtype_bytes(dtype) + 255) / 256 * 256;
  void* block = nullptr;
  TWIN_CUDA_CHECK(cudaMallocAsync(&block, bytes, context_->compute()));
  t.storage = std::shared_ptr<void>(block, [context = context_, bytes](void* p) {
    context->release(p, bytes);  // stream-ordered, and after any send still reading it
  });
  t.data = block;
  return t;
}

void CudaBackend::do_upload_f32(const Tensor& dst, const float* host) {
  if (dst.numel == 0) return;
  std::vector<std::uint16_t> bits;  // bf16: rounded on the host exactly as kernels/cpu rounds
  if (dst.dtype == DType::F32) {
    TWIN_CUDA_CHECK(
        cudaMemcpyAsync(f32(dst, "upload_f32", "dst"), host, dst.bytes(), cudaMemcpyHostToDevice, context_->compute()));
  } else {
    bits.resize(dst.numel);
    kernels::cpu::cast_float_to_bf16(bits.data(), host, dst.numel);
    TWIN_CUDA_CHECK(cudaMemcpyAsync(b16(dst, "upload_f32", "dst"), bits.data(), dst.bytes(), cudaMemcpyHostToDevice,
                                    context_->compute()));
  }
  synchronize();  // before `bits` (and the caller's host buffer) may go
}

void CudaBackend::do_download_f32(float* host, const Tensor& src) {
  if (src.numel == 0) return;
  context_->wait_deferred();
  if (src.dtype == DType::F32) {
    TWIN_CUDA_CHECK(cudaMemcpyAsync(host, f32(src, "download_f32", "src"), src.bytes(), cudaMemcpyDeviceToHost,
                                    context_->compute()));
    synchronize();
    return;
  }
  std::vector<std::uint16_t> bits(src.numel);
  TWIN_CUDA_CHECK(cudaMemcpyAsync(bits.data(), b16(src, "download_f32", "src"), src.bytes(), cudaMemcpyDeviceToHost,
                                  context_->compute()));
  synchronize();
  kernels::cpu::cast_bf16_to_float(host, bits.data(), src.numel);
}

void CudaBackend::do_upload_i32(const Tensor& dst, const int* host) {
  if (dst.numel == 0) return;
  int* device = i32(dst, "upload_i32", "dst");
  Upload& slot = uploads_[next_upload_++ % kUploadSlots];
  if (slot.done != nullptr) TWIN_CUDA_CHECK(cudaEventSynchronize(slot.done));  // the copy kUploadSlots uploads ago
  if (slot.capacity < dst.numel) {
    if (slot.host != nullptr) TWIN_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    TWIN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot.host), dst.bytes()));
    slot.capacity = dst.numel;
  }
  std::copy(host, host + dst.numel, slot.host);  // the caller may reuse its buffer at once
  TWIN_CUDA_CHECK(cudaMemcpyAsync(device, slot.host, dst.bytes(), cudaMemcpyHostToDevice, context_->compute()));
  if (slot.done == nullptr) TWIN_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  TWIN_CUDA_CHECK(cudaEventRecord(slot.done, context_->compute()));
}

void CudaBackend::do_synchronize() {
  context_->wait_deferred();
  context_->synchronize();  // a communication failure (a dead peer's collective aborted) is reported, not hung on
}

double CudaBackend::read_result() {
  double value = 0;
  TWIN_CUDA_CHECK(cudaMemcpyAsync(&value, result_.data, sizeof(double), cudaMemcpyDeviceToHost, context_->compute()));
  synchronize();
  return value;
}

// --- element-wise ----------------------------------------------------------------------------------------------------

void CudaBackend::do_fill(const Tensor& x, float value) {
  if (x.numel == 0) return;
  switch (x.dtype) {
    case DType::F32:
      k::fill(f32(x, "fill", "x"), x.numel, value, context_->compute());
      return;
    case DType::BF16:
      k::fill(b16(x, "fill", "x"), x.numel, value, context_->compute());
      return;
    case DType::F64:
    case DType::I32:
      TWIN_EXEC_CHECK(value == 0.0f, "cuda fill: {} tensors can only be zeroed", to_string(x.dtype));
      context_->order_touch(x.data, x.bytes());
      TWIN_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.bytes(), context_->compute()));
      return;
  }
}

void CudaBackend::do_copy(const Tensor& dst, const Tensor& src) {
  TWIN_EXEC_CHECK(dst.device == Device::Cuda && src.device == Device::Cuda, "cuda copy: a host tensor");
  if (src.numel == 0) return;
  context_->order_touch(dst.data, dst.bytes());
  context_->order_touch(src.data, src.bytes());
  TWIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, context_->compute()));
}

void CudaBackend::do_accumulate(const Tensor& y, const Tensor& x) {
  if (y.numel == 0) return;
  if (y.dtype == DType::F32) {
    k::accumulate(f32(y, "accumulate", "y"), f32(x, "accumulate", "x"), y.numel, context_->compute());
  } else {
    k::accumulate(b16(y, "accumulate", "y"), b16(x, "accumulate", "x"), y.numel, context_->compute());
  }
}

void CudaBackend::do_residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  k::residual_forward(b16(out, "residual_forward", "out"), b16(a, "residual_forward", "a"),
                      b16(b, "residual_forward", "b"), out.numel, context_->compute());
}

void CudaBackend::do_bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) {
  k::bias_add(b16(out, "bias_add", "out"), b16(bias, "bias_add", "bias"), rows, channels, context_->compute());
}

void CudaBackend::do_bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) {
  k::bias_backward(f32(dbias, "bias_backward", "dbias"), b16(dout, "bias_backward", "dout"), rows, channels,
                   context_->compute());
}

double CudaBackend::do_squared_norm(const Tensor& x) {
  context_->wait_deferred();  // gradients under an overlapped DP reduction
  k::squared_norm(static_cast<double*>(result_.data), x.numel == 0 ? nullptr : f32(x, "squared_norm", "x"), x.numel,
                  context_->compute());
  return read_result();
}

double CudaBackend::do_squared_norm_sum(const std::vector<Tensor>& xs) {
  context_->wait_deferred();  // gradients under an overlapped DP reduction
  if (xs.empty()) return 0;
  if (norms_.numel < xs.size()) norms_ = allocate(xs.size(), DType::F64);
  double* norms = static_cast<double*>(norms_.data);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    k::squared_norm(norms + i, x.numel == 0 ? nullptr : f32(x, "squared_norm_sum", "x"), x.numel, context_->compute());
  }
  std::vector<double> values(xs.size());
  TWIN_CUDA_CHECK(cudaMemcpyAsync(values.data(), norms, values.size() * sizeof(double), cudaMemcpyDeviceToHost,
                                  context_->compute()));
  synchronize();  // the one wait of the gradient norm
  double total = 0;
  for (double value : values) total += value;  // in order, as Backend::squared_norm_sum adds them
  return total;
}

double CudaBackend::do_sum(const Tensor& x) {
  context_->wait_deferred();
  k::sum(static_cast<double*>(result_.data), x.numel == 0 ? nullptr : f32(x, "sum", "x"), x.numel, context_->compute());
  return read_result();
}

// --- embeddings ----------------------------------------------------------------------------------------------------

void CudaBackend::do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows,
                                       int channels, int vocab_start, int vocab_local) {
  k::embedding_forward(b16(out, "embedding_forward", "out"), i32(tokens, "embedding_forward", "tokens"),
                       b16(wte_local, "embedding_forward", "wte_local"), rows, channels, vocab_start, vocab_local,
                       context_->compute());
}

void CudaBackend::do_embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows,
                                        int channels, int vocab_start, int vocab_local) {
  k::embedding_backward(f32(dwte_local, "embedding_backward", "dwte_local"), b16(dout, "embedding_backward", "dout"),
                        i32(tokens, "embedding_backward", "tokens"), rows, channels, vocab_start, vocab_local,
                        context_->compute());
}

void CudaBackend::do_position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq,
                                                int channels) {
  k::position_embedding_forward(b16(out, "position_embedding_forward", "out"),
                                b16(wpe, "position_embedding_forward", "wpe"), batch, seq, channels,
                                context_->compute());
}

void CudaBackend::do_position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq,
                                                 int channels) {
  k::position_embedding_backward(f32(dwpe, "position_embedding_backward", "dwpe"),
                                 b16(dout, "position_embedding_backward", "dout"), batch, seq, channels,
                                 context_->compute());
}

// --- layernorm, linear, GELU ----------------------------------------------------------------------------------------

void CudaBackend::do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias, int rows, int channels) {
  const char* kernel = "layernorm_forward";
  k::layernorm_forward(b16(out, kernel, "out"), f32(mean, kernel, "mean"), f32(rstd, kernel, "rstd"),
                       b16(inp, kernel, "inp"), b16(weight, kernel, "weight"), b16(bias, kernel, "bias"), rows,
                       channels, context_->compute());
}

void CudaBackend::do_layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                        const Tensor& dout, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, int rows, int channels) {
  const char* kernel = "layernorm_backward";
  k::layernorm_backward(b16(dinp, kernel, "dinp"), f32(dweight, kernel, "dweight"), f32(dbias, kernel, "dbias"),
                        b16(dout, kernel, "dout"), b16(inp, kernel, "inp"), b16(weight, kernel, "weight"),
                        f32(mean, kernel, "mean"), f32(rstd, kernel, "rstd"), rows, channels, context_->compute());
}

void CudaBackend::do_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                    int rows, int in_features, int out_features) {
  const char* kernel = "matmul_forward";
  k::matmul_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), b16(weight, kernel, "weight"),
                    optional_b16(bias, kernel, "bias"), rows, in_features, out_features, *blas_, context_->compute());
}

void CudaBackend::do_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, int rows, int in_features,
                                     int out_features) {
  const char* kernel = "matmul_backward";
  k::matmul_backward(optional_b16(dinp, kernel, "dinp"), optional_f32(dweight, kernel, "dweight"),
                     optional_f32(dbias, kernel, "dbias"), b16(dout, kernel, "dout"), b16(inp, kernel, "inp"),
                     b16(weight, kernel, "weight"), rows, in_features, out_features, *blas_, context_->compute());
}

void CudaBackend::do_gelu_forward(const Tensor& out, const Tensor& inp) {
  if (out.numel == 0) return;
  k::gelu_forward(b16(out, "gelu_forward", "out"), b16(inp, "gelu_forward", "inp"), out.numel, context_->compute());
}

void CudaBackend::do_gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  if (dinp.numel == 0) return;
  k::gelu_backward(b16(dinp, "gelu_backward", "dinp"), b16(inp, "gelu_backward", "inp"),
                   b16(dout, "gelu_backward", "dout"), dinp.numel, context_->compute());
}

// --- RMSNorm, SwiGLU, rotary embeddings, attention (multi-head and grouped-query) ----------------------------------

void CudaBackend::do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                     int rows, int channels) {
  const char* kernel = "rmsnorm_forward";
  k::rmsnorm_forward(b16(out, kernel, "out"), f32(rstd, kernel, "rstd"), b16(inp, kernel, "inp"),
                     b16(weight, kernel, "weight"), rows, channels, context_->compute());
}

void CudaBackend::do_rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                      const Tensor& weight, const Tensor& rstd, int rows, int channels) {
  const char* kernel = "rmsnorm_backward";
  k::rmsnorm_backward(b16(dinp, kernel, "dinp"), f32(dweight, kernel, "dweight"), b16(dout, kernel, "dout"),
                      b16(inp, kernel, "inp"), b16(weight, kernel, "weight"), f32(rstd, kernel, "rstd"), rows, channels,
                      context_->compute());
}

void CudaBackend::do_swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) {
  const char* kernel = "swiglu_forward";
  k::swiglu_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), rows, width, context_->compute());
}

void CudaBackend::do_swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) {
  const char* kernel = "swiglu_backward";
  k::swiglu_backward(b16(dinp, kernel, "dinp"), b16(inp, kernel, "inp"), b16(dout, kernel, "dout"), rows, width,
                     context_->compute());
}

void CudaBackend::do_rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                                  int rotary_dim) {
  k::rope_forward(b16(qkv, "rope_forward", "qkv"), batch, seq, heads, kv_heads, head_dim, context_->compute(), 10000.f,
                  rotary_dim);
}

void CudaBackend::do_rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                                   int rotary_dim) {
  k::rope_backward(b16(dqkv, "rope_backward", "dqkv"), batch, seq, heads, kv_heads, head_dim, context_->compute(),
                   10000.f, rotary_dim);
}

// The fused kernels (kernels/cuda/flash_attention.cuh) for the head sizes they are built for; the unfused
// grouped-query path (GEMMs around a softmax kernel, (heads, seq, seq) scratch) for the others.
void CudaBackend::do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq,
                                       int heads, int kv_heads, int head_dim, const Tensor& alibi_slopes) {
  const char* kernel = "attention_forward";
  if (k::flash_attention_supports(head_dim)) {
    k::flash_attention_forward(b16(out, kernel, "out"), f32(lse, kernel, "lse"), b16(qkv, kernel, "qkv"), batch, seq,
                               heads, kv_heads, head_dim, context_->compute(),
                               optional_f32(alibi_slopes, kernel, "alibi_slopes"));
    return;
  }
  k::attention_forward_gqa(b16(out, kernel, "out"), f32(lse, kernel, "lse"), b16(qkv, kernel, "qkv"), batch, seq, heads,
                           kv_heads, head_dim, *blas_, context_->compute(),
                           optional_f32(alibi_slopes, kernel, "alibi_slopes"));
}

void CudaBackend::do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                        const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                                        const Tensor& alibi_slopes) {
  const char* kernel = "attention_backward";
  if (k::flash_attention_supports(head_dim)) {
    k::flash_attention_backward(b16(dqkv, kernel, "dqkv"), b16(dout, kernel, "dout"), b16(qkv, kernel, "qkv"),
                                b16(out, kernel, "out"), f32(lse, kernel, "lse"), batch, seq, heads, kv_heads, head_dim,
                                context_->compute(), optional_f32(alibi_slopes, kernel, "alibi_slopes"));
    return;
  }
  k::attention_backward_gqa(b16(dqkv, kernel, "dqkv"), b16(dout, kernel, "dout"), b16(qkv, kernel, "qkv"),
                            f32(lse, kernel, "lse"), batch, seq, heads, kv_heads, head_dim, *blas_, context_->compute(),
                            optional_f32(alibi_slopes, kernel, "alibi_slopes"));
}

// --- vocab-parallel cross-entropy ----------------------------------------------------------------------------------

void CudaBackend::do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                               int rows, int vocab_start, int vocab_local, int valid_vocab) {
  const char* kernel = "cross_entropy_local_stats";
  k::cross_entropy_local_stats(f32(stats, kernel, "stats"), b16(logits, kernel, "logits"),
                               i32(targets, kernel, "targets"), rows, vocab_start, vocab_local, valid_vocab,
                               context_->compute());
}

void CudaBackend::do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats,
                                           int rows, int shards) {
  const char* kernel = "cross_entropy_combine";
  k::cross_entropy_combine(f32(losses, kernel, "losses"), f32(lse, kernel, "lse"),
                           f32(gathered_stats, kernel, "gathered_stats"), rows, shards, context_->compute());
}

void CudaBackend::do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                            const Tensor& targets, int rows, int vocab_start, int vocab_local,
                                            int valid_vocab, float scale) {
  const char* kernel = "cross_entropy_backward";
  k::cross_entropy_backward(b16(dlogits, kernel, "dlogits"), b16(logits, kernel, "logits"), f32(lse, kernel, "lse"),
                            i32(targets, kernel, "targets"), rows, vocab_start, vocab_local, valid_vocab, scale,
                            context_->compute());
}

// --- optimizer ------------------------------------------------------------------------------------------------------

void CudaBackend::do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                                  const Tensor& v, const AdamWStep& step) {
  if (param.numel == 0) return;
  context_->wait_deferred();  // gradients under an overlapped DP reduction
  const char* kernel = "adamw_update";
  if (param.dtype == DType::F32 && master.empty()) {
    k::adamw_update(f32(param, kernel, "param"), f32(grad, kernel, "grad"), f32(m, kernel, "m"), f32(v, kernel, "v"),
                    param.numel, step.learning_rate, step.beta1, step.beta2, step.eps, step.weight_decay, step.step,
                    step.grad_scale, context_->compute());
    return;
  }
  k::adamw_update(b16(param, kernel, "param"), f32(master, kernel, "master"), f32(grad, kernel, "grad"),
                  f32(m, kernel, "m"), f32(v, kernel, "v"), param.numel, step.learning_rate, step.beta1, step.beta2,
                  step.eps, step.weight_decay, step.step, step.grad_scale, context_->compute());
}

}  // namespace twin::exec::cuda
