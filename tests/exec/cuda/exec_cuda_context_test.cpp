// exec/cuda's context parallelism (cuda_backend_context.cpp): every context_* and ulysses_* method of the CUDA backend
// against the CPU backend's on the same inputs, in the interpreter's order for each CP rank, and training at cp = 2
// under each way (framework.cp_comm all_gather, p2p, a2a) following the CPU backend (skipped without a GPU). The
// executor's check lets the cuda backend through. On any machine: the NCCL pairs of a CP ring.
#include <gtest/gtest.h>

#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "exec/core/errors.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/cuda/cuda_exec.hpp"
#include "exec/train/context_parallel.hpp"
#include "exec/train/trainer.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"
#include "tests/exec/cuda/backend_tensors.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels_cuda/cuda_test_util.hpp"

namespace twin::exec::cuda {
namespace {

using kernels::cpu::testing::random_vector;
using kernels::cuda::testing::bf16_rounded;
using kernels::cuda::testing::normalised_error_below;
using Floats = std::vector<float>;

// A tiny Llama (RMSNorm, SwiGLU, rotary embeddings, 4 query heads on 2 kv heads) at cp = 2 under `way`.
std::string llama_toml(int cp, const std::string& way) {
  return "[model]\nname = \"t\"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nseq_len = 32\nvocab = 256\n"
         "dtype = \"bf16\"\nnorm = \"rmsnorm\"\nactivation = \"swiglu\"\nposition_embedding = \"rope\"\n"
         "linear_bias = false\n[parallel]\ncp = " +
         std::to_string(cp) + "\nmicro_batch = 2\nglobal_batch = 8\n[framework]\nattention = \"flash2\"\ncp_comm = \"" +
         way +
         "\"\ntied_embeddings = false\n[cluster]\nnode = \"cpu-host\"\n[training]\nseed = 3\nlearning_rate = 3e-3\n"
         "warmup_steps = 1\ndecay_steps = 10\n";
}

// --- on any machine ------------------------------------------------------------------------------------------------

TEST(CudaExecContext, NcclPairsIncludeTheRing) {
  // cp 4: each rank sends its K/V blocks to the next CP rank, around the ring
  const model::Program ring = model::build_program(model::parse_scenario(llama_toml(4, "p2p"), "test"));
  const std::vector<std::pair<int, int>> want_ring = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};
  EXPECT_EQ(pipeline_pairs(ring), want_ring);
  // cp 2, pp 2 (rank = cp_rank + 2 stage): each stage's ring, and the pipeline's pairs
  const model::Program both = model::build_program(
      model::parse_scenario(llama_toml(2, "p2p"), "test", {model::parse_override("parallel.pp=2")}));
  const std::vector<std::pair<int, int>> want_both = {{0, 1}, {0, 2}, {1, 0}, {1, 3}, {2, 0}, {2, 3}, {3, 1}, {3, 2}};
  EXPECT_EQ(pipeline_pairs(both), want_both);
  // all_gather and a2a send nothing point to point: their groups are collective_groups'
  const model::Program gathered = model::build_program(model::parse_scenario(llama_toml(2, "all_gather"), "test"));
  EXPECT_TRUE(pipeline_pairs(gathered).empty());
}

// --- with a GPU: the CUDA backend against the CPU backend ----------------------------------------------------------

using test_tensors::make;
using test_tensors::read;
Floats joined(const std::vector<Floats>& parts) {
  Floats all;
  for (const Floats& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

constexpr int kBatch = 2, kSeq = 24, kHeads = 4, kKv = 2, kDim = 16, kCp = 2, kRotary = 16;
constexpr std::size_t kTokens = kBatch * kSeq / kCp, kRow = (kHeads + 2 * kKv) * kDim, kOut = kHeads * kDim,
                      kKvWidth = kKv * kDim;

ContextShape shape_of(int rank) {
  return ContextShape{kBatch, kSeq, kHeads, kKv, kDim, kCp, rank};
}

// Every rank's rotated qkv and its results under the all_gather way and the ring, on one backend (results in order:
// per rank qkv, keys, out, lse, dqkv, dkeys, dvalues, ring out, ring lse, ring dqkv).
std::vector<Floats> context_ways(Backend& be, DType a, const std::vector<Floats>& qkv, const std::vector<Floats>& dout,
                                 const Floats& key_grad) {
  std::vector<Floats> results;
  std::vector<Tensor> q(kCp), keys(kCp), values(kCp), kv(kCp);
  for (int r = 0; r < kCp; ++r) {
    q[r] = make(be, qkv[r], a);
    be.context_kernels().context_rope_forward(q[r], shape_of(r), kRotary);
    keys[r] = be.allocate(kTokens * kKvWidth, a), values[r] = be.allocate(kTokens * kKvWidth, a);
    be.context_kernels().context_split_keys_values(keys[r], values[r], q[r], shape_of(r));
    kv[r] = be.allocate(kTokens * 2 * kKvWidth, a);
    be.context_kernels().context_ring_pack_kv(kv[r], q[r], shape_of(r));
  }
  std::vector<Floats> all_keys, all_values;
  for (int r = 0; r < kCp; ++r) all_keys.push_back(read(be, keys[r])), all_values.push_back(read(be, values[r]));
  const Tensor gathered_keys = make(be, joined(all_keys), a), gathered_values = make(be, joined(all_values), a);
  for (int r = 0; r < kCp; ++r) {
    const ContextShape s = shape_of(r);
    Tensor out = be.allocate(kTokens * kOut, a), lse = be.allocate(kTokens * kHeads, DType::F32);
    be.context_kernels().context_attention_forward(out, lse, q[r], gathered_keys, gathered_values, s);
    Tensor dqkv = be.allocate(kTokens * kRow, a), dkeys = be.allocate(kCp * kTokens * kKvWidth, a);
    Tensor dvalues = be.allocate(dkeys.numel, a), d_out = make(be, dout[r], a);
    be.context_kernels().context_attention_backward(dqkv, dkeys, dvalues, d_out, q[r], gathered_keys, gathered_values,
                                                    out, lse, s);
    be.context_kernels().context_put_key_value_grad(dqkv, make(be, key_grad, a), false,
                                                    s);  // a reduce-scattered gradient
    be.context_kernels().context_rope_backward(dqkv, s, kRotary);
    // the ring: this rank's queries against each block in turn, then the backward steps
    Tensor ring_out = be.allocate(out.numel, a), ring_lse = be.allocate(lse.numel, DType::F32);
    for (int step = 0; step < kCp; ++step) {
      const int source = (r - step + kCp) % kCp;
      be.context_kernels().context_ring_forward_step(ring_out, ring_lse, q[r], kv[source], source, s);
    }
    Tensor delta = be.allocate(lse.numel, DType::F32), dq = be.zeros(out.numel, a);
    be.context_kernels().context_ring_delta(delta, d_out, ring_out, s);
    Tensor own = be.zeros(kv[r].numel, a);
    for (int step = 0; step < kCp; ++step) {
      const int source = (r - step + kCp) % kCp;
      Tensor share = source == r ? own : be.zeros(kv[r].numel, a);
      be.context_kernels().context_ring_backward_step(dq, share, d_out, q[r], kv[source], ring_lse, delta, source, s);
    }
    Tensor ring_dqkv = be.allocate(dqkv.numel, a);
    be.context_kernels().context_ring_put_grads(ring_dqkv, dq, own, s);
    for (const Tensor* t : {&q[r], &keys[r], &out, &lse, &dqkv, &dkeys, &dvalues, &ring_out, &ring_lse, &ring_dqkv}) {
      results.push_back(read(be, *t));
    }
  }
  return results;
}

TEST(CudaBackendContext, AllGatherAndRingMatchTheCpuBackend) {
  TWIN_REQUIRE_GPU();
  cpu::CpuBackend c;
  CudaBackend g;
  std::vector<Floats> qkv, dout;
  for (int r = 0; r < kCp; ++r) {
    qkv.push_back(bf16_rounded(random_vector(kTokens * kRow, 20 + r, -2.0f, 2.0f)));
    dout.push_back(bf16_rounded(random_vector(kTokens * kOut, 30 + r)));
  }
  const Floats key_grad = bf16_rounded(random_vector(kTokens * kKvWidth, 40));
  const auto want = context_ways(c, DType::F32, qkv, dout, key_grad);
  const auto got = context_ways(g, DType::BF16, qkv, dout, key_grad);
  ASSERT_EQ(got.size(), want.size());
  const char* names[] = {"rotated qkv", "keys",    "out",      "lse",      "dqkv",
                         "dkeys",       "dvalues", "ring out", "ring lse", "ring dqkv"};
  constexpr std::size_t kPerRank = std::size(names);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(normalised_error_below(got[i], want[i], 3e-2)) << "rank " << i / kPerRank << " " << names[i % kPerRank];
  }
}

TEST(CudaBackendContext, UlyssesReshufflesMatchTheCpuBackend) {
  TWIN_REQUIRE_GPU();
  cpu::CpuBackend c;
  CudaBackend g;
  const Floats local = bf16_rounded(random_vector(kTokens * kRow, 50));
  const Floats full = bf16_rounded(random_vector(kBatch * kSeq * kRow / kCp, 51));
  const int group_width = static_cast<int>(kRow / kCp);  // the head group's packed qkv row
  auto run = [&](Backend& be, DType a) {
    const ContextShape s = shape_of(1);
    std::vector<Floats> results;
    // the key heads of a packed qkv to their groups, and back into a zeroed row
    Tensor t_local = make(be, local, a), send = be.allocate(kTokens * kKvWidth, a);
    be.context_kernels().ulysses_split_heads(send, t_local, static_cast<int>(kRow), static_cast<int>(kOut), kKv, s);
    Tensor back = be.zeros(local.size(), a);
    be.context_kernels().ulysses_join_heads(back, send, static_cast<int>(kRow), static_cast<int>(kOut), kKv, s);
    // the whole sequence of a head group's values column (1 kv head of D at column (H/cp + KV/cp) D) to blocks, back
    Tensor t_full = make(be, full, a), blocks = be.allocate(kBatch * kSeq * kDim, a);
    const int column = (kHeads / kCp + kKv / kCp) * kDim;
    be.context_kernels().ulysses_sequence_to_blocks(blocks, t_full, group_width, column, 1, s);
    Tensor sequence = be.zeros(full.size(), a);
    be.context_kernels().ulysses_blocks_to_sequence(sequence, blocks, group_width, column, 1, s);
    for (const Tensor* t : {&send, &back, &blocks, &sequence}) results.push_back(read(be, *t));
    return results;
  };
  const auto want = run(c, DType::F32);
  const auto got = run(g, DType::BF16);
  const char* names[] = {"split heads", "join heads", "sequence to blocks", "blocks to sequence"};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << names[i];  // pure copies: exact
}

// --- with a GPU: training at cp = 2 under each way -----------------------------------------------------------------

TEST(CudaTraining, ContextParallelFollowsTheCpuBackendUnderEachWay) {
  TWIN_REQUIRE_GPU();
  std::string corpus_text;
  for (int i = 0; i < 400; ++i)
    corpus_text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const TextDataset data = text_from_string(corpus_text);
  auto losses = [&](const std::string& backend, int cp, const std::string& way,
                    const std::vector<std::string>& sets = {}) {
    std::vector<model::Override> overrides;
    for (const std::string& set : sets) overrides.push_back(model::parse_override(set));
    const model::Program program = model::build_program(model::parse_scenario(llama_toml(cp, way), "test", overrides));
    TrainOptions options;
    options.backend = backend;
    options.steps = 8;
    options.threads_per_rank = 1;
    options.trace_step = -2;
    return train_threads(program, data, options).losses;
  };
  {
    CudaBackend backend;  // the executor's check lets the cuda backend run context parallelism
    EXPECT_NO_THROW(
        refuse_unsupported_context_parallelism(model::parse_scenario(llama_toml(2, "p2p"), "test"), backend));
  }
  const auto one_rank = losses("cuda", 1, "p2p");
  for (const std::string way : {"all_gather", "p2p", "a2a"}) {
    SCOPED_TRACE(way);
    const auto cpu_losses = losses("cpu", 2, way);
    const auto cuda_losses = losses("cuda", 2, way);  // 2 rank threads on one GPU, the staging communicator
    ASSERT_EQ(cuda_losses.size(), cpu_losses.size());
    ASSERT_EQ(one_rank.size(), cpu_losses.size());
    for (std::size_t i = 0; i < cpu_losses.size(); ++i) {
      EXPECT_NEAR(cuda_losses[i], cpu_losses[i], 0.02 * cpu_losses[i]) << "step " << i;  // bf16 against fp32
      EXPECT_NEAR(cuda_losses[i], one_rank[i], 0.02 * one_rank[i]) << "step " << i;      // cp 2 against 1 rank
    }
    EXPECT_LT(cuda_losses.back(), cuda_losses.front());
  }
  // GPT-2's block (LayerNorm, GELU, biases, learned positions: each local chunk at its positions of wpe) on the ring
  const std::vector<std::string> gpt2 = {"model.norm=\"layernorm\"", "model.activation=\"gelu\"",
                                         "model.position_embedding=\"learned\"", "model.kv_heads=4",
                                         "model.linear_bias=true"};
  const auto cpu_gpt2 = losses("cpu", 2, "p2p", gpt2), cuda_gpt2 = losses("cuda", 2, "p2p", gpt2);
  ASSERT_EQ(cuda_gpt2.size(), cpu_gpt2.size());
  for (std::size_t i = 0; i < cpu_gpt2.size(); ++i) {
    EXPECT_NEAR(cuda_gpt2[i], cpu_gpt2[i], 0.02 * cpu_gpt2[i]) << "gpt-2 block, step " << i;
  }
}

}  // namespace
}  // namespace twin::exec::cuda
