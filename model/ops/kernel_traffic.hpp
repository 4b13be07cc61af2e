// What the framework's kernels move and launch around one micro-batch on one rank: the sizes of its tensors (Shapes)
// and, per element, the bytes of each elementwise kernel and how many launches it takes, for the framework of the
// scenario (Megatron-LM, DeepSpeed, Composer; fused or unfused kernels; dropout). The ops of layer_ops.hpp read them.
#pragma once

#include <cstdint>

#include "model/ops/op.hpp"
#include "model/plan/rank_shapes.hpp"
#include "model/scenario/counts.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::model {

// Bytes per weight element the framework moves to accumulate one micro-batch's weight gradient, averaged over the
// iteration's micro-batches (see kernel_traffic.cpp), and the kernels it takes.
double gradient_accumulation_bytes(const Scenario& scenario);
int gradient_accumulation_launches(const Scenario& scenario);

// Sizes of one micro-batch on one rank: RankShapes (model/plan/rank_shapes.hpp) in doubles, as the cost formulas take
// them, and the framework's choices that decide the kernels' bytes.
struct Shapes {
  RankShapes rank;            // the integer widths the fields below are views of
  double seq, batch, tokens;  // tokens = micro_batch * seq_len / cp: the rank's part of the micro-batch
  double cp;                  // parallel.cp: the ranks that split each sequence (model/ops/context_parallel.hpp)
  CpComm cp_comm;             // framework.cp_comm: how they exchange around the attention core
  double seq_local;           // seq / cp: the queries of one sequence on this rank (two chunks of seq / 2 cp)
  double tokens_sp;           // tokens a rank holds outside the TP region: tokens / t with sequence parallelism
  double h, f, vocab_local, t, e;
  double heads_local, head_dim;
  double kv_heads_local;  // key/value heads on this rank (grouped-query attention; heads_local without it)
  double qkv_local;       // the QKV projection's output width on this rank: (heads_local + 2 kv_heads_local) d
  double up_local;        // the MLP-up projection's output width on this rank: f / t, twice that for SwiGLU
  bool sequence_parallel;
  bool tensor_comm;  // tp > 1: TP collectives exist
  bool dropout;      // framework.dropout: dropout kernels run and write 1-byte (torch.bool) masks
  bool fused;        // framework.fused_kernels: Megatron's fused elementwise kernels
  bool alibi;        // model.position_embedding = "alibi": a bias on the scores, no position embedding
  bool composer;     // framework.name = "composer": PyTorch's own kernels (MosaicML's MPT blocks), below
  bool flash;        // framework.attention = "flash1" | "flash2": one fused attention kernel per pass
  bool rope;         // model.position_embedding = "rope": queries and keys rotated by position
  bool swiglu;       // model.activation = "swiglu": silu(gate) * up
  bool bias;         // model.linear_bias: the linear layers' biases (added by the elementwise kernels after them)
  bool fp8;          // model.fp8: the GEMMs runs_in_fp8 names run in FP8 (compute_ops.cpp, fp8_gemm_kernels)
  Fp8Recipe fp8_recipe;
  double micro_batches;  // per pipeline: what a once-per-iteration cost is spread over (FP8 weight casts)
  bool parallel;         // model.parallel_residual: attention and MLP side by side on the layer input, one residual add
  bool shared_norm;      // model.shared_norm: one layer norm feeds both branches
  double accumulation_bytes_per_weight;  // gradient_accumulation_bytes: after each weight-gradient GEMM
  int accumulation_launches;

  explicit Shapes(const Scenario& s) : Shapes(s, rank_shapes(s)) {}
  Shapes(const Scenario& s, const RankShapes& r) : rank(r) {
    seq = d(r.seq_len);
    batch = d(r.micro_batch);
    cp = d(s.parallel.cp);
    cp_comm = s.framework.cp_comm;
    seq_local = d(r.seq_local);
    tokens = d(r.tokens);
    t = d(s.parallel.tp);
    sequence_parallel = r.sequence_parallel;
    // The average, not r.tokens_sp: the rules ask seq_len, not seq_len / cp, to be divisible by tp under sequence
    // parallelism, so with cp > 1 a rank's share may be fractional; the simulator has always costed that average.
    tokens_sp = sequence_parallel ? tokens / t : tokens;
    h = d(r.hidden);
    f = d(r.ffn);
    vocab_local = d(r.vocab_local);
    e = dtype_bytes(s.model.dtype);
    heads_local = d(r.heads_local);
    head_dim = d(r.head_dim);
    kv_heads_local = d(r.kv_heads_local);
    qkv_local = d(r.qkv_local);
    up_local = d(r.up_local);
    tensor_comm = s.parallel.tp > 1;
    dropout = s.framework.dropout;
    fused = s.framework.fused_kernels;
    alibi = s.model.position_embedding == PositionEmbedding::Alibi;
    composer = s.framework.name == Framework::Composer;
    flash = s.framework.attention != AttentionKind::Unfused;
    rope = s.model.position_embedding == PositionEmbedding::Rope;
    swiglu = s.model.activation == Activation::Swiglu;
    bias = s.model.linear_bias;
    parallel = s.model.parallel_residual;
    shared_norm = s.model.shared_norm;
    accumulation_bytes_per_weight = gradient_accumulation_bytes(s);
    accumulation_launches = gradient_accumulation_launches(s);
    fp8 = s.model.fp8 != Fp8Format::None;
    fp8_recipe = s.framework.fp8_recipe;
    micro_batches = d(std::max<std::int64_t>(1, s.parallel.micro_batches()));
  }

  // Memory traffic per element of the elementwise kernels (framework.fused_kernels, framework.dropout), in bytes. A
  // dropout mask is a torch.bool tensor: one byte per element. Megatron-LM (megatron/model/transformer.py,
  // fused_bias_gelu.py, fused_softmax.py) fuses bias + dropout + residual add (read x and residual, write out
  // [+ mask]), bias + GeLU (read, write) and scale + causal mask + softmax (read, write); unfused, each operation is
  // its own pass.
  //
  // Composer (MosaicML's MPT block, llm-foundry / examples of 2023: x = x + dropout(out_proj(attn(ln_1(x)))), then
  // the same with the MLP) runs PyTorch's kernels: every nn.Linear adds its bias in the GEMM's epilogue (addmm on
  // the flattened input, cuBLASLt's bias epilogue in PyTorch 1.13) and sums its bias gradient from the output
  // gradient in the backward (read e per output element, counted on the GEMM op); the residual is a plain add (read
  // two, write one) after nn.Dropout, which at p = 0 returns its input and launches nothing; its backward is
  // autograd's accumulation of the two gradients that meet at the fork (read two, write one). nn.GELU
  // (approximate = 'none') reads and writes once forward, reads dy and x and writes dx backward.
  // `branches`: the branches whose output the op adds to the stream, 1, or 2 for a parallel block's one residual op
  // (after the all-reduce of both branches' summed partials: both biases, one dropout, one add of x).
  double residual_forward(int branches = 1) const {  // bias + dropout + residual add (unfused: each bias a pass)
    const double mask = dropout ? 1 : 0;
    if (composer) return 3 * e + (dropout ? 2 * e + mask : 0);
    return fused ? 3 * e + mask : (bias ? branches * 2 * e : 0) + (dropout ? 2 * e + mask : 0) + 3 * e;
  }
  // Backward, in every framework: autograd's accumulation of the two gradients that meet where the residual stream
  // forks into the layer norm and the residual add (torch/csrc/autograd/input_buffer.cpp: one add, read two, write
  // one); Megatron's also dropout's backward (read dy and mask, write dx) and the bias gradient (read dx), Composer's
  // dropout backward (its biases' gradients are on their GEMMs). A parallel block's input reaches both layer norms
  // and the residual add: two accumulations, as two sequential forks, and both biases' gradients read dy.
  double residual_backward(int branches = 1) const {
    const double accumulate = branches * 3 * e;
    if (composer) return accumulate + (dropout ? 2 * e + 1 : 0);
    return accumulate + (dropout ? 2 * e + 1 : 0) + (bias ? branches * e : 0);
  }
  // unfused: bias add, then GeLU
  double gelu_forward() const { return composer || fused || !bias ? 2 * e : 4 * e; }
  // read dy and x, write dx (, read dx again for the bias gradient)
  double gelu_backward() const { return composer || !bias ? 3 * e : 4 * e; }
  // SwiGLU per output element (Megatron-Core's bias_swiglu_impl, fused by TorchScript / its fused_kernels): forward
  // reads the gate and up halves and writes silu(gate) * up; backward reads them and dy and writes both halves'
  // gradients. Unfused (F.silu, then the product): forward silu reads and writes the gate, the product reads two and
  // writes one; backward the product's reads dy and both factors and writes two, silu's reads and writes one more.
  double swiglu_forward() const { return fused ? 3 * e : 5 * e; }
  double swiglu_backward() const { return fused ? 5 * e : 8 * e; }
  // Megatron's fused layer norm (megatron/fused_kernels/layer_norm_cuda_kernel.cu, also what Megatron-DeepSpeed
  // runs): the forward reads x and writes y (its second pass over a row hits the cache); the backward
  // (HostLayerNormGradient) reads dy and x in cuComputePartGradGammaBeta for the weight gradients, and again in
  // cuComputeGradInput, which writes dx: 5 e bytes per element, in 3 kernels.
  // PyTorch's own layer norm (Composer's LPLayerNorm calls F.layer_norm in the model dtype with autocast off) moves
  // the same: its vectorized forward reads x once and writes y, its backward computes dx (reading dy and x) and,
  // in a second kernel, the weight and bias gradients (reading them again).
  double layer_norm_forward() const { return 2 * e; }
  double layer_norm_backward() const { return 5 * e; }
  // Attention scores (b * heads/t * s^2 elements) beyond what the two batched GEMMs read and write: softmax (fused:
  // one pass; unfused: scale, mask, softmax), then attention dropout (read, write, mask); backward likewise.
  // Megatron's fused causal softmax (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h) reads only the
  // row's unmasked elements, the lower triangle with its diagonal ((s + 1) / 2s of them), and writes the whole row
  // (zeros above the diagonal); its backward reads dy and y in the lower triangle and writes the whole dx.
  double causal_fraction() const { return (seq + 1) / (2 * seq); }
  double scores_forward() const { return (fused ? (causal_fraction() + 1) * e : 6 * e) + (dropout ? 2 * e + 1 : 0); }
  double scores_backward() const {
    return (fused ? (2 * causal_fraction() + 1) * e : 7 * e) + (dropout ? 2 * e + 1 : 0);
  }
  // Vocab-parallel cross-entropy per logit, as megatron/mpu/cross_entropy.py runs it (2019-2022, also in
  // Megatron-DeepSpeed) on output.float() (gpt_model.py: fp16_lm_cross_entropy is off by default). Forward: the
  // cast (read e, write 4; none in fp32), max (read 4), sub_ (read 4, write 4), exp (read 4, write 4), sum (read 4),
  // div_ into the saved softmax (read 4, write 4). Backward: mul_ by the loss gradient (read 4, write 4), then the
  // cast's backward to the model dtype (read 4, write e). The per-token gathers and masks are negligible.
  //
  // Composer's MPT (examples/llm, April 2023) takes the loss with flash-attention's fused cross-entropy
  // (xentropy_cuda_lib, v0.2.8, label smoothing 0) on the model-dtype logits: forward reads each row twice (max and
  // sum, then the sum of exponentials) and writes two floats a row; backward reads the logits and writes a new
  // gradient. After every micro-batch's backward Composer also updates its two training metrics
  // (LanguageCrossEntropy and LanguagePerplexity, composer/metrics/nlp.py of v0.13.3), each a
  // torch.nn.CrossEntropyLoss(reduction = 'sum') over the same logits under no_grad and autocast: log_softmax in the
  // model dtype (cunn_SoftMaxForward: read the row three times, write it) and nll_loss's autocast cast of it to fp32
  // (read e, write 4).
  double cast_to_fp32() const { return e == 4 ? 0 : e + 4; }
  double cross_entropy_forward() const {
    if (composer) return 2 * e + 2 * (4 * e + cast_to_fp32());
    return cast_to_fp32() + 4 + 8 + 8 + 4 + 8;
  }
  double cross_entropy_backward() const {
    if (composer) return 2 * e;
    return 8 + (e == 4 ? 0 : 4 + e);
  }

  // Kernels the elementwise ops launch (framework.fused_kernels, framework.dropout; `phase` Recompute runs the
  // forward's). Composer runs PyTorch's: the layer norm's backward in two (dx; the weight and bias gradients), the
  // embedding's lookups and add (backward: both tables' fill, pass and rows, then the tied head's add), the loss's
  // fused cross-entropy and the two training metrics' cast, log_softmax and nll_loss each (their small kernels
  // aside), a residual add and its dropout.
  int layer_norm_launches(Phase phase) const {  // Megatron's: backward partial weight gradients, their sum, dx
    return phase != Phase::Backward ? 1 : composer ? 2 : 3;
  }
  int embedding_launches(Phase phase) const { return composer ? (phase != Phase::Backward ? 3 : 2 * 3 + 1) : 1; }
  // A parallel block's one residual op adds both branches' biases and takes both forks' gradient accumulations.
  int residual_launches(Phase phase, int branches = 1) const {
    if (composer) return dropout ? 2 : 1;
    if (phase == Phase::Backward) return branches;
    return fused ? 1 : (bias ? branches : 0) + (dropout ? 1 : 0) + 1;  // bias adds, dropout, add
  }
  int gelu_launches(Phase phase) const {  // unfused forward: bias add, GeLU
    return composer || fused || phase == Phase::Backward || !bias ? 1 : 2;
  }
  int swiglu_launches() const { return composer || fused ? 1 : 2; }  // silu, the product (and their backwards)
  int cross_entropy_launches(Phase phase) const {  // cast, max, sub, exp, sum, div; backward mul, cast
    const int cast = e == 4 ? 0 : 1;
    if (composer) return phase != Phase::Backward ? 1 + 2 * 2 : 1;
    return phase != Phase::Backward ? 5 + cast : 1 + cast;
  }
  // The unfused attention core's kernels besides its GEMMs: softmax (fused scale + mask + softmax, or three passes),
  // dropout, one layout copy (the context's permute forward, the Q/K/V gradients' concatenation backward) and, with
  // ALiBi, the bias's expansion into the scores (forward).
  int attention_pass_launches(Phase phase) const {
    return (fused ? 1 : 3) + (dropout ? 1 : 0) + 1 + (alibi && phase != Phase::Backward ? 1 : 0);
  }
};

}  // namespace twin::model
