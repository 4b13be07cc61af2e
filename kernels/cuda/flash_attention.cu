#include "kernels/cuda/flash_attention.cuh"

#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/reduce.cuh"

namespace twin::kernels::cuda {

using device::bf16;

namespace {

constexpr int kThreads = launch::kFlashThreads;
constexpr int kBr = launch::kFlashQueryTile;  // queries of a forward or dq tile: 16 per warp
constexpr int kBc = launch::kFlashKeyTile;    // keys of a tile: 16 per warp in the dk/dv kernel
constexpr int kPad = launch::kFlashPadding;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kThreads == 128 && kBr == 64 && kBc == 64, "4 warps of 16 rows");

__device__ __forceinline__ float minus_infinity() {
  return __int_as_float(0xff800000);
}

// --- tensor-core fragments (PTX ISA, mma.m16n8k16 with .bf16: g = lane / 4, t = lane % 4) ---------------------------
//   A (16 x 16, row):  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 8+2t..)  a3 (g+8, 8+2t..)
//   B (16 x 8, col):   b0 (k 2t..2t+1, n g)  b1 (k 8+2t.., n g)
//   C (16 x 8):        c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
// Two adjacent C tiles of a row block are, packed to bf16, the A fragment of the next product (P, dS).

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// A fragment of rows [row0, row0 + 16), columns [col0, col0 + 16) of a row-major shared tile (row stride `stride`)
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const bf16* tile, int stride, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  const bf16* p = tile + (row0 + lane % 16) * stride + col0 + (lane / 16) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(shared_address(p)));
}

// B fragment (k = columns [col0, col0 + 16), n = rows [row0, row0 + 8)) of a tile stored [n][k] (K for Q K^T)
__device__ __forceinline__ void load_b(std::uint32_t (&b)[2], const bf16* tile, int stride, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  const bf16* p = tile + (row0 + lane % 8) * stride + col0 + ((lane / 8) % 2) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(shared_address(p)));
}

// B fragment (k = rows [row0, row0 + 16), n = columns [col0, col0 + 8)) of a tile stored [k][n] (V for P V)
__device__ __forceinline__ void load_b_transposed(std::uint32_t (&b)[2], const bf16* tile, int stride, int row0,
                                                  int col0) {
  const int lane = threadIdx.x % 32;
  const bf16* p = tile + (row0 + lane % 16) * stride + col0;
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(shared_address(p)));
}

// d (16 x 8, fp32) += a (16 x 16) b (16 x 8)
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ std::uint32_t pack(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);  // .x (low half) is the lower column
  return *reinterpret_cast<const std::uint32_t*>(&pair);
}

// The A fragment of columns [16 kk, 16 kk + 16) of a row block held as C tiles c[0 .. 2 kk + 1]
template <int N>
__device__ __forceinline__ void c_to_a(std::uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// max and sum over the 4 lanes that hold one row (lanes 4g .. 4g + 3)
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// --- operands -------------------------------------------------------------------------------------------------------

// One operand's rows: element d of head h of token t of sequence b at data[b batch + t token + h head_dim + d], as
// kernels::cpu::HeadRows (tokens of this block: t counts from the block's first).
template <class T>
struct Rows {
  T* data;
  long long batch, token;  // elements between sequences, between tokens
  __device__ T* at(int b, int t, int head, int head_dim) const {
    return data + b * batch + t * token + static_cast<long long>(head) * head_dim;
  }
};

// A block pair (kernels::cpu::FlashBlock): queries at positions [q_start, q_start + q_len), keys at
// [kv_start, kv_start + kv_len).
struct Block {
  int heads, kv_heads;
  int q_start, q_len, kv_start, kv_len;
  float scale;
  const float* slopes;  // (heads) device, or nullptr
};

struct ForwardArgs {
  Block x;
  Rows<const bf16> q, k, v;
  Rows<bf16> out;
  float* lse;  // (batch, heads, q_len)
};

struct BackwardArgs {
  Block x;
  Rows<const bf16> q, k, v, dout;
  Rows<bf16> dq, dk, dv;
  const float* lse;    // (batch, heads, q_len)
  const float* delta;  // (batch, heads, q_len)
};

// tile (rows x D, row stride D + kPad) <- `valid` rows of head `head` from token t0 on, zeros below: 16-byte loads
template <int D>
__device__ void load_tile(bf16* tile, const Rows<const bf16>& src, int b, int t0, int head, int valid, int rows) {
  constexpr int kChunks = D / 8;  // 8 bf16 per 16 bytes
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < valid) value = *reinterpret_cast<const uint4*>(src.at(b, t0 + r, head, D) + col);
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + col) = value;
  }
}

// the keys a tile of queries [i0, i0 + rows) can see: [0, key_end)
__device__ __forceinline__ int key_end(const Block& x, int i0, int rows) {
  return min(max(x.q_start + i0 + rows - x.kv_start, 0), x.kv_len);
}

// --- forward --------------------------------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(ForwardArgs args) {
  constexpr int S = D + kPad;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);  // (kBr, S)
  bf16* k_tile = q_tile + kBr * S;                 // (kBc, S)
  bf16* v_tile = k_tile + kBc * S;                 // (kBc, S)
  const Block& x = args.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / x.heads, h = blockIdx.y % x.heads, kv = h / (x.heads / x.kv_heads);
  const int i0 = blockIdx.x * kBr, rows = min(kBr, x.q_len - i0);

  load_tile<D>(q_tile, args.q, b, i0, h, rows, kBr);
  __syncthreads();
  std::uint32_t q_frag[D / 16][4];  // this warp's 16 query rows, kept for every key tile
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(q_frag[kk], q_tile, S, warp * 16, kk * 16);

  float o[D / 8][4] = {};                                                  // (16, D) running output, rows g and g + 8
  float m[2] = {minus_infinity(), minus_infinity()}, l[2] = {0.0f, 0.0f};  // running max, this lane's sum share
  const float slope = x.slopes != nullptr ? x.slopes[h] : 0.0f;
  const int query_position = x.q_start + i0 + warp * 16 + g;  // of row g; row g + 8 is 8 later
  const int keys = key_end(x, i0, rows);
  for (int j0 = 0; j0 < keys; j0 += kBc) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    const int cols = min(kBc, x.kv_len - j0);
    load_tile<D>(k_tile, args.k, b, j0, kv, cols, kBc);
    load_tile<D>(v_tile, args.v, b, j0, kv, cols, kBc);
    __syncthreads();

    float s[kBc / 8][4] = {};  // (16, kBc) scores of this warp's rows
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
        std::uint32_t k_frag[2];
        load_b(k_frag, k_tile, S, nt * 8, kk * 16);
        mma(s[nt], q_frag[kk], k_frag);
      }
    }
    float tile_max[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2, key = j0 + nt * 8 + 2 * t + i % 2;
        const int key_position = x.kv_start + key, position = query_position + 8 * r;
        float score = s[nt][i] * x.scale + slope * static_cast<float>(key_position - position);
        if (key >= x.kv_len || key_position > position) score = minus_infinity();
        s[nt][i] = score;
        tile_max[r] = fmaxf(tile_max[r], score);
      }
    }
    float base[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
      base[r] = m_new == minus_infinity() ? 0.0f : m_new;  // a row that has seen no key yet: every term is 0
      alpha[r] = exp2f((m[r] - base[r]) * kLog2e);         // rescales what the earlier tiles summed
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha[0], o[dt][1] *= alpha[0], o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f((s[nt][i] - base[i / 2]) * kLog2e);
        s[nt][i] = p;
        l[i / 2] += p;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {  // O += P V, P as bf16 A fragments straight from the registers
      std::uint32_t p_frag[4];
      c_to_a(p_frag, s, kk);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        std::uint32_t v_frag[2];
        load_b_transposed(v_frag, v_tile, S, kk * 16, dt * 8);
        mma(o[dt], p_frag, v_frag);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    const int row = warp * 16 + g + 8 * r;
    if (row >= rows) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    bf16* out = args.out.at(b, i0 + row, h, D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<std::uint32_t*>(out + dt * 8 + 2 * t) = pack(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
    if (t == 0) {
      args.lse[(static_cast<long long>(b) * x.heads + h) * x.q_len + i0 + row] =
          sum > 0.0f ? m[r] + logf(sum) : minus_infinity();
    }
  }
}

// --- backward -------------------------------------------------------------------------------------------------------

// delta (batch, heads, q_len) = rowsum(dout * out), one warp per row
template <int D>
__global__ void flash_delta_kernel(float* delta, Rows<const bf16> dout, Rows<const bf16> out, int batch, int heads,
                                   int len) {
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<long long>(batch) * heads * len) return;
  const int t = static_cast<int>(row % len), h = static_cast<int>(row / len % heads),
            b = static_cast<int>(row / len / heads);
  const bf16* dy = dout.at(b, t, h, D);
  const bf16* y = out.at(b, t, h, D);
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum += __bfloat162float(dy[d]) * __bfloat162float(y[d]);
  sum = device::warp_sum(sum);
  if (lane == 0) delta[row] = sum;
}

template <int D>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(BackwardArgs args) {
  constexpr int S = D + kPad, Bq = launch::flash_backward_query_tile(D);
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* k_tile = reinterpret_cast<bf16*>(shared);                  // (kBc, S)
  bf16* v_tile = k_tile + kBc * S;                                 // (kBc, S)
  bf16* q_tile = v_tile + kBc * S;                                 // (Bq, S)
  bf16* dout_tile = q_tile + Bq * S;                               // (Bq, S)
  float* lse_step = reinterpret_cast<float*>(dout_tile + Bq * S);  // (Bq)
  float* delta_step = lse_step + Bq;                               // (Bq)
  const Block& x = args.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / x.kv_heads, kv = blockIdx.y % x.kv_heads, group = x.heads / x.kv_heads;
  const int j0 = blockIdx.x * kBc, cols = min(kBc, x.kv_len - j0);
  load_tile<D>(k_tile, args.k, b, j0, kv, cols, kBc);
  load_tile<D>(v_tile, args.v, b, j0, kv, cols, kBc);

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};                // (16, D) of this warp's keys, rows g and g + 8
  const int key_position = x.kv_start + j0 + warp * 16 + g;  // of row g
  // query steps start at multiples of Bq, from the first that holds a query seeing a key of this tile
  const int first = min(max(x.kv_start + j0 - x.q_start, 0), x.q_len) / Bq * Bq;
  for (int h = kv * group; h < (kv + 1) * group; ++h) {
    const float slope = x.slopes != nullptr ? x.slopes[h] : 0.0f;
    const long long head_row = (static_cast<long long>(b) * x.heads + h) * x.q_len;
    for (int i0 = first; i0 < x.q_len; i0 += Bq) {
      const int rows = min(Bq, x.q_len - i0);
      __syncthreads();  // every warp is done with the previous step's tiles
      load_tile<D>(q_tile, args.q, b, i0, h, rows, Bq);
      load_tile<D>(dout_tile, args.dout, b, i0, h, rows, Bq);
      for (int c = threadIdx.x; c < Bq; c += kThreads) {
        lse_step[c] = c < rows ? args.lse[head_row + i0 + c] : minus_infinity();
        delta_step[c] = c < rows ? args.delta[head_row + i0 + c] : 0.0f;
      }
      __syncthreads();

      float p[Bq / 8][4] = {};  // (16 keys, Bq queries): S^T, then P^T
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t k_frag[4];
        load_a(k_frag, k_tile, S, warp * 16, kk * 16);
#pragma unroll
        for (int nt = 0; nt < Bq / 8; ++nt) {
          std::uint32_t q_frag[2];
          load_b(q_frag, q_tile, S, nt * 8, kk * 16);
          mma(p[nt], k_frag, q_frag);
        }
      }
#pragma unroll
      for (int nt = 0; nt < Bq / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = j0 + warp * 16 + g + 8 * (i / 2), query = nt * 8 + 2 * t + i % 2;
          const int position = x.q_start + i0 + query, key_at = key_position + 8 * (i / 2);
          const float lse = lse_step[query];
          const bool seen = key < x.kv_len && query < rows && key_at <= position && lse != minus_infinity();
          const float score = p[nt][i] * x.scale + slope * static_cast<float>(key_at - position);
          p[nt][i] = seen ? exp2f((score - lse) * kLog2e) : 0.0f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < Bq / 16; ++kk) {  // dV += P^T dout
        std::uint32_t p_frag[4];
        c_to_a(p_frag, p, kk);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          std::uint32_t dout_frag[2];
          load_b_transposed(dout_frag, dout_tile, S, kk * 16, dt * 8);
          mma(dv[dt], p_frag, dout_frag);
        }
      }
      float ds[Bq / 8][4] = {};  // dP^T = V dout^T, then dS^T = P^T (dP^T - delta)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t v_frag[4];
        load_a(v_frag, v_tile, S, warp * 16, kk * 16);
#pragma unroll
        for (int nt = 0; nt < Bq / 8; ++nt) {
          std::uint32_t dout_frag[2];
          load_b(dout_frag, dout_tile, S, nt * 8, kk * 16);
          mma(ds[nt], v_frag, dout_frag);
        }
      }
#pragma unroll
      for (int nt = 0; nt < Bq / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) ds[nt][i] = p[nt][i] * (ds[nt][i] - delta_step[nt * 8 + 2 * t + i % 2]);
      }
#pragma unroll
      for (int kk = 0; kk < Bq / 16; ++kk) {  // dK += dS^T Q (scaled once, below)
        std::uint32_t ds_frag[4];
        c_to_a(ds_frag, ds, kk);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          std::uint32_t q_frag[2];
          load_b_transposed(q_frag, q_tile, S, kk * 16, dt * 8);
          mma(dk[dt], ds_frag, q_frag);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = warp * 16 + g + 8 * r;
    if (key >= cols) continue;
    bf16* dk_row = args.dk.at(b, j0 + key, kv, D);
    bf16* dv_row = args.dv.at(b, j0 + key, kv, D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<std::uint32_t*>(dk_row + dt * 8 + 2 * t) =
          pack(x.scale * dk[dt][2 * r], x.scale * dk[dt][2 * r + 1]);
      *reinterpret_cast<std::uint32_t*>(dv_row + dt * 8 + 2 * t) = pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(BackwardArgs args) {
  constexpr int S = D + kPad;
  extern __shared__ __align__(16) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);  // (kBr, S)
  bf16* dout_tile = q_tile + kBr * S;              // (kBr, S)
  bf16* k_tile = dout_tile + kBr * S;              // (kBc, S)
  bf16* v_tile = k_tile + kBc * S;                 // (kBc, S)
  const Block& x = args.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = blockIdx.y / x.heads, h = blockIdx.y % x.heads, kv = h / (x.heads / x.kv_heads);
  const int i0 = blockIdx.x * kBr, rows = min(kBr, x.q_len - i0);
  load_tile<D>(q_tile, args.q, b, i0, h, rows, kBr);
  load_tile<D>(dout_tile, args.dout, b, i0, h, rows, kBr);

  const long long head_row = (static_cast<long long>(b) * x.heads + h) * x.q_len;
  float lse[2], delta[2];  // of rows g and g + 8
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    lse[r] = row < rows ? args.lse[head_row + i0 + row] : minus_infinity();
    delta[r] = row < rows ? args.delta[head_row + i0 + row] : 0.0f;
  }
  const float slope = x.slopes != nullptr ? x.slopes[h] : 0.0f;
  const int query_position = x.q_start + i0 + warp * 16 + g;
  float dq[D / 8][4] = {};
  const int keys = key_end(x, i0, rows);
  for (int j0 = 0; j0 < keys; j0 += kBc) {
    __syncthreads();  // every warp is done with the previous K and V tiles (and Q, dout are loaded, first time)
    const int cols = min(kBc, x.kv_len - j0);
    load_tile<D>(k_tile, args.k, b, j0, kv, cols, kBc);
    load_tile<D>(v_tile, args.v, b, j0, kv, cols, kBc);
    __syncthreads();

    float p[kBc / 8][4] = {}, ds[kBc / 8][4] = {};  // S then P; dP then dS
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t q_frag[4], dout_frag[4];
      load_a(q_frag, q_tile, S, warp * 16, kk * 16);
      load_a(dout_frag, dout_tile, S, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
        std::uint32_t k_frag[2], v_frag[2];
        load_b(k_frag, k_tile, S, nt * 8, kk * 16);
        load_b(v_frag, v_tile, S, nt * 8, kk * 16);
        mma(p[nt], q_frag, k_frag);
        mma(ds[nt], dout_frag, v_frag);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2, key = j0 + nt * 8 + 2 * t + i % 2;
        const int key_position = x.kv_start + key, position = query_position + 8 * r;
        const bool seen = key < x.kv_len && key_position <= position && lse[r] != minus_infinity();
        const float score = p[nt][i] * x.scale + slope * static_cast<float>(key_position - position);
        const float prob = seen ? exp2f((score - lse[r]) * kLog2e) : 0.0f;
        ds[nt][i] = prob * (ds[nt][i] - delta[r]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {  // dQ += dS K (scaled once, below)
      std::uint32_t ds_frag[4];
      c_to_a(ds_frag, ds, kk);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        std::uint32_t k_frag[2];
        load_b_transposed(k_frag, k_tile, S, kk * 16, dt * 8);
        mma(dq[dt], ds_frag, k_frag);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    if (row >= rows) continue;
    bf16* dq_row = args.dq.at(b, i0 + row, h, D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<std::uint32_t*>(dq_row + dt * 8 + 2 * t) =
          pack(x.scale * dq[dt][2 * r], x.scale * dq[dt][2 * r + 1]);
    }
  }
}

// --- launches -------------------------------------------------------------------------------------------------------

// The operands of a packed qkv (batch, seq, (H + 2 KV) D) and an output (batch, seq, H D)
struct Packed {
  long long qkv_token, qkv_batch, out_token, out_batch, k_offset, v_offset;
  Packed(int seq, int heads, int kv_heads, int head_dim)
      : qkv_token(static_cast<long long>(heads + 2 * kv_heads) * head_dim),
        qkv_batch(qkv_token * seq),
        out_token(static_cast<long long>(heads) * head_dim),
        out_batch(out_token * seq),
        k_offset(static_cast<long long>(heads) * head_dim),
        v_offset(static_cast<long long>(heads + kv_heads) * head_dim) {}
  template <class T>
  Rows<T> in(T* base, long long offset) const {
    return {base + offset, qkv_batch, qkv_token};
  }
  template <class T>
  Rows<T> out(T* base) const {
    return {base, out_batch, out_token};
  }
};

// Raises a kernel's dynamic shared memory limit once (above 48 KB a kernel must ask).
template <class Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024) {
    TWIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

template <int D>
void forward(const ForwardArgs& args, const launch::FlashShape& shape, cudaStream_t stream) {
  allow_shared(flash_forward_kernel<D>, shape.forward_smem_bytes);  // per call: a process may drive several GPUs
  flash_forward_kernel<D>
      <<<dim3(shape.query_tiles, shape.query_heads), kThreads, shape.forward_smem_bytes, stream>>>(args);
  TWIN_CUDA_CHECK_LAUNCH();
}

template <int D>
void backward(const BackwardArgs& args, const Rows<const bf16>& out, float* delta, int batch,
              const launch::FlashShape& shape, cudaStream_t stream) {
  allow_shared(flash_dkdv_kernel<D>, shape.dkdv_smem_bytes);
  allow_shared(flash_dq_kernel<D>, shape.dq_smem_bytes);
  const long long rows = static_cast<long long>(batch) * args.x.heads * args.x.q_len;
  constexpr int kDeltaThreads = 256;  // 8 rows per block
  flash_delta_kernel<D>
      <<<static_cast<unsigned>((rows * 32 + kDeltaThreads - 1) / kDeltaThreads), kDeltaThreads, 0, stream>>>(
          delta, args.dout, out, batch, args.x.heads, args.x.q_len);
  TWIN_CUDA_CHECK_LAUNCH();
  flash_dkdv_kernel<D><<<dim3(shape.key_tiles, shape.kv_heads), kThreads, shape.dkdv_smem_bytes, stream>>>(args);
  TWIN_CUDA_CHECK_LAUNCH();
  flash_dq_kernel<D><<<dim3(shape.query_tiles, shape.query_heads), kThreads, shape.dq_smem_bytes, stream>>>(args);
  TWIN_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

Block whole_sequence(int seq, int heads, int kv_heads, int head_dim, const float* slopes) {
  return Block{heads, kv_heads, 0, seq, 0, seq, 1.0f / sqrtf(static_cast<float>(head_dim)), slopes};
}

}  // namespace

bool flash_attention_supports(int head_dim) {
  return launch::flash_supports_head_dim(head_dim);
}

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int batch, int seq, int heads, int kv_heads,
                             int head_dim, cudaStream_t stream, const float* alibi_slopes) {
  TWIN_CUDA_REQUIRE(out != nullptr && lse != nullptr && qkv != nullptr && out != qkv);
  TWIN_CUDA_REQUIRE(aligned16(out) && aligned16(qkv));  // rows move in 16-byte pieces
  const launch::FlashShape shape = launch::flash_shape(batch, seq, heads, kv_heads, head_dim);
  const Packed p(seq, heads, kv_heads, head_dim);
  const ForwardArgs args{whole_sequence(seq, heads, kv_heads, head_dim, alibi_slopes),
                         p.in(qkv, 0),
                         p.in(qkv, p.k_offset),
                         p.in(qkv, p.v_offset),
                         p.out(out),
                         lse};
  switch (head_dim) {
    case 32:
      return forward<32>(args, shape, stream);
    case 64:
      return forward<64>(args, shape, stream);
    case 96:
      return forward<96>(args, shape, stream);
    default:
      return forward<128>(args, shape, stream);
  }
}

void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                              int batch, int seq, int heads, int kv_heads, int head_dim, cudaStream_t stream,
                              const float* alibi_slopes) {
  TWIN_CUDA_REQUIRE(dqkv != nullptr && dout != nullptr && qkv != nullptr && out != nullptr && lse != nullptr);
  TWIN_CUDA_REQUIRE(dqkv != qkv && dqkv != dout && dqkv != out);
  TWIN_CUDA_REQUIRE(aligned16(dqkv) && aligned16(dout) && aligned16(qkv) && aligned16(out));
  const launch::FlashShape shape = launch::flash_shape(batch, seq, heads, kv_heads, head_dim);
  const Packed p(seq, heads, kv_heads, head_dim);
  device::Scratch delta(static_cast<std::size_t>(batch) * heads * seq * sizeof(float), stream);
  const BackwardArgs args{whole_sequence(seq, heads, kv_heads, head_dim, alibi_slopes),
                          p.in(qkv, 0),
                          p.in(qkv, p.k_offset),
                          p.in(qkv, p.v_offset),
                          p.out(dout),
                          p.in(dqkv, 0),
                          p.in(dqkv, p.k_offset),
                          p.in(dqkv, p.v_offset),
                          lse,
                          delta.as<float>()};
  const Rows<const bf16> out_rows = p.out(out);
  switch (head_dim) {
    case 32:
      return backward<32>(args, out_rows, delta.as<float>(), batch, shape, stream);
    case 64:
      return backward<64>(args, out_rows, delta.as<float>(), batch, shape, stream);
    case 96:
      return backward<96>(args, out_rows, delta.as<float>(), batch, shape, stream);
    default:
      return backward<128>(args, out_rows, delta.as<float>(), batch, shape, stream);
  }
}

}  // namespace twin::kernels::cuda
