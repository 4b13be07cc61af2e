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

void CudaBackend::upload_f32(const Tensor& dst, const float* host) {
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

void CudaBackend::download_f32(float* host, const Tensor& src) {
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

void CudaBackend::upload_i32(const Tensor& dst, const int* host) {
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

void CudaBackend::synchronize() {
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

void CudaBackend::fill(const Tensor& x, float value) {
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

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  TWIN_EXEC_CHECK(
      dst.numel == src.numel && dst.dtype == src.dtype && dst.device == Device::Cuda && src.device == Device::Cuda,
      "cuda copy: {} {} into {} {}", src.numel, to_string(src.dtype), dst.numel, to_string(dst.dtype));
  if (src.numel == 0) return;
  context_->order_touch(dst.data, dst.bytes());
  context_->order_touch(src.data, src.bytes());
  TWIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, context_->compute()));
}

void CudaBackend::accumulate(const Tensor& y, const Tensor& x) {
  TWIN_EXEC_CHECK(y.numel == x.numel && y.dtype == x.dtype, "cuda accumulate: {} {} += {} {}", y.numel,
                  to_string(y.dtype), x.numel, to_string(x.dtype));
  if (y.numel == 0) return;
  if (y.dtype == DType::F32) {
    k::accumulate(f32(y, "accumulate", "y"), f32(x, "accumulate", "x"), y.numel, context_->compute());
  } else {
    k::accumulate(b16(y, "accumulate", "y"), b16(x, "accumulate", "x"), y.numel, context_->compute());
  }
}

void CudaBackend::residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  TWIN_EXEC_CHECK(out.numel == a.numel && a.numel == b.numel, "cuda residual: {} = {} + {}", out.numel, a.numel,
                  b.numel);
  k::residual_forward(b16(out, "residual_forward", "out"), b16(a, "residual_forward", "a"),
                      b16(b, "residual_forward", "b"), out.numel, context_->compute());
}

void CudaBackend::bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, channels) && bias.numel == std::size_t(channels),
                  "cuda bias_add: out {} bias {} for ({}, {})", out.numel, bias.numel, rows, channels);
  k::bias_add(b16(out, "bias_add", "out"), b16(bias, "bias_add", "bias"), rows, channels, context_->compute());
}

void CudaBackend::bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, channels) && dbias.numel == std::size_t(channels),
                  "cuda bias_backward: dout {} dbias {} for ({}, {})", dout.numel, dbias.numel, rows, channels);
  k::bias_backward(f32(dbias, "bias_backward", "dbias"), b16(dout, "bias_backward", "dout"), rows, channels,
                   context_->compute());
}

double CudaBackend::squared_norm(const Tensor& x) {
  context_->wait_deferred();  // gradients under an overlapped DP reduction
  k::squared_norm(static_cast<double*>(result_.data), x.numel == 0 ? nullptr : f32(x, "squared_norm", "x"), x.numel,
                  context_->compute());
  return read_result();
}

double CudaBackend::squared_norm_sum(const std::vector<Tensor>& xs) {
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

double CudaBackend::sum(const Tensor& x) {
  context_->wait_deferred();
  k::sum(static_cast<double*>(result_.data), x.numel == 0 ? nullptr : f32(x, "sum", "x"), x.numel, context_->compute());
  return read_result();
}

// --- embeddings ----------------------------------------------------------------------------------------------------

void CudaBackend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows,
                                    int channels, int vocab_start, int vocab_local) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, channels) && tokens.numel == std::size_t(rows) &&
                      wte_local.numel == numel(vocab_local, channels),
                  "cuda embedding_forward: out {} tokens {} wte {} for rows {} channels {} vocab_local {}", out.numel,
                  tokens.numel, wte_local.numel, rows, channels, vocab_local);
  k::embedding_forward(b16(out, "embedding_forward", "out"), i32(tokens, "embedding_forward", "tokens"),
                       b16(wte_local, "embedding_forward", "wte_local"), rows, channels, vocab_start, vocab_local,
                       context_->compute());
}

void CudaBackend::embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows,
                                     int channels, int vocab_start, int vocab_local) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, channels) && dwte_local.numel == numel(vocab_local, channels) &&
                      tokens.numel == std::size_t(rows),
                  "cuda embedding_backward: dout {} dwte {} tokens {}", dout.numel, dwte_local.numel, tokens.numel);
  k::embedding_backward(f32(dwte_local, "embedding_backward", "dwte_local"), b16(dout, "embedding_backward", "dout"),
                        i32(tokens, "embedding_backward", "tokens"), rows, channels, vocab_start, vocab_local,
                        context_->compute());
}

void CudaBackend::position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq, int channels) {
  TWIN_EXEC_CHECK(out.numel == numel(batch, seq) * channels && wpe.numel >= numel(seq, channels),
                  "cuda position_embedding_forward: out {} wpe {}", out.numel, wpe.numel);
  k::position_embedding_forward(b16(out, "position_embedding_forward", "out"),
                                b16(wpe, "position_embedding_forward", "wpe"), batch, seq, channels,
                                context_->compute());
}

void CudaBackend::position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq,
                                              int channels) {
  TWIN_EXEC_CHECK(dout.numel == numel(batch, seq) * channels && dwpe.numel >= numel(seq, channels),
                  "cuda position_embedding_backward: dout {} dwpe {}", dout.numel, dwpe.numel);
  k::position_embedding_backward(f32(dwpe, "position_embedding_backward", "dwpe"),
                                 b16(dout, "position_embedding_backward", "dout"), batch, seq, channels,
                                 context_->compute());
}

// --- layernorm, linear, GELU ----------------------------------------------------------------------------------------

void CudaBackend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                    const Tensor& weight, const Tensor& bias, int rows, int channels) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, channels) && inp.numel == numel(rows, channels) && mean.numel == std::size_t(rows) &&
                      rstd.numel == std::size_t(rows) && weight.numel == std::size_t(channels) &&
                      bias.numel == std::size_t(channels),
                  "cuda layernorm_forward: out {} inp {} mean {} weight {} for ({}, {})", out.numel, inp.numel,
                  mean.numel, weight.numel, rows, channels);
  const char* kernel = "layernorm_forward";
  k::layernorm_forward(b16(out, kernel, "out"), f32(mean, kernel, "mean"), f32(rstd, kernel, "rstd"),
                       b16(inp, kernel, "inp"), b16(weight, kernel, "weight"), b16(bias, kernel, "bias"), rows,
                       channels, context_->compute());
}

void CudaBackend::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     int rows, int channels) {
  TWIN_EXEC_CHECK(dinp.numel == numel(rows, channels) && dout.numel == numel(rows, channels) &&
                      inp.numel == numel(rows, channels) && dweight.numel == std::size_t(channels) &&
                      dbias.numel == std::size_t(channels) && mean.numel == std::size_t(rows),
                  "cuda layernorm_backward: dinp {} dout {} inp {} dweight {} for ({}, {})", dinp.numel, dout.numel,
                  inp.numel, dweight.numel, rows, channels);
  const char* kernel = "layernorm_backward";
  k::layernorm_backward(b16(dinp, kernel, "dinp"), f32(dweight, kernel, "dweight"), f32(dbias, kernel, "dbias"),
                        b16(dout, kernel, "dout"), b16(inp, kernel, "inp"), b16(weight, kernel, "weight"),
                        f32(mean, kernel, "mean"), f32(rstd, kernel, "rstd"), rows, channels, context_->compute());
}

void CudaBackend::matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                 int rows, int in_features, int out_features) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, out_features) && inp.numel == numel(rows, in_features) &&
                      weight.numel == numel(out_features, in_features) &&
                      (bias.empty() || bias.numel == std::size_t(out_features)),
                  "cuda matmul_forward: out {} inp {} weight {} bias {} for ({}, {} -> {})", out.numel, inp.numel,
                  weight.numel, bias.numel, rows, in_features, out_features);
  const char* kernel = "matmul_forward";
  k::matmul_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), b16(weight, kernel, "weight"),
                    optional_b16(bias, kernel, "bias"), rows, in_features, out_features, *blas_, context_->compute());
}

void CudaBackend::matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, int rows, int in_features,
                                  int out_features) {
  TWIN_EXEC_CHECK((dinp.empty() || dinp.numel == numel(rows, in_features)) && dout.numel == numel(rows, out_features) &&
                      inp.numel == numel(rows, in_features) && weight.numel == numel(out_features, in_features) &&
                      (dweight.empty() || dweight.numel == numel(out_features, in_features)) &&
                      (dbias.empty() || dbias.numel == std::size_t(out_features)),
                  "cuda matmul_backward: dinp {} dout {} inp {} weight {} dweight {} for ({}, {} -> {})", dinp.numel,
                  dout.numel, inp.numel, weight.numel, dweight.numel, rows, in_features, out_features);
  const char* kernel = "matmul_backward";
  k::matmul_backward(optional_b16(dinp, kernel, "dinp"), optional_f32(dweight, kernel, "dweight"),
                     optional_f32(dbias, kernel, "dbias"), b16(dout, kernel, "dout"), b16(inp, kernel, "inp"),
                     b16(weight, kernel, "weight"), rows, in_features, out_features, *blas_, context_->compute());
}

void CudaBackend::gelu_forward(const Tensor& out, const Tensor& inp) {
  TWIN_EXEC_CHECK(out.numel == inp.numel, "cuda gelu_forward: out {} inp {}", out.numel, inp.numel);
  if (out.numel == 0) return;
  k::gelu_forward(b16(out, "gelu_forward", "out"), b16(inp, "gelu_forward", "inp"), out.numel, context_->compute());
}

void CudaBackend::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  TWIN_EXEC_CHECK(dinp.numel == inp.numel && dout.numel == inp.numel, "cuda gelu_backward: dinp {} inp {} dout {}",
                  dinp.numel, inp.numel, dout.numel);
  if (dinp.numel == 0) return;
  k::gelu_backward(b16(dinp, "gelu_backward", "dinp"), b16(inp, "gelu_backward", "inp"),
                   b16(dout, "gelu_backward", "dout"), dinp.numel, context_->compute());
}

// --- RMSNorm, SwiGLU, rotary embeddings, attention (multi-head and grouped-query) ----------------------------------

void CudaBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                  int rows, int channels) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, channels) && inp.numel == numel(rows, channels) && rstd.numel == std::size_t(rows) &&
                      weight.numel == std::size_t(channels),
                  "cuda rmsnorm_forward: out {} inp {} rstd {} weight {} for ({}, {})", out.numel, inp.numel,
                  rstd.numel, weight.numel, rows, channels);
  const char* kernel = "rmsnorm_forward";
  k::rmsnorm_forward(b16(out, kernel, "out"), f32(rstd, kernel, "rstd"), b16(inp, kernel, "inp"),
                     b16(weight, kernel, "weight"), rows, channels, context_->compute());
}

void CudaBackend::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                   const Tensor& weight, const Tensor& rstd, int rows, int channels) {
  TWIN_EXEC_CHECK(dinp.numel == numel(rows, channels) && dout.numel == numel(rows, channels) &&
                      inp.numel == numel(rows, channels) && dweight.numel == std::size_t(channels) &&
                      weight.numel == std::size_t(channels) && rstd.numel == std::size_t(rows),
                  "cuda rmsnorm_backward: dinp {} dout {} inp {} dweight {} rstd {} for ({}, {})", dinp.numel,
                  dout.numel, inp.numel, dweight.numel, rstd.numel, rows, channels);
  const char* kernel = "rmsnorm_backward";
  k::rmsnorm_backward(b16(dinp, kernel, "dinp"), f32(dweight, kernel, "dweight"), b16(dout, kernel, "dout"),
                      b16(inp, kernel, "inp"), b16(weight, kernel, "weight"), f32(rstd, kernel, "rstd"), rows, channels,
                      context_->compute());
}

void CudaBackend::swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, width) && inp.numel == 2 * out.numel,
                  "cuda swiglu_forward: out {} inp {} for ({}, {})", out.numel, inp.numel, rows, width);
  const char* kernel = "swiglu_forward";
  k::swiglu_forward(b16(out, kernel, "out"), b16(inp, kernel, "inp"), rows, width, context_->compute());
}

void CudaBackend::swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, width) && inp.numel == 2 * dout.numel && dinp.numel == inp.numel,
                  "cuda swiglu_backward: dinp {} inp {} dout {} for ({}, {})", dinp.numel, inp.numel, dout.numel, rows,
                  width);
  const char* kernel = "swiglu_backward";
  k::swiglu_backward(b16(dinp, kernel, "dinp"), b16(inp, kernel, "inp"), b16(dout, kernel, "dout"), rows, width,
                     context_->compute());
}

void CudaBackend::rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                               int rotary_dim) {
  TWIN_EXEC_CHECK(qkv.numel == numel(batch, seq) * numel(heads + 2 * kv_heads, head_dim),
                  "cuda rope_forward: qkv {} for ({}, {}, ({} + 2 x {}) x {})", qkv.numel, batch, seq, heads, kv_heads,
                  head_dim);
  k::rope_forward(b16(qkv, "rope_forward", "qkv"), batch, seq, heads, kv_heads, head_dim, context_->compute(), 10000.f,
                  rotary_dim);
}

void CudaBackend::rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                                int rotary_dim) {
  TWIN_EXEC_CHECK(dqkv.numel == numel(batch, seq) * numel(heads + 2 * kv_heads, head_dim),
                  "cuda rope_backward: dqkv {} for ({}, {}, ({} + 2 x {}) x {})", dqkv.numel, batch, seq, heads,
                  kv_heads, head_dim);
  k::rope_backward(b16(dqkv, "rope_backward", "dqkv"), batch, seq, heads, kv_heads, head_dim, context_->compute(),
                   10000.f, rotary_dim);
}

// The fused kernels (kernels/cuda/flash_attention.cuh) for the head sizes they are built for; the unfused
// grouped-query path (GEMMs around a softmax kernel, (heads, seq, seq) scratch) for the others.
void CudaBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq,
                                    int heads, int kv_heads, int head_dim, const Tensor& alibi_slopes) {
  const std::size_t tokens = numel(batch, seq), hidden = numel(heads, head_dim);
  const std::size_t row = numel(heads + 2 * kv_heads, head_dim);
  TWIN_EXEC_CHECK(qkv.numel == tokens * row && out.numel == tokens * hidden && lse.numel == tokens * heads,
                  "cuda attention_forward: qkv {} out {} lse {} for B {} T {} H {} KV {} D {}", qkv.numel, out.numel,
                  lse.numel, batch, seq, heads, kv_heads, head_dim);
  TWIN_EXEC_CHECK(alibi_slopes.empty() || alibi_slopes.numel == numel(heads, 1),
                  "cuda attention_forward: {} ALiBi slopes for {} heads", alibi_slopes.numel, heads);
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

void CudaBackend::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                                     const Tensor& alibi_slopes) {
  const std::size_t tokens = numel(batch, seq), hidden = numel(heads, head_dim);
  const std::size_t row = numel(heads + 2 * kv_heads, head_dim);
  TWIN_EXEC_CHECK(qkv.numel == tokens * row && dqkv.numel == qkv.numel && dout.numel == tokens * hidden &&
                      out.numel == tokens * hidden && lse.numel == tokens * heads,
                  "cuda attention_backward: dqkv {} dout {} qkv {} out {} lse {} for B {} T {} H {} KV {} D {}",
                  dqkv.numel, dout.numel, qkv.numel, out.numel, lse.numel, batch, seq, heads, kv_heads, head_dim);
  TWIN_EXEC_CHECK(alibi_slopes.empty() || alibi_slopes.numel == numel(heads, 1),
                  "cuda attention_backward: {} ALiBi slopes for {} heads", alibi_slopes.numel, heads);
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

void CudaBackend::cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                            int vocab_start, int vocab_local, int valid_vocab) {
  TWIN_EXEC_CHECK(stats.numel == numel(rows, k::kCrossEntropyStats) && logits.numel == numel(rows, vocab_local) &&
                      targets.numel == std::size_t(rows),
                  "cuda cross_entropy_local_stats: stats {} logits {} targets {} for rows {} vocab_local {}",
                  stats.numel, logits.numel, targets.numel, rows, vocab_local);
  const char* kernel = "cross_entropy_local_stats";
  k::cross_entropy_local_stats(f32(stats, kernel, "stats"), b16(logits, kernel, "logits"),
                               i32(targets, kernel, "targets"), rows, vocab_start, vocab_local, valid_vocab,
                               context_->compute());
}

void CudaBackend::cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                        int shards) {
  TWIN_EXEC_CHECK(losses.numel == std::size_t(rows) && lse.numel == std::size_t(rows) &&
                      gathered_stats.numel == numel(shards, rows) * k::kCrossEntropyStats,
                  "cuda cross_entropy_combine: losses {} lse {} stats {} for rows {} shards {}", losses.numel,
                  lse.numel, gathered_stats.numel, rows, shards);
  const char* kernel = "cross_entropy_combine";
  k::cross_entropy_combine(f32(losses, kernel, "losses"), f32(lse, kernel, "lse"),
                           f32(gathered_stats, kernel, "gathered_stats"), rows, shards, context_->compute());
}

void CudaBackend::cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                         const Tensor& targets, int rows, int vocab_start, int vocab_local,
                                         int valid_vocab, float scale) {
  TWIN_EXEC_CHECK(dlogits.numel == numel(rows, vocab_local) && logits.numel == dlogits.numel &&
                      lse.numel == std::size_t(rows) && targets.numel == std::size_t(rows),
                  "cuda cross_entropy_backward: dlogits {} logits {} lse {} for rows {} vocab_local {}", dlogits.numel,
                  logits.numel, lse.numel, rows, vocab_local);
  const char* kernel = "cross_entropy_backward";
  k::cross_entropy_backward(b16(dlogits, kernel, "dlogits"), b16(logits, kernel, "logits"), f32(lse, kernel, "lse"),
                            i32(targets, kernel, "targets"), rows, vocab_start, vocab_local, valid_vocab, scale,
                            context_->compute());
}

// --- optimizer ------------------------------------------------------------------------------------------------------

void CudaBackend::adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                               const Tensor& v, const AdamWStep& step) {
  TWIN_EXEC_CHECK(grad.numel == param.numel && m.numel == param.numel && v.numel == param.numel &&
                      (master.empty() || master.numel == param.numel),
                  "cuda adamw_update: param {} master {} grad {} m {} v {}", param.numel, master.numel, grad.numel,
                  m.numel, v.numel);
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
