// FP8 linear layers (model.fp8): the GEMMs of a transformer layer that model::runs_in_fp8 names, with their operands
// quantized as the recipe says, and the amax reductions the Program carries for them (fp8_linear.cpp says how). It
// owns the rank's FP8 state: delayed scaling's scales and amaxes (Fp8State, fp8_state.hpp), and the reduced amaxes of
// tensorwise scaling's sequence-parallel inputs between their reduction and their GEMM.
#pragma once

#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "exec/interpreter/fp8_state.hpp"
#include "exec/interpreter/rank_context.hpp"

namespace twin::exec {

class Fp8Linear;

// The GEMM of linear op `op`: through `fp8` where model::runs_in_fp8 names the op's GEMM (`fp8` is the interpreter's
// runner, never null under model.fp8), else the backend's 16-bit matmul: the dense layers' and the shared experts'.
void linear_gemm_forward(RankContext& ctx, Fp8Linear* fp8, const model::Op& op, const Tensor& out, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, int rows, int in_features, int out_features);
void linear_gemm_backward(RankContext& ctx, Fp8Linear* fp8, const model::Op& op, const Tensor& dinp,
                          const Tensor& dweight, const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight, int rows, int in_features, int out_features);

class Fp8Linear {
 public:
  explicit Fp8Linear(RankContext& ctx) : ctx_(ctx), state_(ctx.scenario) {}

  // The GEMM of compute op `op` in FP8: matmul_forward's and matmul_backward's arguments and results.
  void forward(const model::Op& op, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
               int rows, int in_features, int out_features);
  void backward(const model::Op& op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features);
  // A zero-bubble schedule's B of the same (op.defers_weight_grad): the output gradient quantized and its amax
  // recorded, dX (and the bias gradient); returns the operands' quantization, which its W takes.
  Fp8GemmOperands backward_input(const model::Op& op, const Tensor& dinp, const Tensor& dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight, int rows, int in_features, int out_features);
  // Its W: dW += the wgrad GEMM of what B kept, quantized as B quantized it; records nothing (B recorded the amax).
  void backward_weight(const Fp8GemmOperands& q, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                       const Tensor& weight, int rows, int in_features, int out_features);
  // A grouped expert GEMM (ExpertUp, ExpertDown; fp8_experts.cpp): each local expert's rows of `inp` (expert-major,
  // rows_per_expert of them) against its own weight of `weights` (local experts x out x in), each expert with its own
  // scales and amaxes; `first_expert`: the global index of local expert 0. Backward accumulates into `dweights`.
  void grouped_forward(const model::Op& op, const Tensor& out, const Tensor& inp, const Tensor& weights,
                       const std::vector<int>& rows_per_expert, int first_expert, int in_features, int out_features);
  void grouped_backward(const model::Op& op, const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                        const Tensor& inp, const Tensor& weights, const std::vector<int>& rows_per_expert,
                        int first_expert, int in_features, int out_features);
  void reduce_amaxes(const model::Op& op);  // Fp8Amax: delayed scaling's regions, tensorwise's SP inputs
  void begin_iteration() { state_.begin_iteration(); }

  Fp8State& state() { return state_; }
  const Fp8State& state() const { return state_; }

 private:
  // values (n) <- their elementwise maximum over `g`
  void max_over(model::Group g, std::vector<float>& values, std::string_view label);

  RankContext& ctx_;
  Fp8State state_;
  std::map<std::pair<int, int>, float> input_amaxes_;  // tensorwise SP: reduced input amaxes by (layer, GEMM)
};

}  // namespace twin::exec
