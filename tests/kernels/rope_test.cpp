// rope_forward / rope_backward against the rotation written out in double, and the properties a rotation has: the
// identity at position 0, norms kept, scores that depend on relative positions only, the backward its transpose.
#include "kernels/cpu/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"

namespace twin::kernels::cpu {
namespace {

using testing::all_close;
using testing::random_vector;
using testing::same_bits;

struct Shape {
  int B, T, H, KV, D;
  std::size_t row() const { return static_cast<std::size_t>(H + 2 * KV) * D; }  // floats per token
  std::size_t size() const { return static_cast<std::size_t>(B) * T * row(); }
};

// start of head vector `head` (q's heads 0..H-1, then k's H..H+KV-1, then v's) of token (b, t)
std::size_t head_offset(const Shape& x, int b, int t, int head) {
  return (static_cast<std::size_t>(b) * x.T + t) * x.row() + static_cast<std::size_t>(head) * x.D;
}

// the formula as it reads, in double: theta_i = base^(-2i/d), halves rotated pair by pair; v copied
std::vector<double> rope_reference(const std::vector<float>& qkv, const Shape& x, double base = 10000.0) {
  std::vector<double> out(qkv.begin(), qkv.end());
  const int half = x.D / 2;
  for (int b = 0; b < x.B; ++b) {
    for (int t = 0; t < x.T; ++t) {
      for (int head = 0; head < x.H + x.KV; ++head) {
        const std::size_t at = head_offset(x, b, t, head);
        for (int i = 0; i < half; ++i) {
          const double angle = t * std::pow(base, -2.0 * i / x.D);
          const double x1 = qkv[at + i], x2 = qkv[at + half + i];
          out[at + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          out[at + half + i] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
    }
  }
  return out;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

TEST(CpuRope, ForwardMatchesDoubleReference) {
  for (const Shape x : {Shape{2, 37, 4, 2, 16}, Shape{1, 200, 2, 1, 64}, Shape{3, 5, 3, 3, 2}}) {
    auto qkv = random_vector(x.size(), 1, -2.0f, 2.0f);
    const auto want = rope_reference(qkv, x);
    rope_forward(qkv.data(), x.B, x.T, x.H, x.KV, x.D);
    EXPECT_TRUE(all_close(qkv, want, 1e-5, 1e-5))
        << "B " << x.B << " T " << x.T << " H " << x.H << " KV " << x.KV << " D " << x.D;
  }
  // another base (Llama 3's 500000)
  const Shape x{1, 50, 2, 2, 32};
  auto qkv = random_vector(x.size(), 2, -2.0f, 2.0f);
  const auto want = rope_reference(qkv, x, 500000.0);
  rope_forward(qkv.data(), x.B, x.T, x.H, x.KV, x.D, 500000.0f);
  EXPECT_TRUE(all_close(qkv, want, 1e-5, 1e-5));
}

TEST(CpuRope, RotatesHalvesNotInterleavedPairs) {
  // one q head of d 4 at position 1, x = e_0: the pair (0, 2) rotates by angle theta_0 = 1, so x becomes
  // cos(1) e_0 + sin(1) e_2 (the interleaved form would have moved it into e_1)
  const Shape x{1, 2, 1, 1, 4};
  std::vector<float> qkv(x.size(), 0.0f);
  qkv[head_offset(x, 0, 1, 0)] = 1.0f;
  rope_forward(qkv.data(), x.B, x.T, x.H, x.KV, x.D);
  const std::size_t at = head_offset(x, 0, 1, 0);
  EXPECT_FLOAT_EQ(qkv[at + 0], static_cast<float>(std::cos(1.0)));
  EXPECT_EQ(qkv[at + 1], 0.0f);
  EXPECT_FLOAT_EQ(qkv[at + 2], static_cast<float>(std::sin(1.0)));
  EXPECT_EQ(qkv[at + 3], 0.0f);
}

TEST(CpuRope, PositionZeroIsIdentityAndVIsNeverTouched) {
  const Shape x{2, 9, 4, 2, 8};
  const auto before = random_vector(x.size(), 3);
  for (const bool backward : {false, true}) {
    auto qkv = before;
    if (backward) {
      rope_backward(qkv.data(), x.B, x.T, x.H, x.KV, x.D);
    } else {
      rope_forward(qkv.data(), x.B, x.T, x.H, x.KV, x.D);
    }
    for (int b = 0; b < x.B; ++b) {
      for (int t = 0; t < x.T; ++t) {
        const std::size_t token = head_offset(x, b, t, 0);
        const std::size_t v_begin = head_offset(x, b, t, x.H + x.KV), v_end = token + x.row();
        const std::vector<float> v_got(qkv.begin() + v_begin, qkv.begin() + v_end);
        const std::vector<float> v_want(before.begin() + v_begin, before.begin() + v_end);
        EXPECT_TRUE(same_bits(v_got, v_want)) << "v of b " << b << " t " << t << (backward ? " (backward)" : "");
        const std::vector<float> qk_got(qkv.begin() + token, qkv.begin() + v_begin);
        const std::vector<float> qk_want(before.begin() + token, before.begin() + v_begin);
        if (t == 0) {  // cos 0 = 1 and sin 0 = 0 exactly: the very bits
          EXPECT_TRUE(same_bits(qk_got, qk_want)) << "q, k of b " << b << " t 0" << (backward ? " (backward)" : "");
        } else {  // and the other positions do move (the check above can fail)
          EXPECT_FALSE(same_bits(qk_got, qk_want)) << "q, k of b " << b << " t " << t;
        }
      }
    }
  }
}

TEST(CpuRope, KeepsEachHeadVectorsNorm) {
  const Shape x{2, 300, 2, 2, 32};
  const auto before = random_vector(x.size(), 4, -3.0f, 3.0f);
  auto qkv = before;
  rope_forward(qkv.data(), x.B, x.T, x.H, x.KV, x.D);
  for (int b = 0; b < x.B; ++b) {
    for (int t = 0; t < x.T; ++t) {
      for (int head = 0; head < x.H + x.KV; ++head) {
        const std::size_t at = head_offset(x, b, t, head);
        double norm_before = 0.0, norm_after = 0.0;
        for (int d = 0; d < x.D; ++d) {
          norm_before += static_cast<double>(before[at + d]) * before[at + d];
          norm_after += static_cast<double>(qkv[at + d]) * qkv[at + d];
        }
        EXPECT_NEAR(std::sqrt(norm_after), std::sqrt(norm_before), 1e-6 * std::sqrt(norm_before))
            << "b " << b << " t " << t << " head " << head;
      }
    }
  }
}

TEST(CpuRope, ScoresDependOnRelativePositionOnly) {
  // the same q and k vectors at every position: after the rotation q_t . k_t2 depends on t - t2 alone
  const Shape x{1, 64, 1, 1, 16};
  const auto q = random_vector(x.D, 5), k = random_vector(x.D, 6);
  std::vector<float> qkv(x.size(), 0.0f);
  for (int t = 0; t < x.T; ++t) {
    std::copy(q.begin(), q.end(), qkv.begin() + head_offset(x, 0, t, 0));
    std::copy(k.begin(), k.end(), qkv.begin() + head_offset(x, 0, t, 1));
  }
  rope_forward(qkv.data(), x.B, x.T, x.H, x.KV, x.D);
  const auto score = [&](int t, int t2) {
    double s = 0.0;
    for (int d = 0; d < x.D; ++d)
      s += static_cast<double>(qkv[head_offset(x, 0, t, 0) + d]) * qkv[head_offset(x, 0, t2, 1) + d];
    return s;
  };
  for (const int distance : {0, 1, 7, 30}) {
    for (const int t : {distance + 1, distance + 20, 63}) {
      EXPECT_NEAR(score(t, t - distance), score(distance, 0), 1e-5) << "t " << t << " distance " << distance;
    }
  }
  EXPECT_GT(std::abs(score(10, 0) - score(10, 9)), 1e-3);  // and the distance does matter
}

TEST(CpuRope, BackwardIsTheTranspose) {
  // <rope(x), y> = <x, rope_backward(y)> for random x, y; and rope_backward undoes rope_forward (R^T R = 1)
  const Shape x{2, 100, 4, 2, 16};
  const auto x_values = random_vector(x.size(), 7), y_values = random_vector(x.size(), 8);
  auto rotated_x = x_values, rotated_back_y = y_values;
  rope_forward(rotated_x.data(), x.B, x.T, x.H, x.KV, x.D);
  rope_backward(rotated_back_y.data(), x.B, x.T, x.H, x.KV, x.D);
  const double lhs = dot(rotated_x, y_values), rhs = dot(x_values, rotated_back_y);
  const double scale = std::sqrt(dot(x_values, x_values) * dot(y_values, y_values));
  EXPECT_NEAR(lhs, rhs, 1e-6 * scale);
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs));
  EXPECT_FALSE(all_close(rotated_x, x_values, 1e-3, 1e-3));  // the rotation did move x
  auto round_trip = rotated_x;
  rope_backward(round_trip.data(), x.B, x.T, x.H, x.KV, x.D);
  EXPECT_TRUE(all_close(round_trip, x_values, 1e-6, 1e-6));
}

TEST(CpuRope, PositionsDoNotDependOnSeqOrBatch) {
  // token t of a sequence of 10 gets the bits of token t of a sequence of 50, in any batch element
  const Shape longer{2, 50, 2, 1, 8}, shorter{1, 10, 2, 1, 8};
  const auto values = random_vector(longer.size(), 9);
  auto rotated_long = values;
  rope_forward(rotated_long.data(), longer.B, longer.T, longer.H, longer.KV, longer.D);
  for (int b = 0; b < longer.B; ++b) {
    const auto first = values.begin() + head_offset(longer, b, 0, 0);
    std::vector<float> rotated_short(first, first + shorter.size());
    rope_forward(rotated_short.data(), shorter.B, shorter.T, shorter.H, shorter.KV, shorter.D);
    const auto got = rotated_long.begin() + head_offset(longer, b, 0, 0);
    EXPECT_TRUE(same_bits(rotated_short, {got, got + shorter.size()})) << "batch element " << b;
  }
}

TEST(CpuRope, RejectsOddHeadDimAndBadSizes) {
  std::vector<float> qkv(4 * 7);
  for (const bool backward : {false, true}) {
    try {
      if (backward) {
        rope_backward(qkv.data(), 1, 1, 2, 1, 7);
      } else {
        rope_forward(qkv.data(), 1, 1, 2, 1, 7);
      }
      ADD_FAILURE() << "an odd head_dim was accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("rotary_dim % 2 == 0"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(backward ? "rope_backward" : "rope_forward"), std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(rope_forward(qkv.data(), 1, 1, 2, 0, 8), std::invalid_argument);
  EXPECT_THROW(rope_forward(qkv.data(), 1, 0, 2, 1, 8), std::invalid_argument);
  EXPECT_THROW(rope_forward(nullptr, 1, 1, 2, 1, 8), std::invalid_argument);
  EXPECT_THROW(rope_forward(qkv.data(), 1, 1, 1, 1, 2, 0.0f), std::invalid_argument);
  // a partial rotation must rotate whole pairs, within the head
  EXPECT_THROW(rope_forward(qkv.data(), 1, 1, 2, 1, 8, 10000.0f, 3), std::invalid_argument);
  EXPECT_THROW(rope_backward(qkv.data(), 1, 1, 2, 1, 8, 10000.0f, 10), std::invalid_argument);
  EXPECT_THROW(rope_forward(qkv.data(), 1, 1, 2, 1, 8, 10000.0f, -2), std::invalid_argument);
  // an odd head keeps an odd tail when the rotated part is even
  EXPECT_NO_THROW(rope_forward(qkv.data(), 1, 1, 2, 1, 7, 10000.0f, 4));
}

TEST(CpuRope, APartialRotationRotatesTheLeadingDimensionsAsAVectorOfTheirOwn) {
  // GPT-NeoX's rotary_pct = 0.25 of head dimension 96: 24 rotated as a 24-dimensional vector (theta_i = base^(-2i/24),
  // halves [0, 12) and [12, 24)), 72 passed through; v untouched. Equivalent: rotating a head of dimension 24 alone.
  const Shape x{2, 33, 3, 1, 96};
  const int rotary = 24;
  const auto qkv = random_vector(x.size(), 11, -1.5f, 1.5f);
  auto rotated = qkv;
  rope_forward(rotated.data(), x.B, x.T, x.H, x.KV, x.D, 10000.0f, rotary);
  const Shape narrow{1, x.T, 1, 1, rotary};  // one q head of dimension 24, as a reference vector per (b, head)
  for (int b = 0; b < x.B; ++b) {
    for (int head = 0; head < x.H + 2 * x.KV; ++head) {
      std::vector<float> alone(narrow.size(), 0.0f);
      for (int t = 0; t < x.T; ++t) {
        for (int i = 0; i < rotary; ++i) alone[t * narrow.row() + i] = qkv[head_offset(x, b, t, head) + i];
      }
      const std::vector<double> want = rope_reference(alone, narrow);
      for (int t = 0; t < x.T; ++t) {
        const std::size_t at = head_offset(x, b, t, head);
        for (int i = 0; i < x.D; ++i) {
          const bool rotated_part = head < x.H + x.KV && i < rotary;
          const double expected = rotated_part ? want[t * narrow.row() + i] : qkv[at + i];
          ASSERT_NEAR(rotated[at + i], expected, 2e-6 * (1 + std::abs(expected)))
              << "b " << b << " head " << head << " t " << t << " i " << i;
        }
      }
    }
  }
  // The backward is its transpose: <rope(x), y> = <x, rope_backward(y)>, and it undoes the forward.
  const auto y = random_vector(x.size(), 12, -1.0f, 1.0f);
  auto back_y = y;
  rope_backward(back_y.data(), x.B, x.T, x.H, x.KV, x.D, 10000.0f, rotary);
  EXPECT_NEAR(dot(rotated, y), dot(qkv, back_y), 1e-6 * x.size());
  auto round_trip = rotated;
  rope_backward(round_trip.data(), x.B, x.T, x.H, x.KV, x.D, 10000.0f, rotary);
  EXPECT_TRUE(all_close(round_trip, qkv, 1e-5f, 1e-5f));
  // rotary_dim = head_dim is the whole rotation, bit for bit
  auto whole = qkv, explicit_whole = qkv;
  rope_forward(whole.data(), x.B, x.T, x.H, x.KV, x.D);
  rope_forward(explicit_whole.data(), x.B, x.T, x.H, x.KV, x.D, 10000.0f, x.D);
  EXPECT_TRUE(same_bits(whole, explicit_whole));
}

}  // namespace
}  // namespace twin::kernels::cpu
