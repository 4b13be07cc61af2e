// Context parallelism's exchanges in closed form (model/ops/context_parallel.hpp), on Llama 3 405B's 128k plan and by
// hand, and the causal load balance of the 2 cp chunk layout.
#include "model/ops/context_parallel.hpp"

#include <gtest/gtest.h>

namespace twin::model {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Llama 3 405B at 131,072 tokens, TP 8, CP 16 (the Llama 3 paper's Table 4): 128 query heads and 8 key/value heads of
// 128, bf16: each TP rank keeps one key/value head of 8192 tokens.
CpAttention llama3_405b_128k(std::int64_t cp) {
  return CpAttention{1, 131072, 128, 8, 128, 8, cp, 2};
}

TEST(ContextParallel, NamesAreMegatronCoresCpCommTypes) {
  for (CpComm comm : {CpComm::P2P, CpComm::AllGather, CpComm::AllToAll}) {
    EXPECT_EQ(cp_comm_from_name(to_string(comm)), comm);
  }
  EXPECT_EQ(to_string(CpComm::AllToAll), "a2a");
  EXPECT_EQ(to_string(CpComm::AllGather), "all_gather");
  EXPECT_FALSE(cp_comm_from_name("ring").has_value());
}

TEST(ContextParallel, RingSendsCpMinusOneBlocksForwardAndTwiceThatBackward) {
  const CpAttention a = llama3_405b_128k(16);
  EXPECT_EQ(a.local_tokens(), 8192);
  EXPECT_DOUBLE_EQ(a.kv_tensor_bytes(), 2 * kMiB);  // 8192 x 1 head x 128 x 2 bytes
  EXPECT_DOUBLE_EQ(a.q_tensor_bytes(), 32 * kMiB);  // 16 query heads per TP rank
  const CpTraffic forward = cp_forward_traffic(a, CpComm::P2P);
  EXPECT_EQ(forward.point_to_point, 15);
  EXPECT_DOUBLE_EQ(forward.point_to_point_bytes, 15 * 4 * kMiB);  // K and V of one rank per step
  const CpTraffic backward = cp_backward_traffic(a, CpComm::P2P);
  EXPECT_EQ(backward.point_to_point, 17);  // K/V alone twice, 13 with dK/dV, dK/dV alone twice
  EXPECT_DOUBLE_EQ(backward.point_to_point_bytes, 2 * 15 * 4 * kMiB);
  EXPECT_EQ(forward.all_gathers + forward.reduce_scatters + forward.all_to_alls, 0);
}

TEST(ContextParallel, AllGatherAndAllToAllCollectives) {
  const CpAttention a = llama3_405b_128k(16);
  const CpTraffic gather = cp_forward_traffic(a, CpComm::AllGather);
  EXPECT_EQ(gather.all_gathers, 2);
  EXPECT_DOUBLE_EQ(gather.collective_input_bytes, 4 * kMiB);
  const CpTraffic gather_back = cp_backward_traffic(a, CpComm::AllGather);
  EXPECT_EQ(gather_back.all_gathers, 2);
  EXPECT_EQ(gather_back.reduce_scatters, 2);
  EXPECT_DOUBLE_EQ(gather_back.collective_input_bytes, 4 * kMiB + 2 * 16 * 2 * kMiB);  // dK, dV of the sequence
  const CpTraffic ulysses = cp_forward_traffic(a, CpComm::AllToAll);
  EXPECT_EQ(ulysses.all_to_alls, 4);
  EXPECT_DOUBLE_EQ(ulysses.collective_input_bytes, 2 * 32 * kMiB + 2 * 2 * kMiB);  // q, out; k, v
  EXPECT_DOUBLE_EQ(cp_backward_traffic(a, CpComm::AllToAll).collective_input_bytes, ulysses.collective_input_bytes);
  // Without CP nothing moves.
  for (CpComm comm : {CpComm::P2P, CpComm::AllGather, CpComm::AllToAll}) {
    const CpTraffic none = cp_backward_traffic(llama3_405b_128k(1), comm);
    EXPECT_EQ(none.point_to_point + none.all_gathers + none.reduce_scatters + none.all_to_alls, 0);
    EXPECT_EQ(none.point_to_point_bytes + none.collective_input_bytes, 0);
  }
}

// The 2 cp chunk layout gives each rank the whole sequence's causal pairs over cp: counted chunk by chunk here.
TEST(ContextParallel, CausalPairsSplitEvenly) {
  for (std::int64_t cp : {1, 2, 4, 16}) {
    const std::int64_t chunk = 6, seq = 2 * cp * chunk;
    for (std::int64_t rank = 0; rank < cp; ++rank) {
      const std::int64_t chunks[2] = {rank, 2 * cp - 1 - rank};
      double pairs = 0;
      for (std::int64_t mine : chunks) {
        for (std::int64_t i = 0; i < chunk; ++i) pairs += static_cast<double>(mine * chunk + i + 1);  // keys 0..pos
      }
      EXPECT_DOUBLE_EQ(pairs, cp_causal_pairs_per_rank(seq, cp)) << "cp " << cp << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace twin::model
