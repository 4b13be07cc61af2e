// Speed of the fp32 CPU kernels: the GEMM (cblas_sgemm when built with BLAS, and the portable fallback) at square
// sizes, then every kernel at a mid-size GPT shape (B=4, T=256, C=512, 8 heads of 64, a TP-8 vocabulary shard of
// 50304 / 8 columns). Counters: FLOP/s for GEMMs and attention, bytes/s (compulsory traffic) for the rest, and each
// GEMM's m, n, k. `twin calibrate` fits a CPU host profile on its JSON output:
//   ./twin_kernels_cpu_bench --benchmark_filter=Gemm
//   ./twin_kernels_cpu_bench --benchmark_format=json > kernels.json && twin calibrate kernels.json --out host.toml
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.hpp"

namespace cpu = twin::kernels::cpu;

namespace {

constexpr int kBatch = 4, kSeq = 256, kChannels = 512, kHeads = 8, kHeadDim = kChannels / kHeads;
constexpr int kRows = kBatch * kSeq;
constexpr int kVocabLocal = 50304 / 8;

std::vector<float> random_vector(std::size_t n, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(n);
  for (float& value : values) value = distribution(generator);
  return values;
}

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOP/s"] = benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// A GEMM's shape, out (m, n) = inp (m, k) @ weight (n, k)^T, as counters: `twin calibrate` reads them from the JSON
// (--benchmark_format=json) to measure the host's GEMM rate shape by shape.
void set_shape(benchmark::State& state, int m, int n, int k) {
  state.counters["m"] = m;
  state.counters["n"] = n;
  state.counters["k"] = k;
}

void set_bytes(benchmark::State& state, double bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iteration) * state.iterations());
}

// --- GEMM: out (n, n) = a (n, n) @ b^T (n, n), matmul_forward's layout
// ------------------------------------------------

void BM_Gemm(benchmark::State& state) {  // args: n, BLAS threads
  const int n = static_cast<int>(state.range(0));
  const int threads_before = cpu::blas_threads();
  cpu::set_blas_threads(static_cast<int>(state.range(1)));
  const auto a = random_vector(static_cast<std::size_t>(n) * n, 1);
  const auto b = random_vector(static_cast<std::size_t>(n) * n, 2);
  std::vector<float> out(static_cast<std::size_t>(n) * n);
  for (auto _ : state) {
    cpu::matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * n * n * n);
  set_shape(state, n, n, n);
  state.counters["blas_threads"] = static_cast<double>(state.range(1));
  state.SetLabel(cpu::have_blas() ? "cblas_sgemm" : "portable");
  cpu::set_blas_threads(threads_before);
}
BENCHMARK(BM_Gemm)->ArgsProduct({{512, 1024, 2048}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GemmPortable(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto a = random_vector(static_cast<std::size_t>(n) * n, 1);
  const auto b = random_vector(static_cast<std::size_t>(n) * n, 2);
  std::vector<float> out(static_cast<std::size_t>(n) * n);
  for (auto _ : state) {
    cpu::detail::gemm_portable(false, true, n, n, n, a.data(), b.data(), 0.0f, out.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * n * n * n);
}
BENCHMARK(BM_GemmPortable)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond);

// --- linear layers at the GPT shape (single BLAS thread, as a rank of the threaded executor) ------------------------

void BM_MatmulForward(benchmark::State& state) {  // arg: out_features (3C: QKV, 4C: fc)
  const int out_features = static_cast<int>(state.range(0));
  cpu::set_blas_threads(1);
  const auto inp = random_vector(static_cast<std::size_t>(kRows) * kChannels, 1);
  const auto weight = random_vector(static_cast<std::size_t>(out_features) * kChannels, 2);
  const auto bias = random_vector(out_features, 3);
  std::vector<float> out(static_cast<std::size_t>(kRows) * out_features);
  for (auto _ : state) {
    cpu::matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), kRows, kChannels, out_features);
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * kRows * kChannels * out_features);
  set_shape(state, kRows, out_features, kChannels);
}
BENCHMARK(BM_MatmulForward)->Arg(3 * kChannels)->Arg(4 * kChannels)->Unit(benchmark::kMillisecond);

void BM_MatmulBackward(benchmark::State& state) {
  const int out_features = static_cast<int>(state.range(0));
  cpu::set_blas_threads(1);
  const auto inp = random_vector(static_cast<std::size_t>(kRows) * kChannels, 1);
  const auto weight = random_vector(static_cast<std::size_t>(out_features) * kChannels, 2);
  const auto dout = random_vector(static_cast<std::size_t>(kRows) * out_features, 3);
  std::vector<float> dinp(static_cast<std::size_t>(kRows) * kChannels);
  std::vector<float> dweight(static_cast<std::size_t>(out_features) * kChannels, 0.0f), dbias(out_features, 0.0f);
  for (auto _ : state) {
    cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), kRows,
                         kChannels, out_features);
    benchmark::ClobberMemory();
  }
  set_flops(state, 4.0 * kRows * kChannels * out_features);
}
BENCHMARK(BM_MatmulBackward)->Arg(3 * kChannels)->Arg(4 * kChannels)->Unit(benchmark::kMillisecond);

// --- attention: B*H*T(T+1)/2 (query, key) pairs, 2D FLOPs each for q.k and for p v; the backward does 5 such ------

double attention_pair_flops() {
  return 2.0 * kHeadDim * kBatch * kHeads * (kSeq * (kSeq + 1.0) / 2.0);
}

void BM_AttentionForward(benchmark::State& state) {
  const auto qkv = random_vector(static_cast<std::size_t>(kRows) * 3 * kChannels, 1);
  std::vector<float> out(static_cast<std::size_t>(kRows) * kChannels), lse(kBatch * kHeads * kSeq);
  for (auto _ : state) {
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), kBatch, kSeq, kHeads, kHeadDim);
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * attention_pair_flops());
}
BENCHMARK(BM_AttentionForward)->Unit(benchmark::kMillisecond);

void BM_AttentionBackward(benchmark::State& state) {
  const auto qkv = random_vector(static_cast<std::size_t>(kRows) * 3 * kChannels, 1);
  const auto dout = random_vector(static_cast<std::size_t>(kRows) * kChannels, 2);
  std::vector<float> out(static_cast<std::size_t>(kRows) * kChannels), lse(kBatch * kHeads * kSeq);
  std::vector<float> dqkv(qkv.size());
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), kBatch, kSeq, kHeads, kHeadDim);
  for (auto _ : state) {
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), lse.data(), kBatch, kSeq, kHeads, kHeadDim);
    benchmark::ClobberMemory();
  }
  set_flops(state, 5.0 * attention_pair_flops());
}
BENCHMARK(BM_AttentionBackward)->Unit(benchmark::kMillisecond);

// --- memory-bound kernels: bytes/s of compulsory traffic ---------------------------------------------------------

void BM_LayerNormForward(benchmark::State& state) {
  const auto inp = random_vector(static_cast<std::size_t>(kRows) * kChannels, 1);
  const auto weight = random_vector(kChannels, 2), bias = random_vector(kChannels, 3);
  std::vector<float> out(inp.size()), mean(kRows), rstd(kRows);
  for (auto _ : state) {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), kRows,
                           kChannels);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * inp.size() * sizeof(float));  // read inp, write out
}
BENCHMARK(BM_LayerNormForward)->Unit(benchmark::kMicrosecond);

void BM_LayerNormBackward(benchmark::State& state) {
  const auto inp = random_vector(static_cast<std::size_t>(kRows) * kChannels, 1);
  const auto weight = random_vector(kChannels, 2), bias = random_vector(kChannels, 3);
  const auto dout = random_vector(inp.size(), 4);
  std::vector<float> out(inp.size()), mean(kRows), rstd(kRows);
  std::vector<float> dinp(inp.size(), 0.0f), dweight(kChannels, 0.0f), dbias(kChannels, 0.0f);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), kRows,
                         kChannels);
  for (auto _ : state) {
    cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                            mean.data(), rstd.data(), kRows, kChannels);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 4.0 * inp.size() * sizeof(float));  // read dout, inp, dinp; write dinp
}
BENCHMARK(BM_LayerNormBackward)->Unit(benchmark::kMicrosecond);

void BM_GeluForward(benchmark::State& state) {
  const auto inp = random_vector(static_cast<std::size_t>(kRows) * 4 * kChannels, 1, -3.0f, 3.0f);
  std::vector<float> out(inp.size());
  for (auto _ : state) {
    cpu::gelu_forward(out.data(), inp.data(), inp.size());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * inp.size() * sizeof(float));
}
BENCHMARK(BM_GeluForward)->Unit(benchmark::kMicrosecond);

void BM_GeluBackward(benchmark::State& state) {
  const auto inp = random_vector(static_cast<std::size_t>(kRows) * 4 * kChannels, 1, -3.0f, 3.0f);
  const auto dout = random_vector(inp.size(), 2);
  std::vector<float> dinp(inp.size());
  for (auto _ : state) {
    cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3.0 * inp.size() * sizeof(float));
}
BENCHMARK(BM_GeluBackward)->Unit(benchmark::kMicrosecond);

void BM_EmbeddingForwardBackward(benchmark::State& state) {
  const auto wte = random_vector(static_cast<std::size_t>(kVocabLocal) * kChannels, 1);
  std::vector<float> dwte(wte.size(), 0.0f);
  std::vector<int> tokens(kRows);
  std::mt19937 generator(2);
  for (int& token : tokens) token = static_cast<int>(generator() % (8 * kVocabLocal));  // 1 in 8 is local
  const auto dout = random_vector(static_cast<std::size_t>(kRows) * kChannels, 3);
  std::vector<float> out(dout.size());
  for (auto _ : state) {
    cpu::embedding_forward(out.data(), tokens.data(), wte.data(), kRows, kChannels, 0, kVocabLocal);
    cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), kRows, kChannels, 0, kVocabLocal);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * out.size() * sizeof(float));  // write out, read dout (the local rows' traffic is small)
}
BENCHMARK(BM_EmbeddingForwardBackward)->Unit(benchmark::kMicrosecond);

void BM_CrossEntropy(benchmark::State& state) {  // local stats, combine (1 shard), backward over one vocab shard
  const auto logits = random_vector(static_cast<std::size_t>(kRows) * kVocabLocal, 1, -5.0f, 5.0f);
  std::vector<int> targets(kRows);
  std::mt19937 generator(2);
  for (int& target : targets) target = static_cast<int>(generator() % kVocabLocal);
  std::vector<float> stats(kRows * cpu::kCrossEntropyStats), losses(kRows), lse(kRows), dlogits(logits.size());
  for (auto _ : state) {
    cpu::cross_entropy_local_stats(stats.data(), logits.data(), targets.data(), kRows, 0, kVocabLocal, kVocabLocal);
    cpu::cross_entropy_combine(losses.data(), lse.data(), stats.data(), kRows, 1);
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), kRows, 0, kVocabLocal,
                                kVocabLocal, 1.0f / kRows);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3.0 * logits.size() * sizeof(float));  // read logits twice, write dlogits
}
BENCHMARK(BM_CrossEntropy)->Unit(benchmark::kMillisecond);

void BM_AdamW(benchmark::State& state) {  // the parameters of 12 layers of this shape, 12 x 12 C^2 ~ 38M: use 4M
  const std::size_t n = std::size_t{1} << 22;
  auto param = random_vector(n, 1);
  const auto grad = random_vector(n, 2);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  int step = 1;
  for (auto _ : state) {
    cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step++, 1.0f);
    benchmark::ClobberMemory();
  }
  set_bytes(state, 7.0 * n * sizeof(float));  // read param, grad, m, v; write param, m, v
}
BENCHMARK(BM_AdamW)->Unit(benchmark::kMillisecond);

void BM_ResidualForward(benchmark::State& state) {
  const auto a = random_vector(static_cast<std::size_t>(kRows) * kChannels, 1);
  const auto b = random_vector(a.size(), 2);
  std::vector<float> out(a.size());
  for (auto _ : state) {
    cpu::residual_forward(out.data(), a.data(), b.data(), a.size());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3.0 * a.size() * sizeof(float));
}
BENCHMARK(BM_ResidualForward)->Unit(benchmark::kMicrosecond);

void BM_SquaredNorm(benchmark::State& state) {
  const auto x = random_vector(std::size_t{1} << 22, 1);
  for (auto _ : state) benchmark::DoNotOptimize(cpu::squared_norm(x.data(), x.size()));
  set_bytes(state, 1.0 * x.size() * sizeof(float));
}
BENCHMARK(BM_SquaredNorm)->Unit(benchmark::kMicrosecond);

void BM_CastToBf16(benchmark::State& state) {
  const auto x = random_vector(std::size_t{1} << 22, 1);
  std::vector<std::uint16_t> out(x.size());
  for (auto _ : state) {
    cpu::cast_float_to_bf16(out.data(), x.data(), x.size());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 6.0 * x.size());  // read 4 bytes, write 2
}
BENCHMARK(BM_CastToBf16)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
