// The CPU backend's context parallelism, the p2p ring: kernels/cpu/ring_attention.hpp's ring steps on the layouts
// the interpreter moves around the ring (a K/V block: one rank's keys then values per token, (B, L, 2 KV D)).
#include <cstring>

#include "exec/core/check.hpp"
#include "exec/core/sizes.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec/cpu/cpu_context_shape.hpp"
#include "kernels/cpu/ring_attention.hpp"

namespace twin::exec::cpu {

namespace k = twin::kernels::cpu;

namespace {

std::size_t tokens(const ContextShape& s) {
  return sz(s.batch) * sz(s.seq / s.cp);
}

}  // namespace

void CpuBackend::do_context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& s) {
  k::cp_pack_kv(kv.f32(), qkv.f32(), s.batch, s.seq / s.cp, s.heads, s.kv_heads, s.head_dim);
}

void CpuBackend::do_context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                              int source, const ContextShape& s) {
  k::ring_attention_forward_step(out.f32(), lse.f32(), qkv.f32(), kv.f32(), s.cp_rank, source, kernel_shape(s));
}

void CpuBackend::do_context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out,
                                       const ContextShape& s) {
  k::ring_attention_delta(delta.f32(), dout.f32(), out.f32(), kernel_shape(s));
}

void CpuBackend::do_context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                               const Tensor& qkv, const Tensor& kv, const Tensor& lse,
                                               const Tensor& delta, int source, const ContextShape& s) {
  k::ring_attention_backward_step(dq.f32(), dkv.f32(), dout.f32(), qkv.f32(), kv.f32(), lse.f32(), delta.f32(),
                                  s.cp_rank, source, kernel_shape(s));
}

void CpuBackend::do_context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                           const ContextShape& s) {
  const std::size_t q = sz(s.heads) * sz(s.head_dim), row = q + 2 * sz(s.kv_heads) * sz(s.head_dim);
  std::memset(dqkv.f32(), 0, dqkv.numel * sizeof(float));
  for (std::size_t t = 0; t < tokens(s); ++t) std::memcpy(dqkv.f32() + t * row, dq.f32() + t * q, q * sizeof(float));
  k::cp_add_kv_gradient(dqkv.f32(), dkv.f32(), s.batch, s.seq / s.cp, s.heads, s.kv_heads, s.head_dim);
}

}  // namespace twin::exec::cpu
