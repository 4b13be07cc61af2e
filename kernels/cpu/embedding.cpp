#include "kernels/cpu/embedding.hpp"

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/check.hpp"

namespace twin::kernels::cpu {

void embedding_forward(float* out, const int* tokens, const float* wte_local, int rows, int channels, int vocab_start,
                       int vocab_local) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0 && vocab_local > 0 && vocab_start >= 0);
  TWIN_KERNEL_CHECK(out != nullptr && tokens != nullptr && wte_local != nullptr);
  for (int r = 0; r < rows; ++r) {
    const int token = tokens[r];
    TWIN_KERNEL_CHECK(token >= 0);
    float* y = out + static_cast<std::size_t>(r) * channels;
    const int local = token - vocab_start;
    if (local >= 0 && local < vocab_local) {
      const float* row = wte_local + static_cast<std::size_t>(local) * channels;
      std::copy(row, row + channels, y);
    } else {
      std::fill(y, y + channels, 0.0f);  // another TP rank holds this token's row
    }
  }
}

void embedding_backward(float* dwte_local, const float* dout, const int* tokens, int rows, int channels,
                        int vocab_start, int vocab_local) {
  TWIN_KERNEL_CHECK(rows > 0 && channels > 0 && vocab_local > 0 && vocab_start >= 0);
  TWIN_KERNEL_CHECK(dwte_local != nullptr && dout != nullptr && tokens != nullptr);
  for (int r = 0; r < rows; ++r) {
    const int token = tokens[r];
    TWIN_KERNEL_CHECK(token >= 0);
    const int local = token - vocab_start;
    if (local < 0 || local >= vocab_local) continue;
    const float* dy = dout + static_cast<std::size_t>(r) * channels;
    float* dw = dwte_local + static_cast<std::size_t>(local) * channels;
    for (int c = 0; c < channels; ++c) dw[c] += dy[c];
  }
}

void position_embedding_forward(float* out, const float* wpe, int batch, int seq, int channels) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && channels > 0);
  TWIN_KERNEL_CHECK(out != nullptr && wpe != nullptr);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq; ++t) {
      float* y = out + (static_cast<std::size_t>(b) * seq + t) * channels;
      const float* w = wpe + static_cast<std::size_t>(t) * channels;
      for (int c = 0; c < channels; ++c) y[c] += w[c];
    }
  }
}

void position_embedding_backward(float* dwpe, const float* dout, int batch, int seq, int channels) {
  TWIN_KERNEL_CHECK(batch > 0 && seq > 0 && channels > 0);
  TWIN_KERNEL_CHECK(dwpe != nullptr && dout != nullptr);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq; ++t) {
      const float* dy = dout + (static_cast<std::size_t>(b) * seq + t) * channels;
      float* dw = dwpe + static_cast<std::size_t>(t) * channels;
      for (int c = 0; c < channels; ++c) dw[c] += dy[c];
    }
  }
}

}  // namespace twin::kernels::cpu
