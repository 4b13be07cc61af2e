// A GPT-2 (pre-LN, learned positions, tied embeddings, GELU MLP) trained on one device, llm.c style, written once over
// an Ops adapter: ops_cpu.hpp (kernels/cpu, fp32) or ops_cuda.hpp (kernels/cuda, bf16 + fp32 master weights). It reads
// top to bottom: parameters, activations, forward, backward, update. Same seed -> the same initial fp32 weights on both
// sides, so the loss curves of the two backends can be compared step by step.
//
// N = batch * seq rows; C channels; H heads of D = C / H; V valid vocabulary, Vp padded to a multiple of 128.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace twin::bench {

struct GptConfig {
  int layers = 4;
  int channels = 128;
  int heads = 4;
  int seq = 64;
  int vocab = 256;  // valid entries; padded to a multiple of 128
  int batch = 16;   // sequences per step (one micro-batch)

  int padded_vocab() const { return (vocab + 127) / 128 * 128; }
  int head_dim() const { return channels / heads; }
  int rows() const { return batch * seq; }
  // model FLOPs per step without recompute (docs/architecture.md, Narayanan et al.): 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
  double flops_per_step() const {
    const double B = batch, s = seq, l = layers, h = channels, V = padded_vocab();
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
  }
};

// --- parameters: one flat buffer; the tensors that decay (matrices, embeddings) first -----------------------------
enum ParamTensor : int {
  kWte,       // (Vp, C)
  kWpe,       // (T, C)
  kQkvW,      // (L, 3C, C)
  kAttProjW,  // (L, C, C)
  kFcW,       // (L, 4C, C)
  kFcProjW,   // (L, C, 4C)
  kLn1W,      // (L, C)   -- no weight decay from here on
  kLn1B,      // (L, C)
  kQkvB,      // (L, 3C)
  kAttProjB,  // (L, C)
  kLn2W,      // (L, C)
  kLn2B,      // (L, C)
  kFcB,       // (L, 4C)
  kFcProjB,   // (L, C)
  kLnfW,      // (C)
  kLnfB,      // (C)
  kParamTensors
};
inline constexpr int kFirstUndecayed = kLn1W;

struct ParamLayout {
  std::array<std::size_t, kParamTensors> size{}, offset{};
  std::size_t total = 0, decayed = 0;
  explicit ParamLayout(const GptConfig& c) {
    const std::size_t L = c.layers, C = c.channels;
    size = {static_cast<std::size_t>(c.padded_vocab()) * C,
            static_cast<std::size_t>(c.seq) * C,
            L * 3 * C * C,
            L * C * C,
            L * 4 * C * C,
            L * C * 4 * C,
            L * C,
            L * C,
            L * 3 * C,
            L * C,
            L * C,
            L * C,
            L * 4 * C,
            L * C,
            C,
            C};
    for (int t = 0; t < kParamTensors; ++t) {
      offset[t] = total;
      total += size[t];
      if (t + 1 == kFirstUndecayed) decayed = total;
    }
  }
};

// A normal(0, 1) sample that depends on (seed, index) alone: splitmix64 twice, then Box-Muller. Any thread count, any
// backend: the same weights.
inline double normal_at(std::uint64_t seed, std::uint64_t index) {
  auto splitmix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  const std::uint64_t a = splitmix(seed * 0x2545f4914f6cdd1dull + 2 * index);
  const std::uint64_t b = splitmix(seed * 0x2545f4914f6cdd1dull + 2 * index + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// GPT-2 initialisation of the flat fp32 parameters: N(0, 0.02) matrices, N(0, 0.02 / sqrt(2L)) residual projections,
// N(0, 0.01) positions, zero biases, unit LayerNorm weights. Filled by all hardware threads.
inline std::vector<float> init_parameters(const GptConfig& c, std::uint64_t seed) {
  const ParamLayout layout(c);
  std::vector<float> p(layout.total, 0.0f);
  auto fill_normal = [&](int tensor, double stddev) {
    const std::size_t begin = layout.offset[tensor], n = layout.size[tensor];
    const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < threads; ++w) {
      workers.emplace_back([&, w] {
        for (std::size_t i = w; i < n; i += threads)
          p[begin + i] = static_cast<float>(stddev * normal_at(seed, begin + i));
      });
    }
    for (auto& worker : workers) worker.join();
  };
  const double residual_std = 0.02 / std::sqrt(2.0 * c.layers);
  fill_normal(kWte, 0.02);
  fill_normal(kWpe, 0.01);
  fill_normal(kQkvW, 0.02);
  fill_normal(kAttProjW, residual_std);
  fill_normal(kFcW, 0.02);
  fill_normal(kFcProjW, residual_std);
  for (int t : {kLn1W, kLn2W, kLnfW}) std::fill_n(p.begin() + layout.offset[t], layout.size[t], 1.0f);
  return p;
}

// AdamW hyper-parameters of one step
struct TrainStep {
  int step = 1;  // 1-based
  float learning_rate = 1e-3f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;
};

template <class Ops>
class Gpt {
 public:
  using act = typename Ops::act;

  Gpt(Ops& ops, const GptConfig& config, std::uint64_t seed) : ops_(ops), c_(config), layout_(config) {
    if (c_.channels % c_.heads != 0) throw std::invalid_argument("channels must be a multiple of heads");
    const std::size_t P = layout_.total;
    params_ = ops_.template allocate<act>(P);
    master_ = Ops::kMasterWeights ? ops_.template allocate<float>(P) : nullptr;
    grads_ = ops_.template allocate<float>(P);
    m_ = ops_.template allocate<float>(P);
    v_ = ops_.template allocate<float>(P);
    const std::vector<float> host = init_parameters(c_, seed);
    ops_.upload_weights(params_, master_, host.data(), P);
    allocate_activations();
  }

  std::size_t parameter_count() const { return layout_.total; }

  // One step on one micro-batch: forward, backward, AdamW. inputs, targets (batch, seq) on the host. Returns the mean
  // loss over the batch's tokens and the gradient norm before clipping.
  struct StepResult {
    double loss = 0.0, grad_norm = 0.0;
  };
  StepResult step(const std::vector<int>& inputs, const std::vector<int>& targets, const TrainStep& hp) {
    const std::size_t N = c_.rows();
    ops_.upload_tokens(tokens_, inputs.data(), N);
    ops_.upload_tokens(targets_, targets.data(), N);
    forward();
    StepResult result;
    result.loss = ops_.sum(losses_, N) / static_cast<double>(N);
    backward();
    result.grad_norm = std::sqrt(ops_.squared_norm(grads_, layout_.total));
    const float grad_scale =
        result.grad_norm > hp.grad_clip ? static_cast<float>(hp.grad_clip / (result.grad_norm + 1e-6)) : 1.0f;
    update(hp, grad_scale);
    return result;
  }

  void synchronize() { ops_.synchronize(); }

 private:
  // --- tensors ------------------------------------------------------------------------------------------------------
  act* param(int tensor, int layer = 0, std::size_t per_layer = 0) {
    return params_ + layout_.offset[tensor] + layer * per_layer;
  }
  float* grad(int tensor, int layer = 0, std::size_t per_layer = 0) {
    return grads_ + layout_.offset[tensor] + layer * per_layer;
  }

  void allocate_activations() {
    const std::size_t N = c_.rows(), C = c_.channels, L = c_.layers, Vp = c_.padded_vocab();
    const std::size_t lse_per_layer = static_cast<std::size_t>(c_.batch) * c_.heads * c_.seq;
    tokens_ = ops_.template allocate<int>(N);
    targets_ = ops_.template allocate<int>(N);
    residual_ = ops_.template allocate<act>((L + 1) * N * C);  // (L+1, N, C): the input of each layer, then the output
    ln1_ = ops_.template allocate<act>(L * N * C);             // (L, N, C)
    ln1_stats_ = ops_.template allocate<float>(L * 2 * N);     // (L, 2, N) mean, rstd
    qkv_ = ops_.template allocate<act>(L * N * 3 * C);         // (L, N, 3C)
    atty_ = ops_.template allocate<act>(L * N * C);            // (L, N, C)
    att_lse_ = ops_.template allocate<float>(L * lse_per_layer);  // (L, B, H, T)
    residual2_ = ops_.template allocate<act>(L * N * C);          // (L, N, C) after the attention block
    ln2_ = ops_.template allocate<act>(L * N * C);
    ln2_stats_ = ops_.template allocate<float>(L * 2 * N);
    fch_ = ops_.template allocate<act>(L * N * 4 * C);       // (L, N, 4C) pre-GELU
    fch_gelu_ = ops_.template allocate<act>(L * N * 4 * C);  // (L, N, 4C)
    lnf_ = ops_.template allocate<act>(N * C);
    lnf_stats_ = ops_.template allocate<float>(2 * N);
    logits_ = ops_.template allocate<act>(N * Vp);  // (N, Vp), then its gradient in place
    losses_ = ops_.template allocate<float>(N);
    ce_lse_ = ops_.template allocate<float>(N);
    ce_stats_ = ops_.template allocate<float>(N * 3);
    branch_ = ops_.template allocate<act>(N * C);  // a residual branch's output before the add
    // backward scratch, reused by every layer
    dresidual_ = ops_.template allocate<act>(N * C);
    dln_ = ops_.template allocate<act>(N * C);
    datty_ = ops_.template allocate<act>(N * C);
    dqkv_ = ops_.template allocate<act>(N * 3 * C);
    dfch_ = ops_.template allocate<act>(N * 4 * C);
  }

  // --- forward ------------------------------------------------------------------------------------------------------
  void forward() {
    const int N = c_.rows(), C = c_.channels, B = c_.batch, T = c_.seq, H = c_.heads, D = c_.head_dim();
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    const std::size_t lse_per_layer = static_cast<std::size_t>(B) * H * T;
    ops_.encoder_forward(residual_, tokens_, param(kWte), param(kWpe), B, T, C, c_.padded_vocab());
    ops_.layernorm_forward(ln1_, ln1_stats_, ln1_stats_ + N, residual_, param(kLn1W), param(kLn1B), N, C);
    for (int l = 0; l < c_.layers; ++l) {
      act* x = residual_ + l * NC;
      act* ln1 = ln1_ + l * NC;
      act* qkv = qkv_ + l * 3 * NC;
      act* atty = atty_ + l * NC;
      float* lse = att_lse_ + l * lse_per_layer;
      act* x2 = residual2_ + l * NC;
      act* ln2 = ln2_ + l * NC;
      float* ln2_stats = ln2_stats_ + l * 2 * N;
      act* fch = fch_ + l * 4 * NC;
      act* fch_gelu = fch_gelu_ + l * 4 * NC;
      const std::size_t Cs = C;
      // attention block: x2 = x + proj(attention(qkv(ln1(x))))
      ops_.matmul_forward(qkv, ln1, param(kQkvW, l, 3 * Cs * Cs), param(kQkvB, l, 3 * Cs), N, C, 3 * C);
      ops_.attention_forward(atty, lse, qkv, B, T, H, D);
      ops_.matmul_forward(branch_, atty, param(kAttProjW, l, Cs * Cs), param(kAttProjB, l, Cs), N, C, C);
      ops_.residual_layernorm_forward(x2, ln2, ln2_stats, ln2_stats + N, x, branch_, param(kLn2W, l, Cs),
                                      param(kLn2B, l, Cs), N, C);
      // MLP block: next x = x2 + proj(gelu(fc(ln2(x2)))), fused with the next LayerNorm (or the final one)
      ops_.matmul_forward_gelu(fch_gelu, fch, ln2, param(kFcW, l, 4 * Cs * Cs), param(kFcB, l, 4 * Cs), N, C, 4 * C);
      ops_.matmul_forward(branch_, fch_gelu, param(kFcProjW, l, 4 * Cs * Cs), param(kFcProjB, l, Cs), N, 4 * C, C);
      act* next = residual_ + (l + 1) * NC;
      if (l + 1 < c_.layers) {
        float* next_stats = ln1_stats_ + (l + 1) * 2 * N;
        ops_.residual_layernorm_forward(next, ln1_ + (l + 1) * NC, next_stats, next_stats + N, x2, branch_,
                                        param(kLn1W, l + 1, Cs), param(kLn1B, l + 1, Cs), N, C);
      } else {
        ops_.residual_layernorm_forward(next, lnf_, lnf_stats_, lnf_stats_ + N, x2, branch_, param(kLnfW), param(kLnfB),
                                        N, C);
      }
    }
    // tied LM head and the loss
    ops_.matmul_forward(logits_, lnf_, param(kWte), nullptr, N, C, c_.padded_vocab());
    ops_.cross_entropy_forward(losses_, ce_lse_, ce_stats_, logits_, targets_, N, c_.padded_vocab(), c_.vocab);
  }

  // --- backward -----------------------------------------------------------------------------------------------------
  void backward() {
    const int N = c_.rows(), C = c_.channels, B = c_.batch, T = c_.seq, H = c_.heads, D = c_.head_dim();
    const std::size_t NC = static_cast<std::size_t>(N) * C, Cs = C;
    const std::size_t lse_per_layer = static_cast<std::size_t>(B) * H * T;
    ops_.zero(grads_, layout_.total);  // one micro-batch per step: gradients start at zero
    ops_.cross_entropy_backward(logits_, logits_, ce_lse_, targets_, N, c_.padded_vocab(), c_.vocab,
                                1.0f / static_cast<float>(N));
    ops_.matmul_backward(dln_, grad(kWte), nullptr, logits_, lnf_, param(kWte), N, C, c_.padded_vocab());
    ops_.zero(dresidual_, NC);
    ops_.layernorm_backward(dresidual_, grad(kLnfW), grad(kLnfB), dln_, residual_ + c_.layers * NC, param(kLnfW),
                            lnf_stats_, lnf_stats_ + N, N, C);
    for (int l = c_.layers - 1; l >= 0; --l) {
      const float* ln1_stats = ln1_stats_ + l * 2 * N;
      const float* ln2_stats = ln2_stats_ + l * 2 * N;
      // MLP block: dresidual is d(next x) = d(MLP output)
      ops_.matmul_backward(dfch_, grad(kFcProjW, l, 4 * Cs * Cs), grad(kFcProjB, l, Cs), dresidual_,
                           fch_gelu_ + l * 4 * NC, param(kFcProjW, l, 4 * Cs * Cs), N, 4 * C, C);
      ops_.gelu_backward(dfch_, fch_ + l * 4 * NC, dfch_, 4 * NC);
      ops_.matmul_backward(dln_, grad(kFcW, l, 4 * Cs * Cs), grad(kFcB, l, 4 * Cs), dfch_, ln2_ + l * NC,
                           param(kFcW, l, 4 * Cs * Cs), N, C, 4 * C);
      ops_.layernorm_backward(dresidual_, grad(kLn2W, l, Cs), grad(kLn2B, l, Cs), dln_, residual2_ + l * NC,
                              param(kLn2W, l, Cs), ln2_stats, ln2_stats + N, N, C);
      // attention block: dresidual is now d(x2)
      ops_.matmul_backward(datty_, grad(kAttProjW, l, Cs * Cs), grad(kAttProjB, l, Cs), dresidual_, atty_ + l * NC,
                           param(kAttProjW, l, Cs * Cs), N, C, C);
      ops_.attention_backward(dqkv_, datty_, qkv_ + l * 3 * NC, att_lse_ + l * lse_per_layer, B, T, H, D);
      ops_.matmul_backward(dln_, grad(kQkvW, l, 3 * Cs * Cs), grad(kQkvB, l, 3 * Cs), dqkv_, ln1_ + l * NC,
                           param(kQkvW, l, 3 * Cs * Cs), N, C, 3 * C);
      ops_.layernorm_backward(dresidual_, grad(kLn1W, l, Cs), grad(kLn1B, l, Cs), dln_, residual_ + l * NC,
                              param(kLn1W, l, Cs), ln1_stats, ln1_stats + N, N, C);
    }
    ops_.encoder_backward(grad(kWte), grad(kWpe), dresidual_, tokens_, B, T, C, c_.padded_vocab());
  }

  // --- update -------------------------------------------------------------------------------------------------------
  void update(const TrainStep& hp, float grad_scale) {
    const std::size_t decayed = layout_.decayed, rest = layout_.total - layout_.decayed;
    ops_.adamw(params_, master_, grads_, m_, v_, decayed, hp.learning_rate, hp.weight_decay, hp.step, grad_scale);
    ops_.adamw(params_ + decayed, master_ != nullptr ? master_ + decayed : nullptr, grads_ + decayed, m_ + decayed,
               v_ + decayed, rest, hp.learning_rate, 0.0f, hp.step, grad_scale);
  }

  Ops& ops_;
  GptConfig c_;
  ParamLayout layout_;
  act* params_ = nullptr;    // working weights (the kernels read these)
  float* master_ = nullptr;  // fp32 master copy when act is not fp32
  float *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  int *tokens_ = nullptr, *targets_ = nullptr;
  act *residual_ = nullptr, *ln1_ = nullptr, *qkv_ = nullptr, *atty_ = nullptr, *residual2_ = nullptr, *ln2_ = nullptr;
  act *fch_ = nullptr, *fch_gelu_ = nullptr, *lnf_ = nullptr, *logits_ = nullptr, *branch_ = nullptr;
  float *ln1_stats_ = nullptr, *ln2_stats_ = nullptr, *lnf_stats_ = nullptr, *att_lse_ = nullptr;
  float *losses_ = nullptr, *ce_lse_ = nullptr, *ce_stats_ = nullptr;
  act *dresidual_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr, *dfch_ = nullptr;
};

}  // namespace twin::bench
