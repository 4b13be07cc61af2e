// exec/cuda: the CUDA backend against the CPU backend, the staging communicator with ranks sharing one GPU, and
// training through the interpreter (skipped without a GPU); the pipeline pairs NCCL connects and the "no GPU" error
// (on any machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/cuda/cuda_exec.hpp"
#include "exec/cuda/staging_communicator.hpp"
#include "exec/train/trainer.hpp"
#include "kernels/cpu/attention.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "tests/exec/cuda/backend_tensors.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels_cuda/cuda_test_util.hpp"

namespace twin::exec::cuda {
namespace {

using kernels::cpu::testing::random_tokens;
using kernels::cpu::testing::random_vector;
using kernels::cuda::testing::bf16_rounded;
using kernels::cuda::testing::gpu_available;
using kernels::cuda::testing::normalised_error_below;

std::string toml(int layers, int pp, int tp, int dp, const std::string& schedule, int virtual_stages) {
  return "[model]\nname = \"t\"\nlayers = " + std::to_string(layers) +
         "\nhidden = 64\nheads = 4\nseq_len = 32\nvocab = 256\ndtype = \"bf16\"\n"
         "[parallel]\ntp = " +
         std::to_string(tp) + "\npp = " + std::to_string(pp) + "\ndp = " + std::to_string(dp) +
         "\nmicro_batch = 2\nglobal_batch = " + std::to_string(8 * dp) + "\nschedule = \"" + schedule +
         "\"\nvirtual_stages = " + std::to_string(virtual_stages) +
         "\n[cluster]\nnode = \"cpu-host\"\n[training]\nseed = 3\nlearning_rate = 3e-3\nwarmup_steps = 1\n"
         "decay_steps = 10\n";
}

// --- on any machine ------------------------------------------------------------------------------------------------

TEST(CudaExec, PipelinePairsFollowTheStages) {
  // tp 2, pp 2: stage 0 holds ranks 0, 1; stage 1 ranks 2, 3 (rank = tp + TP (dp + DP pp)); messages stay in a TP lane
  const model::Program plain = model::build_program(model::parse_scenario(toml(4, 2, 2, 1, "1f1b", 1), "test"));
  const std::vector<std::pair<int, int>> want_plain = {{0, 2}, {1, 3}, {2, 0}, {3, 1}};
  EXPECT_EQ(pipeline_pairs(plain), want_plain);
  // interleaved over 4 stages: the last stage sends chunk 0's output to the first one (wrap-around), and back
  const model::Program interleaved =
      model::build_program(model::parse_scenario(toml(8, 4, 1, 1, "interleaved", 2), "test"));
  const std::vector<std::pair<int, int>> want_interleaved = {{0, 1}, {0, 3}, {1, 0}, {1, 2},
                                                             {2, 1}, {2, 3}, {3, 0}, {3, 2}};
  EXPECT_EQ(pipeline_pairs(interleaved), want_interleaved);
}

TEST(CudaExec, HostMemoryIsNotDeviceMemory) {
  std::vector<float> host(16);
  EXPECT_FALSE(is_device_pointer(host.data()));
  EXPECT_FALSE(is_device_pointer(nullptr));
}

TEST(CudaExec, BackendWithoutGpuSaysSo) {
  if (gpu_available()) GTEST_SKIP() << "a GPU is present";
  try {
    make_cuda_backend({});
    FAIL() << "make_cuda_backend succeeded without a GPU";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("the cuda backend needs a GPU"), std::string::npos) << e.what();
  }
}

// --- with a GPU: the CUDA backend against the CPU backend ----------------------------------------------------------

// A tensor of `values` on `backend`, in `dtype` (bf16 on the CUDA side for activations and weights).
using test_tensors::make;
using test_tensors::read;

TEST(CudaBackendTest, LayerComputeMatchesCpuBackend) {
  TWIN_REQUIRE_GPU();
  cpu::CpuBackend host_backend;
  CudaBackend gpu_backend;
  Backend& c = host_backend;
  Backend& g = gpu_backend;
  const DType act = g.activation_dtype();
  EXPECT_EQ(act, DType::BF16);
  const int B = 2, T = 24, H = 4, D = 16, C = H * D, rows = B * T;
  const auto x = bf16_rounded(random_vector(rows * C, 1, -2.0f, 2.0f));
  const auto w = bf16_rounded(random_vector(3 * C * C, 2, -0.2f, 0.2f));
  const auto bias = bf16_rounded(random_vector(3 * C, 3));
  const auto ln_w = bf16_rounded(random_vector(C, 4, 0.5f, 1.5f)), ln_b = bf16_rounded(random_vector(C, 5));

  // ALiBi as TP rank 1 of 2 applies it: the slopes of heads [H, 2H) of 2H
  const std::vector<float> all_slopes = kernels::cpu::alibi_slopes(2 * H);
  const std::vector<float> slopes(all_slopes.begin() + H, all_slopes.end());

  // layernorm -> qkv linear -> attention (without and with ALiBi), on both backends
  auto forward = [&](Backend& be, DType a) {
    Tensor tx = make(be, x, a), tw = make(be, w, a), tb = make(be, bias, a);
    Tensor tlw = make(be, ln_w, a), tlb = make(be, ln_b, a);
    Tensor ln = be.allocate(rows * C, a), mean = be.allocate(rows, DType::F32), rstd = be.allocate(rows, DType::F32);
    be.layernorm_forward(ln, mean, rstd, tx, tlw, tlb, rows, C);
    Tensor qkv = be.allocate(rows * 3 * C, a);
    be.matmul_forward(qkv, ln, tw, tb, rows, C, 3 * C);
    Tensor out = be.allocate(rows * C, a), lse = be.allocate(B * H * T, DType::F32);
    be.attention_forward(out, lse, qkv, B, T, H, H, D, Tensor{});
    Tensor biased = be.allocate(rows * C, a), biased_lse = be.allocate(B * H * T, DType::F32);
    be.attention_forward(biased, biased_lse, qkv, B, T, H, H, D, make(be, slopes, DType::F32));
    return std::vector<std::vector<float>>{read(be, ln),  read(be, qkv),    read(be, out),
                                           read(be, lse), read(be, biased), read(be, biased_lse)};
  };
  const auto want = forward(c, DType::F32);
  const auto got = forward(g, act);
  EXPECT_TRUE(normalised_error_below(got[0], want[0], 5e-3)) << "layernorm";
  EXPECT_TRUE(normalised_error_below(got[1], want[1], 1e-2)) << "qkv";
  EXPECT_TRUE(normalised_error_below(got[2], want[2], 2e-2)) << "attention";
  EXPECT_TRUE(normalised_error_below(got[3], want[3], 1e-2)) << "lse";
  EXPECT_TRUE(normalised_error_below(got[4], want[4], 2e-2)) << "attention with ALiBi";
  EXPECT_TRUE(normalised_error_below(got[5], want[5], 1e-2)) << "lse with ALiBi";
}

// The kernels of a Llama-style block through both backends: RMSNorm -> qkv linear without bias -> rotary embeddings ->
// grouped-query attention (4 query heads on 2 kv heads), and SwiGLU; then their backwards in the interpreter's order
// (attention, then the rotation of dq and dk back; RMSNorm accumulating into the residual stream's gradient).
TEST(CudaBackendTest, LlamaLayerComputeMatchesCpuBackend) {
  TWIN_REQUIRE_GPU();
  cpu::CpuBackend host_backend;
  CudaBackend gpu_backend;
  Backend& c = host_backend;
  Backend& g = gpu_backend;
  const int B = 2, T = 24, H = 4, KV = 2, D = 16, C = H * D, rows = B * T, width = (H + 2 * KV) * D, F = 96;
  const auto x = bf16_rounded(random_vector(rows * C, 11, -2.0f, 2.0f));
  const auto w = bf16_rounded(random_vector(width * C, 12, -0.2f, 0.2f));
  const auto norm_w = bf16_rounded(random_vector(C, 13, 0.5f, 1.5f));
  const auto fc = bf16_rounded(random_vector(rows * 2 * F, 14, -4.0f, 4.0f));
  const auto d_act = bf16_rounded(random_vector(rows * F, 15));
  const auto d_attn = bf16_rounded(random_vector(rows * C, 16));
  const auto d_norm = bf16_rounded(random_vector(rows * C, 17));

  auto run = [&](Backend& be, DType a) {
    Tensor tx = make(be, x, a), tw = make(be, w, a), tnw = make(be, norm_w, a), tfc = make(be, fc, a);
    Tensor norm = be.allocate(rows * C, a), rstd = be.allocate(rows, DType::F32);
    be.rmsnorm_forward(norm, rstd, tx, tnw, rows, C);
    Tensor qkv = be.allocate(rows * width, a);
    be.matmul_forward(qkv, norm, tw, Tensor{}, rows, C, width);
    be.rope_forward(qkv, B, T, H, KV, D, D);
    Tensor out = be.allocate(rows * C, a), lse = be.allocate(B * H * T, DType::F32);
    be.attention_forward(out, lse, qkv, B, T, H, KV, D, Tensor{});
    Tensor act = be.allocate(rows * F, a);
    be.swiglu_forward(act, tfc, rows, F);

    Tensor dqkv = be.allocate(rows * width, a);
    be.attention_backward(dqkv, make(be, d_attn, a), qkv, out, lse, B, T, H, KV, D, Tensor{});
    be.rope_backward(dqkv, B, T, H, KV, D, D);
    Tensor dfc = be.allocate(rows * 2 * F, a);
    be.swiglu_backward(dfc, tfc, make(be, d_act, a), rows, F);
    Tensor dx = be.zeros(rows * C, a), dnw = be.zeros(C, DType::F32);
    be.rmsnorm_backward(dx, dnw, make(be, d_norm, a), tx, tnw, rstd, rows, C);
    return std::vector<std::vector<float>>{read(be, norm), read(be, rstd), read(be, qkv), read(be, out), read(be, lse),
                                           read(be, act),  read(be, dqkv), read(be, dfc), read(be, dx),  read(be, dnw)};
  };
  const auto want = run(c, DType::F32);
  const auto got = run(g, g.activation_dtype());
  EXPECT_TRUE(normalised_error_below(got[0], want[0], 5e-3)) << "rmsnorm";
  EXPECT_TRUE(normalised_error_below(got[1], want[1], 1e-5)) << "rstd";
  EXPECT_TRUE(normalised_error_below(got[2], want[2], 1e-2)) << "qkv, rotated";
  EXPECT_TRUE(normalised_error_below(got[3], want[3], 2e-2)) << "grouped attention";
  EXPECT_TRUE(normalised_error_below(got[4], want[4], 1e-2)) << "lse";
  EXPECT_TRUE(normalised_error_below(got[5], want[5], 5e-3)) << "swiglu";
  EXPECT_TRUE(normalised_error_below(got[6], want[6], 3e-2)) << "dqkv, rotated back";
  EXPECT_TRUE(normalised_error_below(got[7], want[7], 5e-3)) << "swiglu backward";
  EXPECT_TRUE(normalised_error_below(got[8], want[8], 5e-3)) << "rmsnorm dinp";
  EXPECT_TRUE(normalised_error_below(got[9], want[9], 1e-4)) << "rmsnorm dweight";
}

TEST(CudaBackendTest, CrossEntropyOptimizerAndReductionsMatchCpuBackend) {
  TWIN_REQUIRE_GPU();
  cpu::CpuBackend c;
  CudaBackend g;
  const int rows = 40, vocab = 300, padded = 384;
  const auto logits = bf16_rounded(random_vector(rows * padded, 6, -4.0f, 4.0f));
  const auto targets = random_tokens(rows, vocab, 7);
  auto losses = [&](Backend& be, DType a) {
    Tensor tl = make(be, logits, a);
    Tensor tt = be.allocate(rows, DType::I32);
    be.upload_i32(tt, targets.data());
    Tensor stats = be.allocate(rows * 3, DType::F32), loss = be.allocate(rows, DType::F32);
    Tensor lse = be.allocate(rows, DType::F32);
    be.cross_entropy_local_stats(stats, tl, tt, rows, 0, padded, vocab);
    be.cross_entropy_combine(loss, lse, stats, rows, 1);
    be.cross_entropy_backward(tl, tl, lse, tt, rows, 0, padded, vocab, 1.0f / rows);
    return std::vector<std::vector<float>>{read(be, loss), read(be, tl), {static_cast<float>(be.sum(loss))}};
  };
  const auto want = losses(c, DType::F32);
  const auto got = losses(g, DType::BF16);
  EXPECT_TRUE(normalised_error_below(got[0], want[0], 1e-5)) << "losses";
  EXPECT_TRUE(normalised_error_below(got[1], want[1], 5e-3)) << "dlogits";
  EXPECT_NEAR(got[2][0], want[2][0], 1e-4 * std::abs(want[2][0]));

  // AdamW: the CUDA backend updates its fp32 master copy and rounds the weights
  const std::size_t n = 1000;
  const auto param = random_vector(n, 8), grad = random_vector(n, 9);
  AdamWStep step;
  step.learning_rate = 1e-2f;
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  Tensor cp = make(c, param, DType::F32), cg = make(c, grad, DType::F32);
  Tensor cm = c.zeros(n, DType::F32), cv = c.zeros(n, DType::F32);
  c.adamw_update(cp, Tensor{}, cg, cm, cv, step);
  Tensor gp = make(g, param, DType::BF16), gmaster = make(g, param, DType::F32), gg = make(g, grad, DType::F32);
  Tensor gm = g.zeros(n, DType::F32), gv = g.zeros(n, DType::F32);
  g.adamw_update(gp, gmaster, gg, gm, gv, step);
  EXPECT_TRUE(kernels::cuda::testing::same_bits(read(g, gmaster), read(c, cp))) << "master = the CPU twin's bits";
  EXPECT_TRUE(kernels::cuda::testing::same_bits(read(g, gp), bf16_rounded(read(c, cp)))) << "weights = rounded master";
  EXPECT_NEAR(g.squared_norm(gg), c.squared_norm(cg), 1e-9 * c.squared_norm(cg));
  // f64 and i32 tensors can be zeroed (the trainer's counters)
  Tensor zeros64 = g.allocate(3, DType::F64);
  EXPECT_NO_THROW(g.fill(zeros64, 0.0f));
  EXPECT_THROW(g.fill(zeros64, 1.0f), std::logic_error);
}

// --- with a GPU: ranks as threads sharing it, through the staging communicator
// ----------------------------------------

TEST(CudaStagingCommunicator, CollectivesAndMessagesOnDeviceBuffers) {
  TWIN_REQUIRE_GPU();
  constexpr int kRanks = 3;
  constexpr std::size_t kCount = 1000;
  ThreadsWorld world(kRanks, CommOptions{30});
  CommGroup group{"world", {0, 1, 2}};
  std::vector<std::string> failures(kRanks);
  std::vector<std::thread> ranks;
  // rank r's values: bf16-exact, so that the fp32 sum of three is exact too
  auto values = [](int r) { return bf16_rounded(random_vector(kCount, 100 + r, -4.0f, 4.0f)); };
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto host = world.communicator(rank);
        CudaBackend backend;
        StagingCommunicator comm(*host, backend.device_context());
        // all-reduce in bf16 (summed in fp32, rounded once) and fp32
        Tensor a = make(backend, values(rank), DType::BF16), b = make(backend, values(rank), DType::F32);
        comm.all_reduce(group, a.data, a.numel, a.dtype, "bf16 sum");
        comm.all_reduce(group, b.data, b.numel, b.dtype, "f32 sum");
        std::vector<float> sum(kCount, 0.0f);
        for (int r = 0; r < kRanks; ++r) {
          const auto v = values(r);
          for (std::size_t i = 0; i < kCount; ++i) sum[i] += v[i];
        }
        if (read(backend, b) != sum) throw std::runtime_error("f32 all_reduce differs from the sum");
        if (read(backend, a) != bf16_rounded(sum)) throw std::runtime_error("bf16 all_reduce differs");
        // all-gather of bf16 rows, then a host scalar through the same communicator
        Tensor mine = make(backend, values(rank), DType::BF16), all = backend.allocate(kRanks * kCount, DType::BF16);
        comm.all_gather(group, mine.data, all.data, kCount, DType::BF16, "gather");
        const auto gathered = read(backend, all);
        for (int r = 0; r < kRanks; ++r) {
          if (!std::equal(gathered.begin() + r * kCount, gathered.begin() + (r + 1) * kCount, values(r).begin())) {
            throw std::runtime_error("all_gather chunk " + std::to_string(r) + " differs");
          }
        }
        double scalar = rank + 1.0;
        comm.all_reduce(group, &scalar, 1, DType::F64, "host scalar");
        if (scalar != 6.0) throw std::runtime_error("host all_reduce gave " + std::to_string(scalar));
        // messages matched by tag, not order: rank 0 sends tags 2 then 1 to rank 1, which asks for 1 then 2
        if (rank == 0) {
          Tensor m1 = make(backend, values(1), DType::BF16), m2 = make(backend, values(2), DType::BF16);
          comm.send(1, 2, m2.data, m2.bytes());
          comm.send(1, 1, m1.data, m1.bytes());
        } else if (rank == 1) {
          Tensor r1 = backend.allocate(kCount, DType::BF16), r2 = backend.allocate(kCount, DType::BF16);
          comm.recv(0, 1, r1.data, r1.bytes(), "tag 1");
          comm.recv(0, 2, r2.data, r2.bytes(), "tag 2");
          if (read(backend, r1) != values(1) || read(backend, r2) != values(2)) {
            throw std::runtime_error("messages arrived mixed up");
          }
        }
        comm.barrier(group, "end");
      } catch (const std::exception& e) {
        failures[rank] = e.what();
        world.abort(rank, e.what());
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

// --- with a GPU: the interpreter trains on the CUDA backend --------------------------------------------------------

// The GPT-2 block with learned positions and with ALiBi (each TP rank's slopes of its global heads), and a
// Llama-style block (RMSNorm, SwiGLU, rotary embeddings, 2 kv heads for 4 query heads, no biases, untied embeddings:
// with tp 2 each rank holds one kv head shared by its two query heads) and a parallel block (attention and MLP on
// the layer input, one all-reduce of their summed partials) with rotary embeddings on a quarter of each head (4 of
// 16 dimensions), as GPT-NeoX's, train on the CUDA backend as on the CPU one.
TEST(CudaTraining, FollowsTheCpuBackendOnOneRankAndOnFourSharingTheGpu) {
  TWIN_REQUIRE_GPU();
  std::string corpus_text;
  for (int i = 0; i < 400; ++i)
    corpus_text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const TextDataset data = text_from_string(corpus_text);
  auto losses = [&](const std::string& backend, int tp, int pp, const std::vector<std::string>& sets) {
    std::vector<model::Override> overrides;
    for (const std::string& set : sets) overrides.push_back(model::parse_override(set));
    const model::Program program =
        model::build_program(model::parse_scenario(toml(4, pp, tp, 1, "1f1b", 1), "test", overrides));
    TrainOptions options;
    options.backend = backend;
    options.steps = 8;
    options.threads_per_rank = 1;
    options.trace_step = -2;
    return train_threads(program, data, options).losses;
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {"learned positions", {}},
      {"alibi", {"model.position_embedding=\"alibi\""}},
      {"llama-style",
       {"model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
        "model.kv_heads=2", "model.linear_bias=false", "framework.tied_embeddings=false"}},
      {"gpt-neox-style",
       {"model.parallel_residual=true", "model.position_embedding=\"rope\"", "model.rotary_fraction=0.25",
        "framework.tied_embeddings=false"}}};
  for (const auto& [name, sets] : models) {
    SCOPED_TRACE(name);
    const auto cpu_losses = losses("cpu", 1, 1, sets);
    const auto cuda_losses = losses("cuda", 1, 1, sets);
    const auto split_losses = losses("cuda", 2, 2, sets);  // 4 rank threads on one GPU: TP collectives, P2P staged
    ASSERT_EQ(cuda_losses.size(), cpu_losses.size());
    ASSERT_EQ(split_losses.size(), cpu_losses.size());
    for (std::size_t i = 0; i < cpu_losses.size(); ++i) {
      EXPECT_NEAR(cuda_losses[i], cpu_losses[i], 0.02 * cpu_losses[i]) << "step " << i;  // bf16 against fp32
      EXPECT_NEAR(split_losses[i], cuda_losses[i], 0.02 * cuda_losses[i]) << "step " << i;
    }
    EXPECT_LT(cuda_losses.back(), cuda_losses.front());
  }
}

// ZB-H1 on the CUDA backend: the B GEMMs skip the weight gradient (matmul_backward with no dweight, the bias's from
// bias_backward), the W ops add it later in the same micro-batch order; 4 rank threads (TP 2 x PP 2) train as 1F1B
// does, to bf16's rounding of the bias gradient's other summation order (1e-3 relative). ZB-V and DualPipeV likewise
// on two one-layer chunks per stage in a V (4 micro-batches: DualPipeV's 2 pp), and DualPipe on two two-layer blocks
// per stage (2 micro-batches each way; the copies' gradients summed on the device communicator).
TEST(CudaTraining, ZeroBubbleSchedulesTrainAsOneFOneB) {
  TWIN_REQUIRE_GPU();
  std::string corpus_text;
  for (int i = 0; i < 400; ++i)
    corpus_text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const TextDataset data = text_from_string(corpus_text);
  auto losses = [&](const std::string& schedule, int virtual_stages) {
    const model::Program program =
        model::build_program(model::parse_scenario(toml(4, 2, 2, 1, schedule, virtual_stages), "test"));
    TrainOptions options;
    options.backend = "cuda";
    options.steps = 4;
    options.threads_per_rank = 1;
    options.trace_step = -2;
    return train_threads(program, data, options).losses;
  };
  const auto one_f_one_b = losses("1f1b", 1);
  for (const auto& [schedule, chunks] :
       {std::pair{"zb-h1", 1}, std::pair{"zb-v", 2}, std::pair{"dualpipev", 2}, std::pair{"dualpipe", 2}}) {
    const auto zero_bubble = losses(schedule, chunks);
    ASSERT_EQ(zero_bubble.size(), one_f_one_b.size());
    for (std::size_t i = 0; i < one_f_one_b.size(); ++i) {
      EXPECT_NEAR(zero_bubble[i], one_f_one_b[i], 1e-3 * one_f_one_b[i]) << schedule << " step " << i;
    }
  }
}

}  // namespace
}  // namespace twin::exec::cuda
