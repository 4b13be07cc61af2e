// Context parallelism's exchanges in closed form, as Transformer Engine's context_parallel.py issues them.
#include "model/ops/context_parallel.hpp"

#include "model/ops/context_parallel_ring.hpp"

namespace twin::model {

double CpAttention::kv_tensor_bytes() const {
  return static_cast<double>(micro_batch) * local_tokens() * (static_cast<double>(kv_heads) / tp) * head_dim *
         element_bytes;
}

double CpAttention::q_tensor_bytes() const {
  return static_cast<double>(micro_batch) * local_tokens() * (static_cast<double>(heads) / tp) * head_dim *
         element_bytes;
}

CpTraffic cp_forward_traffic(const CpAttention& a, CpComm comm) {
  CpTraffic t;
  if (a.cp <= 1) return t;
  const double kv = a.kv_tensor_bytes(), steps = static_cast<double>(a.cp - 1);
  switch (comm) {
    case CpComm::P2P:  // steps 0 .. cp-2 each send K and V in one buffer to the next rank
      t.point_to_point = static_cast<int>(a.cp - 1);
      t.point_to_point_bytes = steps * 2 * kv;
      break;
    case CpComm::AllGather:  // gather_along_first_dim(k), (v)
      t.all_gathers = 2;
      t.collective_input_bytes = 2 * kv;
      break;
    case CpComm::AllToAll:  // q, k, v to heads; the output back to tokens
      t.all_to_alls = 4;
      t.collective_input_bytes = 2 * a.q_tensor_bytes() + 2 * kv;
      break;
  }
  return t;
}

CpTraffic cp_backward_traffic(const CpAttention& a, CpComm comm) {
  CpTraffic t;
  if (a.cp <= 1) return t;
  const double kv = a.kv_tensor_bytes(), steps = static_cast<double>(a.cp - 1);
  switch (comm) {
    case CpComm::P2P:  // K/V in messages 0 .. cp-2, each block's dK/dV in cp-1 hops (model/ops/context_parallel_ring.hpp)
      t.point_to_point = cp_ring_backward_messages(static_cast<int>(a.cp));
      t.point_to_point_bytes = 2 * steps * 2 * kv;
      break;
    case CpComm::AllGather:  // k and v gathered again, then dk and dv reduce-scattered from the whole sequence's
      t.all_gathers = 2;
      t.reduce_scatters = 2;
      t.collective_input_bytes = 2 * kv + 2 * static_cast<double>(a.cp) * kv;
      break;
    case CpComm::AllToAll:  // the output's gradient to heads; dq, dk, dv back to tokens
      t.all_to_alls = 4;
      t.collective_input_bytes = 2 * a.q_tensor_bytes() + 2 * kv;
      break;
  }
  return t;
}

int cp_sequence_chunk(int cp_rank, int part, int cp) {
  return part == 0 ? cp_rank : 2 * cp - 1 - cp_rank;
}

double cp_causal_pairs_per_rank(std::int64_t seq, std::int64_t cp) {
  const double s = static_cast<double>(seq);
  return s * (s + 1) / 2 / static_cast<double>(cp);
}

}  // namespace twin::model
