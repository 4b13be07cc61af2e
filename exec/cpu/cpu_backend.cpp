#include "exec/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "exec/core/check.hpp"
#include "exec/cpu/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"

namespace twin::exec::cpu {

namespace k = twin::kernels::cpu;

// Freed blocks by size, reused by the next allocation of that size (a training step repeats the same shapes).
struct BlockCache {
  static constexpr std::size_t kAlignment = 64;
  std::mutex mutex;
  std::map<std::size_t, std::vector<void*>> free_blocks;

  void* take(std::size_t bytes) {
    {
      std::lock_guard lock(mutex);
      auto it = free_blocks.find(bytes);
      if (it != free_blocks.end() && !it->second.empty()) {
        void* block = it->second.back();
        it->second.pop_back();
        return block;
      }
    }
    void* block = std::aligned_alloc(kAlignment, bytes);
    if (block == nullptr) throw std::bad_alloc();
    return block;
  }
  void give_back(void* block, std::size_t bytes) {
    std::lock_guard lock(mutex);
    free_blocks[bytes].push_back(block);
  }
  ~BlockCache() {
    for (auto& [bytes, blocks] : free_blocks) {
      for (void* block : blocks) std::free(block);
    }
  }
};

namespace {

constexpr int kMinRowsPerTask = 8;
constexpr std::size_t kMinElementsPerTask = 1 << 15;

int as_int(std::size_t n) {
  return static_cast<int>(n);
}

// Attention: fn(begin, end) runs the kernel on batch elements [begin, end), one call for the whole batch without a
// pool, else one task per element on it. The kernel's tensors all lead with the batch dimension and its (batch, head)
// slices are independent, so the bits do not depend on the split.
template <typename Fn>
void for_each_batch(int batch, ThreadPool* pool, Fn&& fn) {
  if (pool == nullptr) {
    fn(0, batch);
    return;
  }
  pool->parallel_for(batch, [&](int b) { fn(b, b + 1); });
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : threads_(std::max(1, options.threads)),
      owns_blas_(!options.shares_process),
      cache_(std::make_shared<BlockCache>()) {
  k::set_blas_threads(owns_blas_ ? threads_ : 1);  // ranks sharing a process all ask for 1: same value, no race
  if (threads_ > 1) pool_ = std::make_unique<ThreadPool>(threads_);
  provide(this, this, this);  // MoE, context parallelism and (emulated) FP8
}

CpuBackend::~CpuBackend() = default;

Tensor CpuBackend::allocate(std::size_t numel, DType dtype) {
  Tensor t;
  t.dtype = dtype;
  t.device = Device::Host;
  t.numel = numel;
  if (numel == 0) return t;
  const std::size_t bytes =
      (numel * dtype_bytes(dtype) + BlockCache::kAlignment - 1) / BlockCache::kAlignment * BlockCache::kAlignment;
  void* block = cache_->take(bytes);
  t.storage = std::shared_ptr<void>(block, [cache = cache_, bytes](void* p) { cache->give_back(p, bytes); });
  t.data = block;
  return t;
}

void CpuBackend::do_upload_f32(const Tensor& dst, const float* host) {
  std::memcpy(dst.f32(), host, dst.bytes());
}
void CpuBackend::do_download_f32(float* host, const Tensor& src) {
  std::memcpy(host, src.f32(), src.bytes());
}
void CpuBackend::do_upload_i32(const Tensor& dst, const int* host) {
  std::memcpy(dst.i32(), host, dst.bytes());
}

void CpuBackend::for_rows(int rows, const std::function<void(int, int)>& fn) {
  const int tasks = pool_ ? std::min(pool_->size() * 4, rows / kMinRowsPerTask) : 1;
  if (tasks <= 1) {
    fn(0, rows);
    return;
  }
  pool_->parallel_for(tasks, [&](int i) {
    const int begin = static_cast<int>(static_cast<long long>(rows) * i / tasks);
    const int end = static_cast<int>(static_cast<long long>(rows) * (i + 1) / tasks);
    if (end > begin) fn(begin, end);
  });
}

template <typename Fn>
void CpuBackend::with_single_threaded_blas(Fn&& fn) {
  if (!pool_) {
    fn(static_cast<ThreadPool*>(nullptr));
    return;
  }
  if (!owns_blas_) {  // already 1
    fn(pool_.get());
    return;
  }
  k::set_blas_threads(1);
  try {
    fn(pool_.get());
  } catch (...) {
    k::set_blas_threads(threads_);
    throw;
  }
  k::set_blas_threads(threads_);
}

// --- element-wise --------------------------------------------------------------------------------------------------

void CpuBackend::do_fill(const Tensor& x, float value) {
  k::fill(x.f32(), x.numel, value);
}

void CpuBackend::do_copy(const Tensor& dst, const Tensor& src) {
  std::memcpy(dst.data, src.data, src.bytes());
}

void CpuBackend::do_accumulate(const Tensor& y, const Tensor& x) {
  k::accumulate(y.f32(), x.f32(), y.numel);
}

void CpuBackend::do_residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  k::residual_forward(out.f32(), a.f32(), b.f32(), out.numel);
}

void CpuBackend::do_bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) {
  k::bias_add(out.f32(), bias.f32(), rows, channels);
}

void CpuBackend::do_bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) {
  k::bias_backward(dbias.f32(), dout.f32(), rows, channels);
}

double CpuBackend::do_squared_norm(const Tensor& x) {
  return k::squared_norm(x.f32(), x.numel);
}

double CpuBackend::do_sum(const Tensor& x) {
  const float* p = x.f32();
  double total = 0;
  for (std::size_t i = 0; i < x.numel; ++i) total += p[i];
  return total;
}

// --- embeddings ----------------------------------------------------------------------------------------------------

void CpuBackend::do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows,
                                      int channels, int vocab_start, int vocab_local) {
  k::embedding_forward(out.f32(), tokens.i32(), wte_local.f32(), rows, channels, vocab_start, vocab_local);
}

void CpuBackend::do_embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows,
                                       int channels, int vocab_start, int vocab_local) {
  k::embedding_backward(dwte_local.f32(), dout.f32(), tokens.i32(), rows, channels, vocab_start, vocab_local);
}

void CpuBackend::do_position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq, int channels) {
  k::position_embedding_forward(out.f32(), wpe.f32(), batch, seq, channels);
}

void CpuBackend::do_position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq,
                                                int channels) {
  k::position_embedding_backward(dwpe.f32(), dout.f32(), batch, seq, channels);
}

// --- layernorm, linear --------------------------------------------------------------------------------------------

void CpuBackend::do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                      const Tensor& weight, const Tensor& bias, int rows, int channels) {
  float *o = out.f32(), *m = mean.f32(), *r = rstd.f32();
  const float *x = inp.f32(), *w = weight.f32(), *b = bias.f32();
  for_rows(rows, [&](int begin, int end) {
    const std::size_t offset = std::size_t(begin) * channels;
    k::layernorm_forward(o + offset, m + begin, r + begin, x + offset, w, b, end - begin, channels);
  });
}

void CpuBackend::do_layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dout, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd, int rows, int channels) {
  k::layernorm_backward(dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(), weight.f32(), mean.f32(),
                        rstd.f32(), rows, channels);
}

void CpuBackend::do_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                   int rows, int in_features, int out_features) {
  k::matmul_forward(out.f32(), inp.f32(), weight.f32(), bias.f32(), rows, in_features, out_features);
}

void CpuBackend::do_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                    const Tensor& inp, const Tensor& weight, int rows, int in_features,
                                    int out_features) {
  k::matmul_backward(dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(), weight.f32(), rows, in_features,
                     out_features);
}

namespace {

k::Fp8Operand kernel_operand(const Fp8Operand& operand) {
  k::Fp8Scaling scaling = k::Fp8Scaling::Current;
  switch (operand.scaling) {
    case Fp8Operand::Scaling::PerTensor:
      scaling = k::Fp8Scaling::PerTensor;
      break;
    case Fp8Operand::Scaling::Current:
      scaling = k::Fp8Scaling::Current;
      break;
    case Fp8Operand::Scaling::Tiles:
      scaling = k::Fp8Scaling::Tiles;
      break;
    case Fp8Operand::Scaling::Blocks:
      scaling = k::Fp8Scaling::Blocks;
      break;
    case Fp8Operand::Scaling::Mx:
      scaling = k::Fp8Scaling::Mx;
      break;
  }
  return k::Fp8Operand{operand.e5m2 ? k::Fp8Format::E5M2 : k::Fp8Format::E4M3, scaling, operand.scale};
}

}  // namespace

Fp8Amaxes CpuBackend::do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                            const Tensor& bias, int rows, int in_features, int out_features,
                                            const Fp8Operand& input, const Fp8Operand& weights) {
  k::fp8_matmul_forward(out.f32(), inp.f32(), weight.f32(), bias.f32(), rows, in_features, out_features,
                        kernel_operand(input), kernel_operand(weights));
  return {k::absolute_max(inp.f32(), inp.numel), k::absolute_max(weight.f32(), weight.numel), 0};
}

Fp8Amaxes CpuBackend::do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                             const Tensor& dout, const Tensor& inp, const Tensor& weight, int rows,
                                             int in_features, int out_features, const Fp8Operand& input,
                                             const Fp8Operand& weights, const Fp8Operand& gradient) {
  k::fp8_matmul_backward(dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(), weight.f32(), rows, in_features,
                         out_features, kernel_operand(input), kernel_operand(weights), kernel_operand(gradient));
  return {0, 0, k::absolute_max(dout.f32(), dout.numel)};
}

// --- RMSNorm, SwiGLU, rotary embeddings, attention, GELU ------------------------------------------------------------

void CpuBackend::do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                    int rows, int channels) {
  float *o = out.f32(), *r = rstd.f32();
  const float *x = inp.f32(), *w = weight.f32();
  for_rows(rows, [&](int begin, int end) {
    const std::size_t offset = std::size_t(begin) * channels;
    k::rmsnorm_forward(o + offset, r + begin, x + offset, w, end - begin, channels);
  });
}

void CpuBackend::do_rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight, const Tensor& rstd, int rows, int channels) {
  k::rmsnorm_backward(dinp.f32(), dweight.f32(), dout.f32(), inp.f32(), weight.f32(), rstd.f32(), rows, channels);
}

void CpuBackend::do_swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) {
  float* o = out.f32();
  const float* x = inp.f32();
  for_rows(rows, [&](int begin, int end) {
    k::swiglu_forward(o + std::size_t(begin) * width, x + 2 * std::size_t(begin) * width, end - begin, width);
  });
}

void CpuBackend::do_swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) {
  float* d = dinp.f32();
  const float *x = inp.f32(), *dy = dout.f32();
  for_rows(rows, [&](int begin, int end) {
    const std::size_t wide = 2 * std::size_t(begin) * width;
    k::swiglu_backward(d + wide, x + wide, dy + std::size_t(begin) * width, end - begin, width);
  });
}

void CpuBackend::do_rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                                 int rotary_dim) {
  k::rope_forward(qkv.f32(), batch, seq, heads, kv_heads, head_dim, 10000.f, rotary_dim);
}

void CpuBackend::do_rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                                  int rotary_dim) {
  k::rope_backward(dqkv.f32(), batch, seq, heads, kv_heads, head_dim, 10000.f, rotary_dim);
}

// kernels/cpu's grouped-query attention: with kv_heads == heads it is multi-head attention, with its bits.
void CpuBackend::do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq,
                                      int heads, int kv_heads, int head_dim, const Tensor& alibi_slopes) {
  const std::size_t width = std::size_t(heads) * head_dim;
  const std::size_t row = std::size_t(heads + 2 * kv_heads) * head_dim;
  const float* slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.f32();
  auto slice = [&](int begin, int end) {
    k::attention_forward_gqa(out.f32() + begin * std::size_t(seq) * width, lse.f32() + begin * std::size_t(heads) * seq,
                             qkv.f32() + begin * std::size_t(seq) * row, end - begin, seq, heads, kv_heads, head_dim,
                             slopes);
  };
  if (batch == 1) {
    slice(0, 1);
    return;
  }
  with_single_threaded_blas([&](ThreadPool* pool) { for_each_batch(batch, pool, slice); });
}

void CpuBackend::do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& /*out*/,
                                       const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                                       const Tensor& alibi_slopes) {
  const std::size_t width = std::size_t(heads) * head_dim;
  const std::size_t row = std::size_t(heads + 2 * kv_heads) * head_dim;
  const float* slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.f32();
  auto slice = [&](int begin, int end) {
    const std::size_t qkv_offset = begin * std::size_t(seq) * row;
    k::attention_backward_gqa(dqkv.f32() + qkv_offset, dout.f32() + begin * std::size_t(seq) * width,
                              qkv.f32() + qkv_offset, lse.f32() + begin * std::size_t(heads) * seq, end - begin, seq,
                              heads, kv_heads, head_dim, slopes);
  };
  if (batch == 1) {
    slice(0, 1);
    return;
  }
  with_single_threaded_blas([&](ThreadPool* pool) { for_each_batch(batch, pool, slice); });
}

void CpuBackend::do_gelu_forward(const Tensor& out, const Tensor& inp) {
  float* o = out.f32();
  const float* x = inp.f32();
  const int chunks = as_int(std::min<std::size_t>(64, std::max<std::size_t>(1, out.numel / kMinElementsPerTask)));
  for_rows(chunks * kMinRowsPerTask, [&](int begin, int end) {
    const std::size_t lo = out.numel * std::size_t(begin) / (std::size_t(chunks) * kMinRowsPerTask);
    const std::size_t hi = out.numel * std::size_t(end) / (std::size_t(chunks) * kMinRowsPerTask);
    k::gelu_forward(o + lo, x + lo, hi - lo);
  });
}

void CpuBackend::do_gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  float* d = dinp.f32();
  const float *x = inp.f32(), *dy = dout.f32();
  const int chunks = as_int(std::min<std::size_t>(64, std::max<std::size_t>(1, inp.numel / kMinElementsPerTask)));
  for_rows(chunks * kMinRowsPerTask, [&](int begin, int end) {
    const std::size_t lo = inp.numel * std::size_t(begin) / (std::size_t(chunks) * kMinRowsPerTask);
    const std::size_t hi = inp.numel * std::size_t(end) / (std::size_t(chunks) * kMinRowsPerTask);
    k::gelu_backward(d + lo, x + lo, dy + lo, hi - lo);
  });
}

// --- cross-entropy -------------------------------------------------------------------------------------------------

void CpuBackend::do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                              int rows, int vocab_start, int vocab_local, int valid_vocab) {
  float* s = stats.f32();
  const float* x = logits.f32();
  const int* t = targets.i32();
  for_rows(rows, [&](int begin, int end) {
    k::cross_entropy_local_stats(s + std::size_t(begin) * k::kCrossEntropyStats, x + std::size_t(begin) * vocab_local,
                                 t + begin, end - begin, vocab_start, vocab_local, valid_vocab);
  });
}

void CpuBackend::do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats,
                                          int rows, int shards) {
  k::cross_entropy_combine(losses.f32(), lse.f32(), gathered_stats.f32(), rows, shards);
}

void CpuBackend::do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                           const Tensor& targets, int rows, int vocab_start, int vocab_local,
                                           int valid_vocab, float scale) {
  float* d = dlogits.f32();
  const float *x = logits.f32(), *l = lse.f32();
  const int* t = targets.i32();
  for_rows(rows, [&](int begin, int end) {
    const std::size_t offset = std::size_t(begin) * vocab_local;
    k::cross_entropy_backward(d + offset, x + offset, l + begin, t + begin, end - begin, vocab_start, vocab_local,
                              valid_vocab, scale);
  });
}

// --- optimizer -----------------------------------------------------------------------------------------------------

void CpuBackend::do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                                 const Tensor& v, const AdamWStep& s) {
  TWIN_EXEC_CHECK(master.empty(), "adamw_update: the cpu backend keeps no master copy (its weights are fp32)");
  k::adamw_update(param.f32(), grad.f32(), m.f32(), v.f32(), param.numel, s.learning_rate, s.beta1, s.beta2, s.eps,
                  s.weight_decay, s.step, s.grad_scale);
}

}  // namespace twin::exec::cpu
