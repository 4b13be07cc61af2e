// The CPU backend's context parallelism, the a2a way (DeepSpeed-Ulysses): the layout changes around the all-to-alls,
// on kernels/cpu/ring_attention.hpp's head-group split and chunk-order functions applied to one column range (the
// queries, keys or values of a packed qkv row, or an attention output) copied out of, or into, its tensor.
#include <algorithm>
#include <vector>

#include "exec/core/check.hpp"
#include "exec/core/sizes.hpp"
#include "exec/cpu/cpu_backend.hpp"
#include "kernels/cpu/ring_attention.hpp"
#include "model/ops/context_parallel.hpp"

namespace twin::exec::cpu {

namespace k = twin::kernels::cpu;

namespace {

// The range's columns [column, column + range) of every row of `tensor` (rows x width), and back.
std::vector<float> take_columns(const Tensor& tensor, std::size_t rows, int width, int column, std::size_t range) {
  std::vector<float> out(rows * range);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* from = tensor.f32() + r * sz(width) + sz(column);
    std::copy(from, from + range, out.data() + r * range);
  }
  return out;
}

void put_columns(const Tensor& tensor, const std::vector<float>& part, std::size_t rows, int width, int column,
                 std::size_t range) {
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy(part.data() + r * range, part.data() + (r + 1) * range, tensor.f32() + r * sz(width) + sz(column));
  }
}

void check_chunk_order(const ContextShape& s) {
  for (int part = 0; part < 2; ++part) {  // the kernels' chunk layout is the Program's
    TWIN_EXEC_CHECK(k::cp_chunk_of(s.cp_rank, part, s.cp) == model::cp_sequence_chunk(s.cp_rank, part, s.cp),
                    "context parallelism: the kernels' chunk layout differs from model/context_parallel's");
  }
}

}  // namespace

void CpuBackend::do_ulysses_split_heads(const Tensor& send, const Tensor& local, int width, int column, int heads,
                                        const ContextShape& s) {
  check_chunk_order(s);
  const std::size_t rows = sz(s.batch) * sz(s.seq / s.cp), range = sz(heads) * sz(s.head_dim);
  const std::vector<float> part = take_columns(local, rows, width, column, range);
  k::ulysses_split_heads(send.f32(), part.data(), s.batch, s.seq / s.cp, {heads}, s.head_dim, s.cp);
}

void CpuBackend::do_ulysses_join_heads(const Tensor& local, const Tensor& recv, int width, int column, int heads,
                                       const ContextShape& s) {
  check_chunk_order(s);
  const std::size_t rows = sz(s.batch) * sz(s.seq / s.cp), range = sz(heads) * sz(s.head_dim);
  std::vector<float> part(rows * range);
  k::ulysses_join_heads(part.data(), recv.f32(), s.batch, s.seq / s.cp, {heads}, s.head_dim, s.cp);
  put_columns(local, part, rows, width, column, range);
}

void CpuBackend::do_ulysses_blocks_to_sequence(const Tensor& full, const Tensor& blocks, int width, int column,
                                               int heads, const ContextShape& s) {
  check_chunk_order(s);
  const std::size_t rows = sz(s.batch) * sz(s.seq), range = sz(heads) * sz(s.head_dim);
  std::vector<float> part(rows * range);
  k::cp_blocks_to_sequence(part.data(), blocks.f32(), s.batch, s.seq, static_cast<int>(range), s.cp);
  put_columns(full, part, rows, width, column, range);
}

void CpuBackend::do_ulysses_sequence_to_blocks(const Tensor& blocks, const Tensor& full, int width, int column,
                                               int heads, const ContextShape& s) {
  check_chunk_order(s);
  const std::size_t rows = sz(s.batch) * sz(s.seq), range = sz(heads) * sz(s.head_dim);
  const std::vector<float> part = take_columns(full, rows, width, column, range);
  k::cp_sequence_to_blocks(blocks.f32(), part.data(), s.batch, s.seq, static_cast<int>(range), s.cp);
}

}  // namespace twin::exec::cpu
