// The way framework.cp_comm names, and what every way shares: the context kernels' shape, the position embedding of
// the rank's two chunks of each sequence.
#include "exec/interpreter/context/context_attention.hpp"

#include "exec/interpreter/context/all_gather_attention.hpp"
#include "exec/interpreter/context/ring_attention.hpp"
#include "exec/interpreter/context/ulysses_attention.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::exec {

std::unique_ptr<ContextAttention> make_context_attention(RankContext& ctx) {
  switch (ctx.scenario.framework.cp_comm) {
    case model::CpComm::P2P:
      return std::make_unique<RingAttention>(ctx);
    case model::CpComm::AllToAll:
      return std::make_unique<UlyssesAttention>(ctx);
    case model::CpComm::AllGather:
      break;
  }
  return std::make_unique<AllGatherAttention>(ctx);
}

ContextShape context_shape(const Dims& dims) {
  ContextShape shape;
  shape.batch = dims.batch;
  shape.seq = dims.seq * dims.cp;
  shape.heads = dims.heads_local;
  shape.kv_heads = dims.kv_heads_local;
  shape.head_dim = dims.head_dim;
  shape.cp = dims.cp;
  shape.cp_rank = dims.cp_rank;
  return shape;
}

// Each local chunk of each sequence (rows [b L + part C, + C) of x) at its chunk's positions of wpe.
void context_position_embedding(RankContext& ctx, const Tensor& x, bool backward) {
  const Dims& dims = ctx.dims;
  const int chunk = dims.seq / 2;
  const std::size_t rows = numel(chunk, dims.hidden);
  for (int b = 0; b < dims.batch; ++b) {
    for (int part = 0; part < 2; ++part) {
      const Tensor mine = x.slice(numel(b * dims.seq + part * chunk, dims.hidden), rows);
      const int first = model::cp_sequence_chunk(dims.cp_rank, part, dims.cp) * chunk;
      if (backward) {
        ctx.backend.position_embedding_backward(ctx.shard.wpe_grad.slice(numel(first, dims.hidden), rows), mine, 1,
                                                chunk, dims.hidden);
      } else {
        ctx.backend.position_embedding_forward(mine, ctx.shard.wpe.slice(numel(first, dims.hidden), rows), 1, chunk,
                                               dims.hidden);
      }
    }
  }
}

}  // namespace twin::exec
