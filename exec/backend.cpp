#include "exec/backend.hpp"

#include <string>

#include "exec/cpu/cpu_backend.hpp"
#include "exec/errors.hpp"
#ifdef TWIN_HAVE_CUDA
#include "exec/cuda/cuda_exec.hpp"
#endif

namespace twin::exec {

Tensor Backend::zeros(std::size_t numel, DType dtype) {
  Tensor t = allocate(numel, dtype);
  if (numel > 0) fill(t, 0.0f);
  return t;
}

namespace {
[[noreturn]] void refuse(const Backend& backend, const char* what) {
  throw RunError(std::string("the ") + std::string(backend.name()) + " backend does not run " + what +
                 " (Llama-style blocks) yet: use --backend cpu");
}
}  // namespace

void Backend::rmsnorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, int) {
  refuse(*this, "RMSNorm");
}
void Backend::rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               int, int) {
  refuse(*this, "RMSNorm");
}
void Backend::swiglu_forward(const Tensor&, const Tensor&, int, int) {
  refuse(*this, "SwiGLU");
}
void Backend::swiglu_backward(const Tensor&, const Tensor&, const Tensor&, int, int) {
  refuse(*this, "SwiGLU");
}
void Backend::rope_forward(const Tensor&, int, int, int, int, int) {
  refuse(*this, "rotary embeddings");
}
void Backend::rope_backward(const Tensor&, int, int, int, int, int) {
  refuse(*this, "rotary embeddings");
}

void Backend::attention_forward_grouped(const Tensor& out, const Tensor& lse, const Tensor& qkv, int batch, int seq,
                                        int heads, int kv_heads, int head_dim, const Tensor& alibi_slopes) {
  if (kv_heads != heads) refuse(*this, "grouped-query attention");
  attention_forward(out, lse, qkv, batch, seq, heads, head_dim, alibi_slopes);
}

void Backend::attention_backward_grouped(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& lse,
                                         int batch, int seq, int heads, int kv_heads, int head_dim,
                                         const Tensor& alibi_slopes) {
  if (kv_heads != heads) refuse(*this, "grouped-query attention");
  attention_backward(dqkv, dout, qkv, lse, batch, seq, heads, head_dim, alibi_slopes);
}

std::vector<std::string> llama_block_keys(const model::Scenario& s) {
  std::vector<std::string> keys;
  if (s.model.norm != model::Norm::LayerNorm)
    keys.push_back("model.norm = \"" + std::string(to_string(s.model.norm)) + "\"");
  if (s.model.activation != model::Activation::Gelu) {
    keys.push_back("model.activation = \"" + std::string(to_string(s.model.activation)) + "\"");
  }
  if (s.model.position_embedding == model::PositionEmbedding::Rope)
    keys.push_back("model.position_embedding = \"rope\"");
  if (s.model.key_value_heads() != s.model.heads) {
    keys.push_back("model.kv_heads = " + std::to_string(s.model.key_value_heads()));
  }
  if (!s.model.linear_bias) keys.push_back("model.linear_bias = false");
  return keys;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>(options);
#ifdef TWIN_HAVE_CUDA
  if (name == "cuda") return cuda::make_cuda_backend(options);
  throw RunError("unknown backend '" + std::string(name) + "' (this build has: cpu, cuda)");
#else
  if (name == "cuda") throw RunError("--backend cuda: this twin was built without the CUDA toolkit");
  throw RunError("unknown backend '" + std::string(name) + "' (this build has: cpu)");
#endif
}

}  // namespace twin::exec
