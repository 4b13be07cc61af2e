// Token and position embeddings (GPT-2: x = wte[token] + wpe[position]).
// The word embedding is vocab-parallel (Megatron VocabParallelEmbedding): a TP rank holds rows
// [vocab_start, vocab_start + vocab_local) of wte, looks up only the tokens in that range, writes zeros for the
// others, and the executor sums the TP ranks' outputs (all-reduce). The position embedding is added after that sum
// (or on exactly one TP rank), else it would count tp times.
#pragma once

namespace twin::kernels::cpu {

// out (rows, channels) = wte_local[tokens[r] - vocab_start] if vocab_start <= tokens[r] < vocab_start + vocab_local,
//                        else 0
// wte_local (vocab_local, channels), tokens (rows) >= 0. Overwrites out.
void embedding_forward(float* out, const int* tokens, const float* wte_local, int rows, int channels, int vocab_start,
                       int vocab_local);

// dwte_local (vocab_local, channels) += scatter of dout (rows, channels) to the local rows of tokens (rows); other
// tokens are skipped. ACCUMULATES (and the tied LM head's matmul_backward accumulates into the same buffer).
// Rows are visited in order: deterministic even when a token repeats.
void embedding_backward(float* dwte_local, const float* dout, const int* tokens, int rows, int channels,
                        int vocab_start, int vocab_local);

// out (batch, seq, channels) += wpe (>= seq, channels) broadcast over batch: out[b, t, :] += wpe[t, :]
void position_embedding_forward(float* out, const float* wpe, int batch, int seq, int channels);

// dwpe (>= seq, channels) += sum over batch of dout (batch, seq, channels). ACCUMULATES.
void position_embedding_backward(float* dwpe, const float* dout, int batch, int seq, int channels);

}  // namespace twin::kernels::cpu
