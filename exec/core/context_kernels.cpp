// The Backend's context-parallel methods (the all_gather way, the p2p ring, the a2a way): the layout and the shapes
// every backend's kernels need, checked once, then the kernel. That the kernels' chunk order is the Program's
// (model::cp_sequence_chunk) each backend checks against its own kernels.
#include "exec/core/context_kernels.hpp"
#include "exec/core/check.hpp"
#include "exec/core/sizes.hpp"

namespace twin::exec {

namespace {

// The local tokens (B x L), and the widths of a qkv row, an attention output row and a key (or value) row.
struct Widths {
  std::size_t tokens, qkv, out, kv;
};

Widths widths(const ContextShape& s) {
  return {sz(s.batch) * sz(s.seq / s.cp), sz(s.heads + 2 * s.kv_heads) * sz(s.head_dim), sz(s.heads) * sz(s.head_dim),
          sz(s.kv_heads) * sz(s.head_dim)};
}

// A rank's layout: two chunks of seq / (2 cp) tokens of each sequence
Widths checked_layout(const ContextShape& s) {
  TWIN_EXEC_CHECK(s.cp > 1 && s.cp_rank >= 0 && s.cp_rank < s.cp && s.seq % (2 * s.cp) == 0,
                  "context parallelism: rank {} of {} with a sequence of {}", s.cp_rank, s.cp, s.seq);
  return widths(s);
}

void check_numel(const Tensor& t, std::size_t want, const char* method, const char* tensor) {
  TWIN_EXEC_CHECK(t.numel == want, "{}: {} has {} elements, not {}", method, tensor, t.numel, want);
}

void check_source(int source, const ContextShape& s) {
  TWIN_EXEC_CHECK(source >= 0 && source < s.cp, "ring step: source rank {} of {}", source, s.cp);
}

// The column range [column, column + heads D) of `rows` rows of `width` in t; split: heads divide among the CP ranks.
void check_range(const Tensor& t, std::size_t rows, int width, int column, int heads, bool split, const ContextShape& s,
                 const char* method) {
  TWIN_EXEC_CHECK(s.cp > 1 && heads > 0 && s.seq % (2 * s.cp) == 0 && (!split || heads % s.cp == 0),
                  "{}: {} heads over {} CP ranks, a sequence of {}", method, heads, s.cp, s.seq);
  TWIN_EXEC_CHECK(t.numel == rows * sz(width) && column >= 0 && sz(column) + sz(heads) * sz(s.head_dim) <= sz(width),
                  "{}: {} elements for {} rows of {} (columns {} + {} heads of {})", method, t.numel, rows, width,
                  column, heads, s.head_dim);
}

}  // namespace

// --- the all_gather way
// -----------------------------------------------------------------------------------------------

void ContextKernels::context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim) {
  const Widths w = checked_layout(shape);
  check_numel(qkv, w.tokens * w.qkv, "context_rope_forward", "qkv");
  before_kernel("context_rope_forward", {{qkv, "qkv"}});
  do_context_rope_forward(qkv, shape, rotary_dim);
}

void ContextKernels::context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim) {
  const Widths w = checked_layout(shape);
  check_numel(dqkv, w.tokens * w.qkv, "context_rope_backward", "dqkv");
  before_kernel("context_rope_backward", {{dqkv, "dqkv"}});
  do_context_rope_backward(dqkv, shape, rotary_dim);
}

void ContextKernels::context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                               const ContextShape& shape) {
  const char* method = "context_split_keys_values";
  const Widths w = checked_layout(shape);
  check_numel(qkv, w.tokens * w.qkv, method, "qkv");
  check_numel(keys, w.tokens * w.kv, method, "keys");
  check_numel(values, w.tokens * w.kv, method, "values");
  before_kernel("context_split_keys_values", {{keys, "keys"}, {values, "values"}, {qkv, "qkv"}});
  do_context_split_keys_values(keys, values, qkv, shape);
}

void ContextKernels::context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                               const Tensor& keys, const Tensor& values, const ContextShape& shape) {
  const char* method = "context_attention_forward";
  const Widths w = checked_layout(shape);
  check_numel(out, w.tokens * w.out, method, "out");
  check_numel(lse, w.tokens * sz(shape.heads), method, "lse");
  check_numel(qkv, w.tokens * w.qkv, method, "qkv");
  check_numel(keys, sz(shape.cp) * w.tokens * w.kv, method, "keys");
  check_numel(values, sz(shape.cp) * w.tokens * w.kv, method, "values");
  before_kernel("context_attention_forward",
                {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}, {keys, "keys"}, {values, "values"}});
  do_context_attention_forward(out, lse, qkv, keys, values, shape);
}

void ContextKernels::context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues,
                                                const Tensor& dout, const Tensor& qkv, const Tensor& keys,
                                                const Tensor& values, const Tensor& out, const Tensor& lse,
                                                const ContextShape& shape) {
  const char* method = "context_attention_backward";
  const Widths w = checked_layout(shape);
  check_numel(dqkv, w.tokens * w.qkv, method, "dqkv");
  check_numel(qkv, w.tokens * w.qkv, method, "qkv");
  check_numel(dout, w.tokens * w.out, method, "dout");
  check_numel(out, w.tokens * w.out, method, "out");
  check_numel(lse, w.tokens * sz(shape.heads), method, "lse");
  for (const Tensor* t : {&dkeys, &dvalues, &keys, &values}) {
    check_numel(*t, sz(shape.cp) * w.tokens * w.kv, method, "a K/V block");
  }
  before_kernel("context_attention_backward", {{dqkv, "dqkv"},
                                               {dkeys, "dkeys"},
                                               {dvalues, "dvalues"},
                                               {dout, "dout"},
                                               {qkv, "qkv"},
                                               {keys, "keys"},
                                               {values, "values"},
                                               {out, "out"},
                                               {lse, "lse"}});
  do_context_attention_backward(dqkv, dkeys, dvalues, dout, qkv, keys, values, out, lse, shape);
}

void ContextKernels::context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                                const ContextShape& shape) {
  const Widths w = checked_layout(shape);
  check_numel(dqkv, w.tokens * w.qkv, "context_put_key_value_grad", "dqkv");
  check_numel(grad, w.tokens * w.kv, "context_put_key_value_grad", "grad");
  before_kernel("context_put_key_value_grad", {{dqkv, "dqkv"}, {grad, "grad"}});
  do_context_put_key_value_grad(dqkv, grad, values, shape);
}

// --- the p2p ring
// -----------------------------------------------------------------------------------------------------

void ContextKernels::context_ring_pack_kv(const Tensor& kv, const Tensor& qkv, const ContextShape& shape) {
  const Widths w = checked_layout(shape);
  check_numel(kv, w.tokens * 2 * w.kv, "context_ring_pack_kv", "kv");
  check_numel(qkv, w.tokens * w.qkv, "context_ring_pack_kv", "qkv");
  before_kernel("context_ring_pack_kv", {{kv, "kv"}, {qkv, "qkv"}});
  do_context_ring_pack_kv(kv, qkv, shape);
}

void ContextKernels::context_ring_forward_step(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                               const Tensor& kv, int source, const ContextShape& shape) {
  const char* method = "context_ring_forward_step";
  const Widths w = checked_layout(shape);
  check_source(source, shape);
  check_numel(out, w.tokens * w.out, method, "out");
  check_numel(lse, w.tokens * sz(shape.heads), method, "lse");
  check_numel(qkv, w.tokens * w.qkv, method, "qkv");
  check_numel(kv, w.tokens * 2 * w.kv, method, "kv");
  before_kernel("context_ring_forward_step", {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}, {kv, "kv"}});
  do_context_ring_forward_step(out, lse, qkv, kv, source, shape);
}

void ContextKernels::context_ring_delta(const Tensor& delta, const Tensor& dout, const Tensor& out,
                                        const ContextShape& shape) {
  const Widths w = checked_layout(shape);
  check_numel(delta, w.tokens * sz(shape.heads), "context_ring_delta", "delta");
  check_numel(dout, w.tokens * w.out, "context_ring_delta", "dout");
  check_numel(out, w.tokens * w.out, "context_ring_delta", "out");
  before_kernel("context_ring_delta", {{delta, "delta"}, {dout, "dout"}, {out, "out"}});
  do_context_ring_delta(delta, dout, out, shape);
}

void ContextKernels::context_ring_backward_step(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                                const Tensor& qkv, const Tensor& kv, const Tensor& lse,
                                                const Tensor& delta, int source, const ContextShape& shape) {
  const char* method = "context_ring_backward_step";
  const Widths w = checked_layout(shape);
  check_source(source, shape);
  check_numel(dq, w.tokens * w.out, method, "dq");
  check_numel(dout, w.tokens * w.out, method, "dout");
  check_numel(qkv, w.tokens * w.qkv, method, "qkv");
  check_numel(kv, w.tokens * 2 * w.kv, method, "kv");
  check_numel(dkv, w.tokens * 2 * w.kv, method, "dkv");
  check_numel(lse, w.tokens * sz(shape.heads), method, "lse");
  check_numel(delta, w.tokens * sz(shape.heads), method, "delta");
  before_kernel("context_ring_backward_step",
                {{dq, "dq"}, {dkv, "dkv"}, {dout, "dout"}, {qkv, "qkv"}, {kv, "kv"}, {lse, "lse"}, {delta, "delta"}});
  do_context_ring_backward_step(dq, dkv, dout, qkv, kv, lse, delta, source, shape);
}

void ContextKernels::context_ring_put_grads(const Tensor& dqkv, const Tensor& dq, const Tensor& dkv,
                                            const ContextShape& shape) {
  const Widths w = checked_layout(shape);
  check_numel(dqkv, w.tokens * w.qkv, "context_ring_put_grads", "dqkv");
  check_numel(dq, w.tokens * w.out, "context_ring_put_grads", "dq");
  check_numel(dkv, w.tokens * 2 * w.kv, "context_ring_put_grads", "dkv");
  before_kernel("context_ring_put_grads", {{dqkv, "dqkv"}, {dq, "dq"}, {dkv, "dkv"}});
  do_context_ring_put_grads(dqkv, dq, dkv, shape);
}

// --- the a2a way (Ulysses)
// --------------------------------------------------------------------------------------------

void ContextKernels::ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                                         const ContextShape& shape) {
  const std::size_t rows = widths(shape).tokens;
  check_range(local, rows, width, column, heads, true, shape, "ulysses_split_heads");
  check_numel(send, rows * sz(heads) * sz(shape.head_dim), "ulysses_split_heads", "send");
  before_kernel("ulysses_split_heads", {{send, "send"}, {local, "local"}});
  do_ulysses_split_heads(send, local, width, column, heads, shape);
}

void ContextKernels::ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                                        const ContextShape& shape) {
  const std::size_t rows = widths(shape).tokens;
  check_range(local, rows, width, column, heads, true, shape, "ulysses_join_heads");
  check_numel(recv, rows * sz(heads) * sz(shape.head_dim), "ulysses_join_heads", "recv");
  before_kernel("ulysses_join_heads", {{local, "local"}, {recv, "recv"}});
  do_ulysses_join_heads(local, recv, width, column, heads, shape);
}

void ContextKernels::ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column,
                                                int heads, const ContextShape& shape) {
  const std::size_t rows = sz(shape.batch) * sz(shape.seq);
  check_range(full, rows, width, column, heads, false, shape, "ulysses_blocks_to_sequence");
  check_numel(blocks, rows * sz(heads) * sz(shape.head_dim), "ulysses_blocks_to_sequence", "blocks");
  before_kernel("ulysses_blocks_to_sequence", {{full, "full"}, {blocks, "blocks"}});
  do_ulysses_blocks_to_sequence(full, blocks, width, column, heads, shape);
}

void ContextKernels::ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column,
                                                int heads, const ContextShape& shape) {
  const std::size_t rows = sz(shape.batch) * sz(shape.seq);
  check_range(full, rows, width, column, heads, false, shape, "ulysses_sequence_to_blocks");
  check_numel(blocks, rows * sz(heads) * sz(shape.head_dim), "ulysses_sequence_to_blocks", "blocks");
  before_kernel("ulysses_sequence_to_blocks", {{blocks, "blocks"}, {full, "full"}});
  do_ulysses_sequence_to_blocks(blocks, full, width, column, heads, shape);
}

}  // namespace twin::exec
