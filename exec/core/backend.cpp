// The Backend's public methods: each checks its operands' shapes against the sizes it is given, once for every backend,
// then runs the backend's kernel (do_...). A failed check is a bug in the caller (InternalError, exec/core/check.hpp).
// What only one device needs (dtypes on the GPU, host-side row maps) the backend checks itself.
#include "exec/core/backend.hpp"

#include <string>
#include <utility>

#include <fmt/format.h>

#include "exec/core/check.hpp"
#include "exec/core/errors.hpp"
#include "exec/core/sizes.hpp"

namespace twin::exec {

namespace {

// kernels/cpu/cross_entropy.hpp and kernels/cuda/cross_entropy.cuh: (local max, local sum of exp, target logit)
constexpr std::size_t kCrossEntropyStats = 3;

}  // namespace

Backend::~Backend() = default;

MoeKernels& Backend::moe_kernels() const {
  if (moe_kernels_ == nullptr) {
    throw RunError(fmt::format("model.experts: the {} backend does not run Mixture-of-Experts layers", name()));
  }
  return *moe_kernels_;
}

ContextKernels& Backend::context_kernels() const {
  if (context_kernels_ == nullptr) {
    throw RunError(
        fmt::format("parallel.cp: the {} backend does not run context parallelism yet (the cpu backend does)", name()));
  }
  return *context_kernels_;
}

Fp8Kernels& Backend::fp8_kernels() const {
  if (fp8_kernels_ == nullptr) {
    throw RunError(fmt::format("model.fp8: the {} backend runs no FP8 GEMMs (the cpu backend emulates them)", name()));
  }
  return *fp8_kernels_;
}

void Backend::set_kernel_hook(std::unique_ptr<KernelHook> hook) {
  hook_ = std::move(hook);
  attach_kernel_hook(hook_.get());
  if (moe_kernels_ != nullptr) moe_kernels_->attach_kernel_hook(hook_.get());
  if (context_kernels_ != nullptr) context_kernels_->attach_kernel_hook(hook_.get());
  if (fp8_kernels_ != nullptr) fp8_kernels_->attach_kernel_hook(hook_.get());
}

Tensor Backend::zeros(std::size_t numel, DType dtype) {
  Tensor t = allocate(numel, dtype);
  if (numel > 0) fill(t, 0.0f);
  return t;
}

double Backend::do_squared_norm_sum(const std::vector<Tensor>& xs) {
  double total = 0;
  for (const Tensor& x : xs) total += do_squared_norm(x);
  return total;
}

// --- memory
// -----------------------------------------------------------------------------------------------------------

void Backend::upload_f32(const Tensor& dst, const float* host) {
  before_kernel("upload_f32", {{dst, "dst"}});
  do_upload_f32(dst, host);
}
void Backend::download_f32(float* host, const Tensor& src) {
  before_host_wait("download_f32");
  do_download_f32(host, src);
}
void Backend::download_i32(int* host, const Tensor& src) {
  before_host_wait("download_i32");
  do_download_i32(host, src);
}
void Backend::upload_i32(const Tensor& dst, const int* host) {
  before_kernel("upload_i32", {{dst, "dst"}});
  do_upload_i32(dst, host);
}
void Backend::synchronize() {
  before_host_wait("synchronize");
  do_synchronize();
}

// --- element-wise
// -----------------------------------------------------------------------------------------------------

void Backend::fill(const Tensor& x, float value) {
  before_kernel("fill", {{x, "x"}});
  do_fill(x, value);
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  TWIN_EXEC_CHECK(dst.numel == src.numel && dst.dtype == src.dtype, "copy: {} {} into {} {}", src.numel,
                  to_string(src.dtype), dst.numel, to_string(dst.dtype));
  before_kernel("copy", {{dst, "dst"}, {src, "src"}});
  do_copy(dst, src);
}

void Backend::accumulate(const Tensor& y, const Tensor& x) {
  TWIN_EXEC_CHECK(y.numel == x.numel && y.dtype == x.dtype, "accumulate: {} {} += {} {}", y.numel, to_string(y.dtype),
                  x.numel, to_string(x.dtype));
  before_kernel("accumulate", {{y, "y"}, {x, "x"}});
  do_accumulate(y, x);
}

void Backend::residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  TWIN_EXEC_CHECK(out.numel == a.numel && a.numel == b.numel, "residual: {} = {} + {}", out.numel, a.numel, b.numel);
  before_kernel("residual_forward", {{out, "out"}, {a, "a"}, {b, "b"}});
  do_residual_forward(out, a, b);
}

void Backend::bias_add(const Tensor& out, const Tensor& bias, int rows, int channels) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, channels) && bias.numel == sz(channels),
                  "bias_add: out {} bias {} for ({}, {})", out.numel, bias.numel, rows, channels);
  before_kernel("bias_add", {{out, "out"}, {bias, "bias"}});
  do_bias_add(out, bias, rows, channels);
}

void Backend::bias_backward(const Tensor& dbias, const Tensor& dout, int rows, int channels) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, channels) && dbias.numel == sz(channels),
                  "bias_backward: dout {} dbias {} for ({}, {})", dout.numel, dbias.numel, rows, channels);
  before_kernel("bias_backward", {{dbias, "dbias"}, {dout, "dout"}});
  do_bias_backward(dbias, dout, rows, channels);
}

double Backend::squared_norm(const Tensor& x) {
  before_host_wait("squared_norm");
  return do_squared_norm(x);
}
double Backend::squared_norm_sum(const std::vector<Tensor>& xs) {
  before_host_wait("squared_norm_sum");
  return do_squared_norm_sum(xs);
}
double Backend::sum(const Tensor& x) {
  before_host_wait("sum");
  return do_sum(x);
}

// --- embeddings
// -------------------------------------------------------------------------------------------------------

void Backend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte_local, int rows,
                                int channels, int vocab_start, int vocab_local) {
  TWIN_EXEC_CHECK(
      out.numel == numel(rows, channels) && tokens.numel == sz(rows) && wte_local.numel == numel(vocab_local, channels),
      "embedding_forward: out {} tokens {} wte {} for rows {} channels {} vocab_local {}", out.numel, tokens.numel,
      wte_local.numel, rows, channels, vocab_local);
  before_kernel("embedding_forward", {{out, "out"}, {tokens, "tokens"}, {wte_local, "wte_local"}});
  do_embedding_forward(out, tokens, wte_local, rows, channels, vocab_start, vocab_local);
}

void Backend::embedding_backward(const Tensor& dwte_local, const Tensor& dout, const Tensor& tokens, int rows,
                                 int channels, int vocab_start, int vocab_local) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, channels) && dwte_local.numel == numel(vocab_local, channels) &&
                      tokens.numel == sz(rows),
                  "embedding_backward: dout {} dwte {} tokens {}", dout.numel, dwte_local.numel, tokens.numel);
  before_kernel("embedding_backward", {{dwte_local, "dwte_local"}, {dout, "dout"}, {tokens, "tokens"}});
  do_embedding_backward(dwte_local, dout, tokens, rows, channels, vocab_start, vocab_local);
}

void Backend::position_embedding_forward(const Tensor& out, const Tensor& wpe, int batch, int seq, int channels) {
  TWIN_EXEC_CHECK(out.numel == numel(batch, seq) * sz(channels) && wpe.numel >= numel(seq, channels),
                  "position_embedding_forward: out {} wpe {}", out.numel, wpe.numel);
  before_kernel("position_embedding_forward", {{out, "out"}, {wpe, "wpe"}});
  do_position_embedding_forward(out, wpe, batch, seq, channels);
}

void Backend::position_embedding_backward(const Tensor& dwpe, const Tensor& dout, int batch, int seq, int channels) {
  TWIN_EXEC_CHECK(dout.numel == numel(batch, seq) * sz(channels) && dwpe.numel >= numel(seq, channels),
                  "position_embedding_backward: dout {} dwpe {}", dout.numel, dwpe.numel);
  before_kernel("position_embedding_backward", {{dwpe, "dwpe"}, {dout, "dout"}});
  do_position_embedding_backward(dwpe, dout, batch, seq, channels);
}

// --- layernorm, linear, attention, GELU
// -------------------------------------------------------------------------------

void Backend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                const Tensor& weight, const Tensor& bias, int rows, int channels) {
  const std::size_t n = numel(rows, channels);
  TWIN_EXEC_CHECK(out.numel == n && inp.numel == n && mean.numel == sz(rows) && rstd.numel == sz(rows) &&
                      weight.numel == sz(channels) && bias.numel == sz(channels),
                  "layernorm_forward: out {} inp {} mean {} rstd {} weight {} bias {} for ({}, {})", out.numel,
                  inp.numel, mean.numel, rstd.numel, weight.numel, bias.numel, rows, channels);
  before_kernel("layernorm_forward",
                {{out, "out"}, {mean, "mean"}, {rstd, "rstd"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}});
  do_layernorm_forward(out, mean, rstd, inp, weight, bias, rows, channels);
}

void Backend::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                 int rows, int channels) {
  const std::size_t n = numel(rows, channels);
  TWIN_EXEC_CHECK(dinp.numel == n && dout.numel == n && inp.numel == n && dweight.numel == sz(channels) &&
                      dbias.numel == sz(channels) && mean.numel == sz(rows) && rstd.numel == sz(rows),
                  "layernorm_backward: dinp {} dout {} inp {} dweight {} dbias {} for ({}, {})", dinp.numel, dout.numel,
                  inp.numel, dweight.numel, dbias.numel, rows, channels);
  before_kernel("layernorm_backward", {{dinp, "dinp"},
                                       {dweight, "dweight"},
                                       {dbias, "dbias"},
                                       {dout, "dout"},
                                       {inp, "inp"},
                                       {weight, "weight"},
                                       {mean, "mean"},
                                       {rstd, "rstd"}});
  do_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels);
}

void Backend::matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int rows,
                             int in_features, int out_features) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, out_features) && inp.numel == numel(rows, in_features) &&
                      weight.numel == numel(out_features, in_features) &&
                      (bias.empty() || bias.numel == sz(out_features)),
                  "matmul_forward: out {} inp {} weight {} bias {} for rows {} in {} out {}", out.numel, inp.numel,
                  weight.numel, bias.numel, rows, in_features, out_features);
  before_kernel("matmul_forward", {{out, "out"}, {inp, "inp"}, {weight, "weight"}, {bias, "bias"}});
  do_matmul_forward(out, inp, weight, bias, rows, in_features, out_features);
}

void Backend::matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, out_features) && inp.numel == numel(rows, in_features) &&
                      weight.numel == numel(out_features, in_features) &&
                      (dweight.empty() || dweight.numel == weight.numel) && (dinp.empty() || dinp.numel == inp.numel) &&
                      (dbias.empty() || dbias.numel == sz(out_features)),
                  "matmul_backward: dinp {} dweight {} dbias {} dout {} inp {} for rows {} in {} out {}", dinp.numel,
                  dweight.numel, dbias.numel, dout.numel, inp.numel, rows, in_features, out_features);
  before_kernel(
      "matmul_backward",
      {{dinp, "dinp"}, {dweight, "dweight"}, {dbias, "dbias"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}});
  do_matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, in_features, out_features);
}

void Backend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq, int heads,
                                int kv_heads, int head_dim, const Tensor& alibi_slopes) {
  const std::size_t tokens = numel(batch, seq), width = numel(heads, head_dim);
  const std::size_t row = numel(heads + 2 * kv_heads, head_dim);
  TWIN_EXEC_CHECK(out.numel == tokens * width && qkv.numel == tokens * row && lse.numel == tokens * sz(heads),
                  "attention_forward: out {} qkv {} lse {} for B {} T {} H {} KV {} D {}", out.numel, qkv.numel,
                  lse.numel, batch, seq, heads, kv_heads, head_dim);
  TWIN_EXEC_CHECK(alibi_slopes.empty() || alibi_slopes.numel == sz(heads),
                  "attention_forward: {} ALiBi slopes for {} heads", alibi_slopes.numel, heads);
  before_kernel("attention_forward", {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}, {alibi_slopes, "alibi_slopes"}});
  do_attention_forward(out, lse, qkv, batch, seq, heads, kv_heads, head_dim, alibi_slopes);
}

void Backend::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, int batch, int seq, int heads, int kv_heads, int head_dim,
                                 const Tensor& alibi_slopes) {
  const std::size_t tokens = numel(batch, seq), width = numel(heads, head_dim);
  const std::size_t row = numel(heads + 2 * kv_heads, head_dim);
  TWIN_EXEC_CHECK(dout.numel == tokens * width && out.numel == tokens * width && qkv.numel == tokens * row &&
                      dqkv.numel == qkv.numel && lse.numel == tokens * sz(heads),
                  "attention_backward: dqkv {} dout {} qkv {} out {} lse {} for B {} T {} H {} KV {} D {}", dqkv.numel,
                  dout.numel, qkv.numel, out.numel, lse.numel, batch, seq, heads, kv_heads, head_dim);
  TWIN_EXEC_CHECK(alibi_slopes.empty() || alibi_slopes.numel == sz(heads),
                  "attention_backward: {} ALiBi slopes for {} heads", alibi_slopes.numel, heads);
  before_kernel(
      "attention_backward",
      {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}, {lse, "lse"}, {alibi_slopes, "alibi_slopes"}});
  do_attention_backward(dqkv, dout, qkv, out, lse, batch, seq, heads, kv_heads, head_dim, alibi_slopes);
}

void Backend::gelu_forward(const Tensor& out, const Tensor& inp) {
  TWIN_EXEC_CHECK(out.numel == inp.numel, "gelu_forward: out {} inp {}", out.numel, inp.numel);
  before_kernel("gelu_forward", {{out, "out"}, {inp, "inp"}});
  do_gelu_forward(out, inp);
}

void Backend::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  TWIN_EXEC_CHECK(dinp.numel == inp.numel && dout.numel == inp.numel, "gelu_backward: dinp {} inp {} dout {}",
                  dinp.numel, inp.numel, dout.numel);
  before_kernel("gelu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}});
  do_gelu_backward(dinp, inp, dout);
}

// --- RMSNorm, SwiGLU, rotary embeddings
// -------------------------------------------------------------------------------

void Backend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, int rows,
                              int channels) {
  const std::size_t n = numel(rows, channels);
  TWIN_EXEC_CHECK(out.numel == n && inp.numel == n && rstd.numel == sz(rows) && weight.numel == sz(channels),
                  "rmsnorm_forward: out {} inp {} rstd {} weight {} for ({}, {})", out.numel, inp.numel, rstd.numel,
                  weight.numel, rows, channels);
  before_kernel("rmsnorm_forward", {{out, "out"}, {rstd, "rstd"}, {inp, "inp"}, {weight, "weight"}});
  do_rmsnorm_forward(out, rstd, inp, weight, rows, channels);
}

void Backend::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& rstd, int rows, int channels) {
  const std::size_t n = numel(rows, channels);
  TWIN_EXEC_CHECK(dinp.numel == n && dout.numel == n && inp.numel == n && dweight.numel == sz(channels) &&
                      weight.numel == sz(channels) && rstd.numel == sz(rows),
                  "rmsnorm_backward: dinp {} dout {} inp {} dweight {} rstd {} for ({}, {})", dinp.numel, dout.numel,
                  inp.numel, dweight.numel, rstd.numel, rows, channels);
  before_kernel(
      "rmsnorm_backward",
      {{dinp, "dinp"}, {dweight, "dweight"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}, {rstd, "rstd"}});
  do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, channels);
}

void Backend::swiglu_forward(const Tensor& out, const Tensor& inp, int rows, int width) {
  TWIN_EXEC_CHECK(out.numel == numel(rows, width) && inp.numel == 2 * out.numel,
                  "swiglu_forward: out {} inp {} for ({}, {})", out.numel, inp.numel, rows, width);
  before_kernel("swiglu_forward", {{out, "out"}, {inp, "inp"}});
  do_swiglu_forward(out, inp, rows, width);
}

void Backend::swiglu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, int rows, int width) {
  TWIN_EXEC_CHECK(dout.numel == numel(rows, width) && inp.numel == 2 * dout.numel && dinp.numel == inp.numel,
                  "swiglu_backward: dinp {} inp {} dout {} for ({}, {})", dinp.numel, inp.numel, dout.numel, rows,
                  width);
  before_kernel("swiglu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}});
  do_swiglu_backward(dinp, inp, dout, rows, width);
}

void Backend::rope_forward(const Tensor& qkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                           int rotary_dim) {
  TWIN_EXEC_CHECK(qkv.numel == numel(batch, seq) * numel(heads + 2 * kv_heads, head_dim),
                  "rope_forward: qkv {} for ({}, {}, ({} + 2 x {}) x {})", qkv.numel, batch, seq, heads, kv_heads,
                  head_dim);
  before_kernel("rope_forward", {{qkv, "qkv"}});
  do_rope_forward(qkv, batch, seq, heads, kv_heads, head_dim, rotary_dim);
}

void Backend::rope_backward(const Tensor& dqkv, int batch, int seq, int heads, int kv_heads, int head_dim,
                            int rotary_dim) {
  TWIN_EXEC_CHECK(dqkv.numel == numel(batch, seq) * numel(heads + 2 * kv_heads, head_dim),
                  "rope_backward: dqkv {} for ({}, {}, ({} + 2 x {}) x {})", dqkv.numel, batch, seq, heads, kv_heads,
                  head_dim);
  before_kernel("rope_backward", {{dqkv, "dqkv"}});
  do_rope_backward(dqkv, batch, seq, heads, kv_heads, head_dim, rotary_dim);
}

// --- vocab-parallel cross-entropy, the optimizer
// ----------------------------------------------------------------------

void Backend::cross_entropy_local_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int rows,
                                        int vocab_start, int vocab_local, int valid_vocab) {
  TWIN_EXEC_CHECK(stats.numel == sz(rows) * kCrossEntropyStats && logits.numel == numel(rows, vocab_local) &&
                      targets.numel == sz(rows),
                  "cross_entropy_local_stats: stats {} logits {} targets {} for rows {} vocab_local {}", stats.numel,
                  logits.numel, targets.numel, rows, vocab_local);
  before_kernel("cross_entropy_local_stats", {{stats, "stats"}, {logits, "logits"}, {targets, "targets"}});
  do_cross_entropy_local_stats(stats, logits, targets, rows, vocab_start, vocab_local, valid_vocab);
}

void Backend::cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& gathered_stats, int rows,
                                    int shards) {
  TWIN_EXEC_CHECK(losses.numel == sz(rows) && lse.numel == sz(rows) &&
                      gathered_stats.numel == numel(rows, shards) * kCrossEntropyStats,
                  "cross_entropy_combine: losses {} lse {} stats {} for {} rows x {} shards", losses.numel, lse.numel,
                  gathered_stats.numel, rows, shards);
  before_kernel("cross_entropy_combine", {{losses, "losses"}, {lse, "lse"}, {gathered_stats, "gathered_stats"}});
  do_cross_entropy_combine(losses, lse, gathered_stats, rows, shards);
}

void Backend::cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                     const Tensor& targets, int rows, int vocab_start, int vocab_local, int valid_vocab,
                                     float scale) {
  TWIN_EXEC_CHECK(dlogits.numel == numel(rows, vocab_local) && logits.numel == dlogits.numel && lse.numel == sz(rows) &&
                      targets.numel == sz(rows),
                  "cross_entropy_backward: dlogits {} logits {} lse {} targets {} for rows {} vocab_local {}",
                  dlogits.numel, logits.numel, lse.numel, targets.numel, rows, vocab_local);
  before_kernel("cross_entropy_backward",
                {{dlogits, "dlogits"}, {logits, "logits"}, {lse, "lse"}, {targets, "targets"}});
  do_cross_entropy_backward(dlogits, logits, lse, targets, rows, vocab_start, vocab_local, valid_vocab, scale);
}

void Backend::adamw_update(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
                           const Tensor& v, const AdamWStep& step) {
  TWIN_EXEC_CHECK(grad.numel == param.numel && m.numel == param.numel && v.numel == param.numel &&
                      (master.empty() || master.numel == param.numel),
                  "adamw_update: param {} master {} grad {} m {} v {}", param.numel, master.numel, grad.numel, m.numel,
                  v.numel);
  before_host_wait("adamw_update");
  do_adamw_update(param, master, grad, m, v, step);
}

}  // namespace twin::exec
