// The CUDA backend's context parallelism, all three ways (the all_gather way, the p2p ring, the a2a way), on
// kernels/cuda/context_parallel.cuh: the CPU backend's methods (exec/cpu/cpu_context_*.cpp) on bf16 tensors with fp32
// lse and delta. The layouts are the interpreter's: every CP rank's keys and values as (cp, B, L, KV D) blocks in rank
// order (all_gather), one rank's K/V block (B, L, 2 KV D) (ring), a column range of a token-major tensor (Ulysses).
// Each method describes its tensors to the kernels (context::Layout, KeyBlocks, an index map) and launches.
#include "exec/core/check.hpp"
#include "exec/core/sizes.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "kernels/cuda/context_parallel.cuh"
#include "model/ops/context_parallel.hpp"

namespace twin::exec::cuda {

namespace k = twin::kernels::cuda;
namespace ctx = twin::kernels::cuda::context;
using bf16 = __nv_bfloat16;

namespace {

// The kernels' view of a rank's shape, after the checks every method needs: a layout the Program's chunks follow.
ctx::Layout layout(const ContextShape& s) {
  TWIN_EXEC_CHECK(s.heads % s.kv_heads == 0 && s.head_dim <= ctx::kMaxHeadDim,
                  "cuda context parallelism: {} heads on {} kv heads of {} (at most {})", s.heads, s.kv_heads,
                  s.head_dim, ctx::kMaxHeadDim);
  for (int part = 0; part < 2; ++part) {  // the kernels' chunk layout is the Program's
    TWIN_EXEC_CHECK(ctx::chunk_of(s.cp_rank, part, s.cp) == model::cp_sequence_chunk(s.cp_rank, part, s.cp),
                    "context parallelism: the kernels' chunk layout differs from model/context_parallel's");
  }
  return ctx::Layout{s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, s.cp};
}

}  // namespace

// --- the all_gather way ---------------------------------------------------------------------------------------------

void CudaBackend::do_context_rope_forward(const Tensor& qkv, const ContextShape& s, int rotary_dim) {
  const ctx::Layout l = layout(s);
  k::context_rope(b16(qkv, "context_rope_forward", "qkv"), l, s.cp_rank, rotary_dim, false, context_->compute());
}

void CudaBackend::do_context_rope_backward(const Tensor& dqkv, const ContextShape& s, int rotary_dim) {
  const ctx::Layout l = layout(s);
  k::context_rope(b16(dqkv, "context_rope_backward", "dqkv"), l, s.cp_rank, rotary_dim, true, context_->compute());
}

void CudaBackend::do_context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                               const ContextShape& s) {
  const char* method = "context_split_keys_values";
  const ctx::Layout l = layout(s);
  const std::size_t n = l.tokens() * l.kv_width();
  const bf16* from = b16(qkv, method, "qkv");
  k::context_gather(b16(keys, method, "keys"), from, n, ctx::ColumnRange{l.qkv_width(), l.out_width(), l.kv_width()},
                    context_->compute());
  k::context_gather(b16(values, method, "values"), from, n,
                    ctx::ColumnRange{l.qkv_width(), l.out_width() + l.kv_width(), l.kv_width()}, context_->compute());
}

void CudaBackend::do_context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                               const Tensor& keys, const Tensor& values, const ContextShape& s) {
  const char* method = "context_attention_forward";
  const ctx::Layout l = layout(s);
  const std::size_t block = l.tokens() * l.kv_width();
  const ctx::KeyBlocks<const bf16> all{
      b16(keys, method, "keys"), b16(values, method, "values"), l.kv_width(), block, 0, s.cp};
  k::context_attention_forward(b16(out, method, "out"), f32(lse, method, "lse"), b16(qkv, method, "qkv"), all,
                               s.cp_rank, false, l, context_->compute());
}

void CudaBackend::do_context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues,
                                                const Tensor& dout, const Tensor& qkv, const Tensor& keys,
                                                const Tensor& values, const Tensor& out, const Tensor& lse,
                                                const ContextShape& s) {
  const char* method = "context_attention_backward";
  const ctx::Layout l = layout(s);
  const std::size_t block = l.tokens() * l.kv_width(), stats = l.tokens() * sz(s.heads);
  Tensor delta = allocate(stats, DType::F32);
  k::context_attention_delta(f32(delta, method, "delta"), b16(dout, method, "dout"), b16(out, method, "out"), l,
                             context_->compute());
  fill(dqkv, 0.0f);  // dq below; the key and value columns come back reduce-scattered
  const ctx::Backward<bf16> x{b16(dout, method, "dout"), b16(qkv, method, "qkv"), f32(lse, method, "lse"),
                              f32(delta, method, "delta"), s.cp_rank};
  const ctx::KeyBlocks<const bf16> all{
      b16(keys, method, "keys"), b16(values, method, "values"), l.kv_width(), block, 0, s.cp};
  const ctx::KeyBlocks<bf16> grads{
      b16(dkeys, method, "dkeys"), b16(dvalues, method, "dvalues"), l.kv_width(), block, 0, s.cp};
  k::context_attention_backward(b16(dqkv, method, "dqkv"), l.qkv_width(), grads, false, x, all, l, context_->compute());
}

void CudaBackend::do_context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                                const ContextShape& s) {
  const char* method = "context_put_key_value_grad";
  const ctx::Layout l = layout(s);
  const std::size_t column = l.out_width() + (values ? l.kv_width() : 0);
  k::context_scatter(b16(dqkv, method, "dqkv"), b16(grad, method, "grad"), grad.numel,
                     ctx::ColumnRange{l.qkv_width(), column, l.kv_width()}, context_->compute());
}

// --- the p2p ring ---------------------------------------------------------------------------------------------------

namespace {

template <class T>
ctx::KeyBlocks<T> ring_block(T* kv, int source, const ctx::Layout& l) {
  return ctx::KeyBlocks<T>{kv, kv + l.kv_width(), 2 * l.kv_width(), 0, source, 1};
}

}  // namespace

void CudaBackend::do_context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& s) {
  const char* method = "context_ring_pack_kv";
  const ctx::Layout l = layout(s);
  k::context_gather(b16(kv, method, "kv"), b16(qkv, method, "qkv"), kv.numel,
                    ctx::ColumnRange{l.qkv_width(), l.out_width(), 2 * l.kv_width()}, context_->compute());
}

void CudaBackend::do_context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                               const Tensor& kv, int source, const ContextShape& s) {
  const char* method = "context_ring_forward_step";
  const ctx::Layout l = layout(s);
  const bf16* block = b16(kv, method, "kv");
  k::context_attention_forward(b16(out, method, "out"), f32(lse, method, "lse"), b16(qkv, method, "qkv"),
                               ring_block(block, source, l), s.cp_rank, source != s.cp_rank, l, context_->compute());
}

void CudaBackend::do_context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out,
                                        const ContextShape& s) {
  const char* method = "context_ring_delta";
  const ctx::Layout l = layout(s);
  k::context_attention_delta(f32(delta, method, "delta"), b16(dout, method, "dout"), b16(out, method, "out"), l,
                             context_->compute());
}

void CudaBackend::do_context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                                const Tensor& qkv, const Tensor& kv, const Tensor& lse,
                                                const Tensor& delta, int source, const ContextShape& s) {
  const char* method = "context_ring_backward_step";
  const ctx::Layout l = layout(s);
  const ctx::Backward<bf16> x{b16(dout, method, "dout"), b16(qkv, method, "qkv"), f32(lse, method, "lse"),
                              f32(delta, method, "delta"), s.cp_rank};
  const bf16* block = b16(kv, method, "kv");
  k::context_attention_backward(b16(dq, method, "dq"), l.out_width(), ring_block(b16(dkv, method, "dkv"), source, l),
                                true, x, ring_block(block, source, l), l, context_->compute());
}

void CudaBackend::do_context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                            const ContextShape& s) {
  const char* method = "context_ring_put_grads";
  const ctx::Layout l = layout(s);
  bf16* to = b16(dqkv, method, "dqkv");  // every column written: dq, then the keys and values
  k::context_scatter(to, b16(dq, method, "dq"), dq.numel, ctx::ColumnRange{l.qkv_width(), 0, l.out_width()},
                     context_->compute());
  k::context_scatter(to, b16(dkv, method, "dkv"), dkv.numel,
                     ctx::ColumnRange{l.qkv_width(), l.out_width(), 2 * l.kv_width()}, context_->compute());
}

// --- the a2a way (Ulysses) ------------------------------------------------------------------------------------------

namespace {}  // namespace

void CudaBackend::do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                                         const ContextShape& s) {
  const char* method = "ulysses_split_heads";
  const std::size_t rows = sz(s.batch) * sz(s.seq / s.cp);
  const ctx::HeadGroups groups{rows, sz(width), sz(column), sz(heads / s.cp) * sz(s.head_dim)};
  k::context_gather(b16(send, method, "send"), b16(local, method, "local"), send.numel, groups, context_->compute());
}

void CudaBackend::do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                                        const ContextShape& s) {
  const char* method = "ulysses_join_heads";
  const std::size_t rows = sz(s.batch) * sz(s.seq / s.cp);
  const ctx::HeadGroups groups{rows, sz(width), sz(column), sz(heads / s.cp) * sz(s.head_dim)};
  k::context_scatter(b16(local, method, "local"), b16(recv, method, "recv"), recv.numel, groups, context_->compute());
}

void CudaBackend::do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column,
                                                int heads, const ContextShape& s) {
  const char* method = "ulysses_blocks_to_sequence";
  const ctx::SequenceBlocks order{s.batch, s.seq, s.cp, sz(width), sz(column), sz(heads) * sz(s.head_dim)};
  k::context_scatter(b16(full, method, "full"), b16(blocks, method, "blocks"), blocks.numel, order,
                     context_->compute());
}

void CudaBackend::do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column,
                                                int heads, const ContextShape& s) {
  const char* method = "ulysses_sequence_to_blocks";
  const ctx::SequenceBlocks order{s.batch, s.seq, s.cp, sz(width), sz(column), sz(heads) * sz(s.head_dim)};
  k::context_gather(b16(blocks, method, "blocks"), b16(full, method, "full"), blocks.numel, order, context_->compute());
}

}  // namespace twin::exec::cuda
