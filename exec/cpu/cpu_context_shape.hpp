// A rank's context-parallel attention shape as the CPU kernels take it (kernels/cpu/ring_attention.hpp): what the
// all-gather and the ring ways hand them.
#pragma once

#include "exec/core/context_kernels.hpp"
#include "kernels/cpu/ring_attention.hpp"

namespace twin::exec::cpu {

inline kernels::cpu::ContextParallelShape kernel_shape(const ContextShape& s) {
  kernels::cpu::ContextParallelShape shape;
  shape.batch = s.batch;
  shape.seq = s.seq;
  shape.heads = s.heads;
  shape.kv_heads = s.kv_heads;
  shape.head_dim = s.head_dim;
  shape.cp = s.cp;
  return shape;
}

}  // namespace twin::exec::cpu
