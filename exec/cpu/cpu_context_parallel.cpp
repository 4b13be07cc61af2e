// The CPU backend's context parallelism, the all_gather way: kernels/cpu/ring_attention.hpp's all_gather attention
// (flash_attention.hpp's block functions at absolute positions) on the layouts the interpreter exchanges: every CP
// rank's keys and values as separate (cp, B, L, KV D) blocks in rank order, as the Program's two all-gathers (and
// two reduce-scatters) carry them.
#include <cstring>
#include <vector>

#include "exec/core/check.hpp"
#include "exec/core/sizes.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec/cpu/cpu_context_shape.hpp"
#include "kernels/cpu/ring_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::exec::cpu {

namespace k = twin::kernels::cpu;

namespace {

constexpr float kRopeBase = 10000.f;  // CpuBackend::rope_forward's

std::size_t qkv_row(const ContextShape& s) {
  return sz(s.heads + 2 * s.kv_heads) * sz(s.head_dim);
}

void check_layout(const ContextShape& s) {
  for (int part = 0; part < 2; ++part) {  // the kernels' chunk layout is the Program's
    TWIN_EXEC_CHECK(k::cp_chunk_of(s.cp_rank, part, s.cp) == model::cp_sequence_chunk(s.cp_rank, part, s.cp),
                    "context parallelism: the kernels' chunk layout differs from model/context_parallel's");
  }
}

// Each local chunk of each sequence, rotated as the tokens at its place in the whole sequence.
void rotate_chunks(const Tensor& qkv, const ContextShape& s, int rotary_dim, bool backward) {
  check_layout(s);
  const int local = s.seq / s.cp, chunk = s.seq / (2 * s.cp);
  for (int b = 0; b < s.batch; ++b) {
    for (int part = 0; part < 2; ++part) {
      float* rows = qkv.f32() + (sz(b) * sz(local) + sz(part) * sz(chunk)) * qkv_row(s);
      const int first = model::cp_sequence_chunk(s.cp_rank, part, s.cp) * chunk;
      if (backward) {
        k::rope_backward(rows, 1, chunk, s.heads, s.kv_heads, s.head_dim, kRopeBase, rotary_dim, first);
      } else {
        k::rope_forward(rows, 1, chunk, s.heads, s.kv_heads, s.head_dim, kRopeBase, rotary_dim, first);
      }
    }
  }
}

// kv_full (B, seq, 2 KV D), the whole sequence in order <- keys, values (cp, B, L, KV D) in rank order.
std::vector<float> whole_sequence_kv(const Tensor& keys, const Tensor& values, const ContextShape& s) {
  const std::size_t kv = sz(s.kv_heads) * sz(s.head_dim), rows = sz(s.cp) * sz(s.batch) * sz(s.seq / s.cp);
  std::vector<float> blocks(rows * 2 * kv), full(blocks.size());
  for (std::size_t r = 0; r < rows; ++r) {
    std::memcpy(blocks.data() + r * 2 * kv, keys.f32() + r * kv, kv * sizeof(float));
    std::memcpy(blocks.data() + r * 2 * kv + kv, values.f32() + r * kv, kv * sizeof(float));
  }
  k::cp_blocks_to_sequence(full.data(), blocks.data(), s.batch, s.seq, static_cast<int>(2 * kv), s.cp);
  return full;
}

}  // namespace

void CpuBackend::do_context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim) {
  rotate_chunks(qkv, shape, rotary_dim, false);
}

void CpuBackend::do_context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim) {
  rotate_chunks(dqkv, shape, rotary_dim, true);
}

void CpuBackend::do_context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                              const ContextShape& s) {
  const std::size_t tokens = sz(s.batch) * sz(s.seq / s.cp), kv = sz(s.kv_heads) * sz(s.head_dim);
  const std::size_t row = qkv_row(s), q = sz(s.heads) * sz(s.head_dim);
  for (std::size_t t = 0; t < tokens; ++t) {
    std::memcpy(keys.f32() + t * kv, qkv.f32() + t * row + q, kv * sizeof(float));
    std::memcpy(values.f32() + t * kv, qkv.f32() + t * row + q + kv, kv * sizeof(float));
  }
}

void CpuBackend::do_context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                              const Tensor& keys, const Tensor& values, const ContextShape& s) {
  check_layout(s);
  const std::vector<float> kv_full = whole_sequence_kv(keys, values, s);
  k::all_gather_attention_forward(out.f32(), lse.f32(), qkv.f32(), kv_full.data(), s.cp_rank, kernel_shape(s));
}

void CpuBackend::do_context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues,
                                               const Tensor& dout, const Tensor& qkv, const Tensor& keys,
                                               const Tensor& values, const Tensor& out, const Tensor& lse,
                                               const ContextShape& s) {
  check_layout(s);
  const std::size_t tokens = sz(s.batch) * sz(s.seq / s.cp), q = sz(s.heads) * sz(s.head_dim);
  const std::size_t kv = sz(s.kv_heads) * sz(s.head_dim), row = qkv_row(s);
  const k::ContextParallelShape shape = kernel_shape(s);
  const std::vector<float> kv_full = whole_sequence_kv(keys, values, s);
  std::vector<float> delta(tokens * sz(s.heads)), dq(tokens * q, 0.0f), dkv_full(kv_full.size(), 0.0f);
  k::ring_attention_delta(delta.data(), dout.f32(), out.f32(), shape);
  k::all_gather_attention_backward(dq.data(), dkv_full.data(), dout.f32(), qkv.f32(), kv_full.data(), lse.f32(),
                                   delta.data(), s.cp_rank, shape);
  std::memset(dqkv.f32(), 0, dqkv.numel * sizeof(float));
  for (std::size_t t = 0; t < tokens; ++t) std::memcpy(dqkv.f32() + t * row, dq.data() + t * q, q * sizeof(float));
  std::vector<float> blocks(dkv_full.size());  // (cp, B, L, 2 KV D): rank j's rows at rank j's block
  k::cp_sequence_to_blocks(blocks.data(), dkv_full.data(), s.batch, s.seq, static_cast<int>(2 * kv), s.cp);
  for (std::size_t r = 0; r < sz(s.cp) * tokens; ++r) {
    std::memcpy(dkeys.f32() + r * kv, blocks.data() + r * 2 * kv, kv * sizeof(float));
    std::memcpy(dvalues.f32() + r * kv, blocks.data() + r * 2 * kv + kv, kv * sizeof(float));
  }
}

void CpuBackend::do_context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                               const ContextShape& s) {
  const std::size_t tokens = sz(s.batch) * sz(s.seq / s.cp), kv = sz(s.kv_heads) * sz(s.head_dim);
  const std::size_t row = qkv_row(s), at = sz(s.heads) * sz(s.head_dim) + (values ? kv : 0);
  for (std::size_t t = 0; t < tokens; ++t)
    std::memcpy(dqkv.f32() + t * row + at, grad.f32() + t * kv, kv * sizeof(float));
}

}  // namespace twin::exec::cpu
