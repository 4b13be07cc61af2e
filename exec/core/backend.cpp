#include "exec/core/backend.hpp"

#include <string>

#include <fmt/format.h>

#include "exec/core/errors.hpp"

namespace twin::exec {

Fp8Amaxes Backend::fp8_matmul_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, int,
                                      const Fp8Operand&, const Fp8Operand&) {
  throw RunError(fmt::format("model.fp8: the {} backend runs no FP8 GEMMs (the cpu backend emulates them)", name()));
}

Fp8Amaxes Backend::fp8_matmul_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, int, int, int, const Fp8Operand&, const Fp8Operand&,
                                       const Fp8Operand&) {
  throw RunError(fmt::format("model.fp8: the {} backend runs no FP8 GEMMs (the cpu backend emulates them)", name()));
}

namespace {
[[noreturn]] void no_context_parallelism(std::string_view backend) {
  throw RunError(
      fmt::format("parallel.cp: the {} backend does not run context parallelism yet (the cpu backend does)", backend));
}
}  // namespace

void Backend::context_rope_forward(const Tensor&, const ContextShape&, int) {
  no_context_parallelism(name());
}
void Backend::context_rope_backward(const Tensor&, const ContextShape&, int) {
  no_context_parallelism(name());
}
void Backend::context_split_keys_values(const Tensor&, const Tensor&, const Tensor&, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_put_key_value_grad(const Tensor&, const Tensor&, bool, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_ring_pack_kv(const Tensor&, const Tensor&, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_ring_forward_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int,
                                        const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_ring_delta(const Tensor&, const Tensor&, const Tensor&, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_ring_backward_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&, int, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::context_ring_put_grads(const Tensor&, const Tensor&, const Tensor&, const ContextShape&) {
  no_context_parallelism(name());
}

void Backend::ulysses_split_heads(const Tensor&, const Tensor&, int, int, int, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::ulysses_join_heads(const Tensor&, const Tensor&, int, int, int, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::ulysses_blocks_to_sequence(const Tensor&, const Tensor&, int, int, int, const ContextShape&) {
  no_context_parallelism(name());
}
void Backend::ulysses_sequence_to_blocks(const Tensor&, const Tensor&, int, int, int, const ContextShape&) {
  no_context_parallelism(name());
}

namespace {
[[noreturn]] void no_moe(std::string_view backend) {
  throw RunError(fmt::format("model.experts: the {} backend does not run Mixture-of-Experts layers", backend));
}
}  // namespace

void Backend::download_i32(int*, const Tensor&) {
  no_moe(name());
}
void Backend::moe_topk_softmax_forward(const Tensor&, const Tensor&, const Tensor&, int, int, int) {
  no_moe(name());
}
void Backend::moe_router_scores_forward(const Tensor&, const Tensor&, int, int) {
  no_moe(name());
}
double Backend::moe_aux_loss_forward(const Tensor&, const std::vector<float>&, int, int, int, double, double) {
  no_moe(name());
}
void Backend::moe_router_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const std::vector<float>&, int, int, int, const MoeAuxLoss&) {
  no_moe(name());
}
void Backend::moe_permute_forward(const Tensor&, const Tensor&, const Tensor&, int, int, int) {
  no_moe(name());
}
void Backend::moe_permute_backward(const Tensor&, const Tensor&, const Tensor&, int, int, int) {
  no_moe(name());
}
void Backend::moe_unpermute_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int, int) {
  no_moe(name());
}
void Backend::moe_unpermute_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, int, int, int) {
  no_moe(name());
}
void Backend::moe_sort_chunks_forward(const Tensor&, const Tensor&, const std::vector<int>&, const std::vector<int>&,
                                      int) {
  no_moe(name());
}
void Backend::moe_sort_chunks_backward(const Tensor&, const Tensor&, const std::vector<int>&, const std::vector<int>&,
                                       int) {
  no_moe(name());
}
void Backend::moe_grouped_matmul_forward(const Tensor&, const Tensor&, const Tensor&, const std::vector<int>&, int,
                                         int) {
  no_moe(name());
}
void Backend::moe_grouped_matmul_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const std::vector<int>&, int, int) {
  no_moe(name());
}

Tensor Backend::zeros(std::size_t numel, DType dtype) {
  Tensor t = allocate(numel, dtype);
  if (numel > 0) fill(t, 0.0f);
  return t;
}

double Backend::squared_norm_sum(const std::vector<Tensor>& xs) {
  double total = 0;
  for (const Tensor& x : xs) total += squared_norm(x);
  return total;
}

}  // namespace twin::exec
