#include "exec/train/deferred_emulation.hpp"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include <fmt/core.h>

#include "exec/core/check.hpp"

namespace twin::exec {

// --- the deferred calls of one rank ---------------------------------------------------------------------------------

void DeferredCollectives::defer(std::function<void()> call, std::string what, std::vector<ByteRange> memory) {
  work_.add({std::move(call), std::move(what), std::move(memory)});
}

void DeferredCollectives::wait_all() {
  for (auto& entry : work_.take_all()) entry.done();
}

void DeferredCollectives::touch(const Tensor& tensor, std::string_view kernel, std::string_view tensor_name) {
  if (work_.empty() || tensor.empty()) return;
  if (check_ == DeferredCheck::Strict) {
    const auto* entry = work_.find_overlapping(tensor.data, tensor.bytes());
    TWIN_EXEC_CHECK(entry == nullptr,
                    "rank {}: {} touches its {} ({} elements) while the deferred {} still holds that memory: on a GPU "
                    "the two race (nothing orders the compute stream after the NCCL stream before the wait)",
                    rank_, kernel, tensor_name, tensor.numel, entry->what);
    return;
  }
  for (auto& entry : work_.take_through_overlapping(tensor.data, tensor.bytes())) entry.done();
}

// --- the communicator -----------------------------------------------------------------------------------------------

namespace {

// "reduce_scatter <label> on the data group (ranks 0, 2)"; the call is left out when the label already names it
std::string describe(std::string_view call, std::string_view label, const CommGroup& group) {
  const bool named = label.find(call) != std::string_view::npos;
  return fmt::format("{}{}{} on the {} group ({})", named ? "" : call, named ? "" : " ", label, group.kind,
                     format_ranks(group.members));
}

}  // namespace

DeferringCommunicator::DeferringCommunicator(Communicator& host, DeferredCollectives& deferred, DeferralRule rule)
    : host_(host), deferred_(deferred), rule_(rule), name_(std::string(host.name()) + "+deferred-emulation") {}

void DeferringCommunicator::all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype,
                                       std::string_view label) {
  if (!rule_.defers_reduction(group)) {
    deferred_.wait_all();
    return host_.all_reduce(group, data, count, dtype, label);
  }
  // the call keeps copies of the group and label: the caller's may be gone when it runs
  deferred_.defer([this, group, data, count, dtype,
                   label = std::string(label)] { host_.all_reduce(group, data, count, dtype, label); },
                  describe("all_reduce", label, group), {{data, count * dtype_bytes(dtype)}});
}

void DeferringCommunicator::reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count,
                                           DType dtype, std::string_view label) {
  if (!rule_.defers_reduction(group)) {
    deferred_.wait_all();
    return host_.reduce_scatter(group, in, out, count, dtype, label);
  }
  const std::size_t bytes = count * dtype_bytes(dtype);
  deferred_.defer([this, group, in, out, count, dtype,
                   label = std::string(label)] { host_.reduce_scatter(group, in, out, count, dtype, label); },
                  describe("reduce_scatter", label, group), {{in, bytes * group.members.size()}, {out, bytes}});
}

void DeferringCommunicator::all_gather(const CommGroup& group, const void* in, void* out, std::size_t count,
                                       DType dtype, std::string_view label) {
  deferred_.wait_all();
  host_.all_gather(group, in, out, count, dtype, label);
}

void DeferringCommunicator::broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                                      std::string_view label) {
  deferred_.wait_all();
  host_.broadcast(group, data, count, dtype, root, label);
}

void DeferringCommunicator::all_to_all(const CommGroup& group, const void* in,
                                       const std::vector<std::size_t>& send_counts, void* out,
                                       const std::vector<std::size_t>& recv_counts, DType dtype,
                                       std::string_view label) {
  deferred_.wait_all();
  host_.all_to_all(group, in, send_counts, out, recv_counts, dtype, label);
}

void DeferringCommunicator::barrier(const CommGroup& group, std::string_view label) {
  deferred_.wait_all();
  host_.barrier(group, label);
}

void DeferringCommunicator::send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) {
  deferred_.wait_all();
  host_.send(peer, tag, data, bytes);
}

void DeferringCommunicator::recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) {
  deferred_.wait_all();
  host_.recv(peer, tag, data, bytes, label);
}

// --- the backend ----------------------------------------------------------------------------------------------------

namespace {

// Waits where CudaBackend calls DeviceContext::wait_deferred (synchronize, host reads, the gradient norm, AdamW); every
// other kernel touches each of its tensors first, as CudaBackend orders them after the deferred collectives.
class DeferredCheckBackend final : public Backend {
 public:
  DeferredCheckBackend(std::unique_ptr<Backend> inner, DeferredCollectives& deferred)
      : inner_(std::move(inner)), deferred_(deferred) {}

  std::string_view name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  bool keeps_master_weights() const override { return inner_->keeps_master_weights(); }

  Tensor allocate(std::size_t numel, DType dtype) override { return inner_->allocate(numel, dtype); }
  void do_upload_f32(const Tensor& dst, const float* host) override {
    touch("upload_f32", {{dst, "dst"}});
    inner_->upload_f32(dst, host);
  }
  void do_download_f32(float* host, const Tensor& src) override {
    deferred_.wait_all();
    inner_->download_f32(host, src);
  }
  void do_upload_i32(const Tensor& dst, const int* host) override {
    touch("upload_i32", {{dst, "dst"}});
    inner_->upload_i32(dst, host);
  }
  void do_synchronize() override {
    deferred_.wait_all();
    inner_->synchronize();
  }

  void do_fill(const Tensor& x, float value) override {
    touch("fill", {{x, "x"}});
    inner_->fill(x, value);
  }
  void do_copy(const Tensor& dst, const Tensor& src) override {
    touch("copy", {{dst, "dst"}, {src, "src"}});
    inner_->copy(dst, src);
  }
  void do_accumulate(const Tensor& y, const Tensor& x) override {
    touch("accumulate", {{y, "y"}, {x, "x"}});
    inner_->accumulate(y, x);
  }
  void do_residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) override {
    touch("residual_forward", {{out, "out"}, {a, "a"}, {b, "b"}});
    inner_->residual_forward(out, a, b);
  }
  void do_bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) override {
    touch("bias_add", {{out, "out"}, {bias, "bias"}});
    inner_->bias_add(out, bias, rows, channels);
  }
  void do_bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) override {
    touch("bias_backward", {{dbias, "dbias"}, {dout, "dout"}});
    inner_->bias_backward(dbias, dout, rows, channels);
  }
  double do_squared_norm(const Tensor& x) override {
    deferred_.wait_all();
    return inner_->squared_norm(x);
  }
  double do_squared_norm_sum(const std::vector<Tensor>& xs) override {
    deferred_.wait_all();
    return inner_->squared_norm_sum(xs);
  }
  double do_sum(const Tensor& x) override {
    deferred_.wait_all();
    return inner_->sum(x);
  }

  void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows, int channels,
                            int vocab_start, int vocab_local) override {
    touch("embedding_forward", {{out, "out"}, {tokens, "tokens"}, {wte_local, "wte_local"}});
    inner_->embedding_forward(out, tokens, wte_local, rows, channels, vocab_start, vocab_local);
  }
  void do_embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows, int channels,
                             int vocab_start, int vocab_local) override {
    touch("embedding_backward", {{dwte_local, "dwte_local"}, {dout, "dout"}, {tokens, "tokens"}});
    inner_->embedding_backward(dwte_local, dout, tokens, rows, channels, vocab_start, vocab_local);
  }
  void do_position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq, int channels) override {
    touch("position_embedding_forward", {{out, "out"}, {wpe, "wpe"}});
    inner_->position_embedding_forward(out, wpe, batch, seq, channels);
  }
  void do_position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq,
                                      int channels) override {
    touch("position_embedding_backward", {{dwpe, "dwpe"}, {dout, "dout"}});
    inner_->position_embedding_backward(dwpe, dout, batch, seq, channels);
  }

  void do_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                            const Tensor& weight, const Tensor& bias, int rows, int channels) override {
    touch("layernorm_forward",
          {{out, "out"}, {mean, "mean"}, {rstd, "rstd"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}});
    inner_->layernorm_forward(out, mean, rstd, inp, weight, bias, rows, channels);
  }
  void do_layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd, int rows,
                             int channels) override {
    touch("layernorm_backward", {{dinp, "dinp"},
                                 {dweight, "dweight"},
                                 {dbias, "dbias"},
                                 {dout, "dout"},
                                 {inp, "inp"},
                                 {weight, "weight"},
                                 {mean, "mean"},
                                 {rstd, "rstd"}});
    inner_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels);
  }
  void do_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int rows,
                         int in_features, int out_features) override {
    touch("matmul_forward", {{out, "out"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}});
    inner_->matmul_forward(out, inp, weight, bias, rows, in_features, out_features);
  }
  void do_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, int rows, int in_features,
                          int out_features) override {
    touch("matmul_backward",
          {{dinp, "dinp"}, {dweight, "dweight"}, {dbias, "dbias"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}});
    inner_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features);
  }
  Fp8Amaxes do_fp8_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                  int rows, int in_features, int out_features, const Fp8Operand& input,
                                  const Fp8Operand& weights) override {
    touch("fp8_matmul_forward", {{out, "out"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}});
    return inner_->fp8_matmul_forward(out, inp, weight, bias, rows, in_features, out_features, input, weights);
  }
  Fp8Amaxes do_fp8_matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features,
                                   const Fp8Operand& input, const Fp8Operand& weights,
                                   const Fp8Operand& gradient) override {
    touch("fp8_matmul_backward",
          {{dinp, "dinp"}, {dweight, "dweight"}, {dbias, "dbias"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}});
    return inner_->fp8_matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features, input,
                                       weights, gradient);
  }
  void do_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq, int heads,
                            int kv_heads, int head_dim, const Tensor& alibi_slopes) override {
    touch("attention_forward", {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}, {alibi_slopes, "alibi_slopes"}});
    inner_->attention_forward(out, lse, qkv, batch, seq, heads, kv_heads, head_dim, alibi_slopes);
  }
  void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                             const Tensor& alibi_slopes) override {
    touch("attention_backward",
          {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}, {lse, "lse"}, {alibi_slopes, "alibi_slopes"}});
    inner_->attention_backward(dqkv, dout, qkv, out, lse, batch, seq, heads, kv_heads, head_dim, alibi_slopes);
  }
  void do_gelu_forward(const Tensor& out, const Tensor& inp) override {
    touch("gelu_forward", {{out, "out"}, {inp, "inp"}});
    inner_->gelu_forward(out, inp);
  }
  void do_gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override {
    touch("gelu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}});
    inner_->gelu_backward(dinp, inp, dout);
  }

  void do_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, int rows,
                          int channels) override {
    touch("rmsnorm_forward", {{out, "out"}, {rstd, "rstd"}, {inp, "inp"}, {weight, "weight"}});
    inner_->rmsnorm_forward(out, rstd, inp, weight, rows, channels);
  }
  void do_rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd, int rows, int channels) override {
    touch("rmsnorm_backward",
          {{dinp, "dinp"}, {dweight, "dweight"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}, {rstd, "rstd"}});
    inner_->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, channels);
  }
  void do_swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) override {
    touch("swiglu_forward", {{out, "out"}, {inp, "inp"}});
    inner_->swiglu_forward(out, inp, rows, width);
  }
  void do_swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) override {
    touch("swiglu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}});
    inner_->swiglu_backward(dinp, inp, dout, rows, width);
  }
  void do_rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                       int rotary_dim) override {
    touch("rope_forward", {{qkv, "qkv"}});
    inner_->rope_forward(qkv, batch, seq, heads, kv_heads, head_dim, rotary_dim);
  }
  void do_rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                        int rotary_dim) override {
    touch("rope_backward", {{dqkv, "dqkv"}});
    inner_->rope_backward(dqkv, batch, seq, heads, kv_heads, head_dim, rotary_dim);
  }

  void do_context_rope_forward(const Tensor& qkv, const ContextShape& shape, int rotary_dim) override {
    touch("context_rope_forward", {{qkv, "qkv"}});
    inner_->context_rope_forward(qkv, shape, rotary_dim);
  }
  void do_context_rope_backward(const Tensor& dqkv, const ContextShape& shape, int rotary_dim) override {
    touch("context_rope_backward", {{dqkv, "dqkv"}});
    inner_->context_rope_backward(dqkv, shape, rotary_dim);
  }
  void do_context_split_keys_values(const Tensor& keys, const Tensor& values, const Tensor& qkv,
                                    const ContextShape& shape) override {
    touch("context_split_keys_values", {{keys, "keys"}, {values, "values"}, {qkv, "qkv"}});
    inner_->context_split_keys_values(keys, values, qkv, shape);
  }
  void do_context_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& keys,
                                    const Tensor& values, const ContextShape& shape) override {
    touch("context_attention_forward", {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}, {keys, "keys"}, {values, "values"}});
    inner_->context_attention_forward(out, lse, qkv, keys, values, shape);
  }
  void do_context_attention_backward(const Tensor& dqkv, const Tensor& dkeys, const Tensor& dvalues, const Tensor& dout,
                                     const Tensor& qkv, const Tensor& keys, const Tensor& values, const Tensor& out,
                                     const Tensor& lse, const ContextShape& shape) override {
    touch("context_attention_backward", {{dqkv, "dqkv"},
                                         {dkeys, "dkeys"},
                                         {dvalues, "dvalues"},
                                         {dout, "dout"},
                                         {qkv, "qkv"},
                                         {keys, "keys"},
                                         {values, "values"},
                                         {out, "out"},
                                         {lse, "lse"}});
    inner_->context_attention_backward(dqkv, dkeys, dvalues, dout, qkv, keys, values, out, lse, shape);
  }
  void do_context_put_key_value_grad(const Tensor& dqkv, const Tensor& grad, bool values,
                                     const ContextShape& shape) override {
    touch("context_put_key_value_grad", {{dqkv, "dqkv"}, {grad, "grad"}});
    inner_->context_put_key_value_grad(dqkv, grad, values, shape);
  }

  void do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                              const ContextShape& shape) override {
    touch("ulysses_split_heads", {{send, "send"}, {local, "local"}});
    inner_->ulysses_split_heads(send, local, width, column, heads, shape);
  }
  void do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                             const ContextShape& shape) override {
    touch("ulysses_join_heads", {{local, "local"}, {recv, "recv"}});
    inner_->ulysses_join_heads(local, recv, width, column, heads, shape);
  }
  void do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column, int heads,
                                     const ContextShape& shape) override {
    touch("ulysses_blocks_to_sequence", {{full, "full"}, {blocks, "blocks"}});
    inner_->ulysses_blocks_to_sequence(full, blocks, width, column, heads, shape);
  }
  void do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column, int heads,
                                     const ContextShape& shape) override {
    touch("ulysses_sequence_to_blocks", {{blocks, "blocks"}, {full, "full"}});
    inner_->ulysses_sequence_to_blocks(blocks, full, width, column, heads, shape);
  }

  // Mixture-of-Experts: the downloads and the loss wait (host reads), the kernels touch their tensors
  void do_download_i32(int* host, const Tensor& src) override {
    deferred_.wait_all();
    inner_->download_i32(host, src);
  }
  void do_moe_topk_softmax_forward(const Tensor& probs, const Tensor& chosen, const Tensor& logits, int tokens,
                                   int experts, int top_k) override {
    touch("moe_topk_softmax_forward", {{probs, "probs"}, {chosen, "chosen"}, {logits, "logits"}});
    inner_->moe_topk_softmax_forward(probs, chosen, logits, tokens, experts, top_k);
  }
  void do_moe_router_scores_forward(const Tensor& scores, const Tensor& logits, int tokens, int experts) override {
    touch("moe_router_scores_forward", {{scores, "scores"}, {logits, "logits"}});
    inner_->moe_router_scores_forward(scores, logits, tokens, experts);
  }
  double do_moe_aux_loss_forward(const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                                 int top_k, double total_tokens, double coeff) override {
    deferred_.wait_all();
    return inner_->moe_aux_loss_forward(scores, counts, tokens, experts, top_k, total_tokens, coeff);
  }
  void do_moe_router_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& probs, const Tensor& chosen,
                              const Tensor& scores, const std::vector<float>& counts, int tokens, int experts,
                              int top_k, const MoeAuxLoss& aux) override {
    touch("moe_router_backward",
          {{dlogits, "dlogits"}, {dprobs, "dprobs"}, {probs, "probs"}, {chosen, "chosen"}, {scores, "scores"}});
    inner_->moe_router_backward(dlogits, dprobs, probs, chosen, scores, counts, tokens, experts, top_k, aux);
  }
  void do_moe_permute_forward(const Tensor& out, const Tensor& inp, const Tensor& rows, int tokens, int hidden,
                              int top_k) override {
    touch("moe_permute_forward", {{out, "out"}, {inp, "inp"}, {rows, "rows"}});
    inner_->moe_permute_forward(out, inp, rows, tokens, hidden, top_k);
  }
  void do_moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows, int tokens, int hidden,
                               int top_k) override {
    touch("moe_permute_backward", {{dinp, "dinp"}, {dout, "dout"}, {rows, "rows"}});
    inner_->moe_permute_backward(dinp, dout, rows, tokens, hidden, top_k);
  }
  void do_moe_unpermute_forward(const Tensor& out, const Tensor& inp, const Tensor& probs, const Tensor& rows,
                                int tokens, int hidden, int top_k) override {
    touch("moe_unpermute_forward", {{out, "out"}, {inp, "inp"}, {probs, "probs"}, {rows, "rows"}});
    inner_->moe_unpermute_forward(out, inp, probs, rows, tokens, hidden, top_k);
  }
  void do_moe_unpermute_backward(const Tensor& dinp, const Tensor& dprobs, const Tensor& dout, const Tensor& inp,
                                 const Tensor& probs, const Tensor& rows, int tokens, int hidden, int top_k) override {
    touch("moe_unpermute_backward",
          {{dinp, "dinp"}, {dprobs, "dprobs"}, {dout, "dout"}, {inp, "inp"}, {probs, "probs"}, {rows, "rows"}});
    inner_->moe_unpermute_backward(dinp, dprobs, dout, inp, probs, rows, tokens, hidden, top_k);
  }
  void do_moe_sort_chunks_forward(const Tensor& out, const Tensor& inp, const std::vector<int>& chunk_rows,
                                  const std::vector<int>& order, int hidden) override {
    touch("moe_sort_chunks_forward", {{out, "out"}, {inp, "inp"}});
    inner_->moe_sort_chunks_forward(out, inp, chunk_rows, order, hidden);
  }
  void do_moe_sort_chunks_backward(const Tensor& dinp, const Tensor& dout, const std::vector<int>& chunk_rows,
                                   const std::vector<int>& order, int hidden) override {
    touch("moe_sort_chunks_backward", {{dinp, "dinp"}, {dout, "dout"}});
    inner_->moe_sort_chunks_backward(dinp, dout, chunk_rows, order, hidden);
  }
  void do_moe_grouped_matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weights,
                                     const std::vector<int>& rows_per_group, int in_features,
                                     int out_features) override {
    touch("moe_grouped_matmul_forward", {{out, "out"}, {inp, "inp"}, {weights, "weights"}});
    inner_->moe_grouped_matmul_forward(out, inp, weights, rows_per_group, in_features, out_features);
  }
  void do_moe_grouped_matmul_backward(const Tensor& dinp, const Tensor& dweights, const Tensor& dout, const Tensor& inp,
                                      const Tensor& weights, const std::vector<int>& rows_per_group, int in_features,
                                      int out_features) override {
    touch("moe_grouped_matmul_backward",
          {{dinp, "dinp"}, {dweights, "dweights"}, {dout, "dout"}, {inp, "inp"}, {weights, "weights"}});
    inner_->moe_grouped_matmul_backward(dinp, dweights, dout, inp, weights, rows_per_group, in_features, out_features);
  }

  void do_cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                    int vocab_start, int vocab_local, int valid_vocab) override {
    touch("cross_entropy_local_stats", {{stats, "stats"}, {logits, "logits"}, {targets, "targets"}});
    inner_->cross_entropy_local_stats(stats, logits, targets, rows, vocab_start, vocab_local, valid_vocab);
  }
  void do_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                int shards) override {
    touch("cross_entropy_combine", {{losses, "losses"}, {lse, "lse"}, {gathered_stats, "gathered_stats"}});
    inner_->cross_entropy_combine(losses, lse, gathered_stats, rows, shards);
  }
  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                 int rows, int vocab_start, int vocab_local, int valid_vocab, float scale) override {
    touch("cross_entropy_backward", {{dlogits, "dlogits"}, {logits, "logits"}, {lse, "lse"}, {targets, "targets"}});
    inner_->cross_entropy_backward(dlogits, logits, lse, targets, rows, vocab_start, vocab_local, valid_vocab, scale);
  }

  void do_adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWStep& step) override {
    deferred_.wait_all();
    inner_->adamw_update(param, master, grad, m, v, step);
  }

 private:
  struct Named {
    const Tensor& tensor;
    const char* name;
  };
  void touch(const char* kernel, std::initializer_list<Named> tensors) {
    for (const Named& t : tensors) deferred_.touch(t.tensor, kernel, t.name);
  }

  std::unique_ptr<Backend> inner_;
  DeferredCollectives& deferred_;
};

}  // namespace

std::unique_ptr<Backend> make_deferred_check_backend(std::unique_ptr<Backend> inner, DeferredCollectives& deferred) {
  return std::make_unique<DeferredCheckBackend>(std::move(inner), deferred);
}

}  // namespace twin::exec
