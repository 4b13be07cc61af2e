// The routed experts' GEMMs in FP8 (model::runs_in_fp8: ExpertUp, ExpertDown), as Transformer Engine's GroupedLinear
// runs them under Megatron-Core's TEGroupedMLP (transformer_engine/pytorch/module/grouped_linear.py, v2.x): one
// quantizer per expert, so each local expert's input rows are quantized for its own GEMM (their own amax under
// tensorwise scaling), each expert's weight is its own FP8 tensor (its own delayed scale and amax history, cached for
// the iteration), and backward each expert's output gradient is quantized on its own. An expert is a linear layer of
// its own here: Fp8Linear's GEMM, keyed by its global index (Fp8State, kExpertTensors). An expert that received no
// row runs no GEMM and records no amax, on every plan alike (the routing is the same).
//
// Delayed scaling reduces each expert's amaxes by its global index over the amax group (Fp8State::pending lists
// every global expert of a layer, 0 where a rank holds none, and whether any replica of it saw rows), so that a plan
// whose EP ranks hold other experts, or whose replicas of an expert saw other rows, scales each expert as one rank
// would; Transformer Engine reduces its amax buffer by position, which under expert
// parallelism lines up local expert i of one rank with local expert i of another.
#include "exec/core/check.hpp"
#include "exec/interpreter/fp8_linear.hpp"

namespace twin::exec {

namespace {

std::size_t elements(int rows, int width) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
}

// Calls gemm(g, first_row, rows) for each local expert g that received rows, its rows starting at first_row of the
// expert-major rows.
template <typename Gemm>
void for_each_expert_with_rows(const model::Op& op, const std::vector<int>& rows_per_expert, Gemm gemm) {
  int row = 0;
  for (std::size_t g = 0; g < rows_per_expert.size(); ++g) {
    const int rows = rows_per_expert[g];
    TWIN_EXEC_CHECK(rows >= 0, "layer {}: local expert {} has {} rows", op.layer, g, rows);
    if (rows > 0) gemm(g, row, rows);
    row += rows;
  }
}

}  // namespace

void Fp8Linear::grouped_forward(const model::Op& op, const Tensor& out, const Tensor& inp, const Tensor& weights,
                                const std::vector<int>& rows_per_expert, int first_expert, int in_features,
                                int out_features) {
  state_.experts_ran(op, first_expert, static_cast<int>(rows_per_expert.size()));
  const std::size_t weight = elements(out_features, in_features);
  for_each_expert_with_rows(op, rows_per_expert, [&](std::size_t g, int row, int rows) {
    const int expert = first_expert + static_cast<int>(g);
    const Fp8GemmOperands q = state_.operands(op, expert);
    state_.record(op,
                  ctx_.backend.fp8_kernels().fp8_matmul_forward(
                      out.slice(elements(row, out_features), elements(rows, out_features)),
                      inp.slice(elements(row, in_features), elements(rows, in_features)),
                      weights.slice(g * weight, weight), Tensor{}, rows, in_features, out_features, q.input, q.weight),
                  expert);
  });
}

void Fp8Linear::grouped_backward(const model::Op& op, const Tensor& dinp, const Tensor& dweights, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weights, const std::vector<int>& rows_per_expert,
                                 int first_expert, int in_features, int out_features) {
  state_.experts_ran(op, first_expert, static_cast<int>(rows_per_expert.size()));
  const std::size_t weight = elements(out_features, in_features);
  for_each_expert_with_rows(op, rows_per_expert, [&](std::size_t g, int row, int rows) {
    const int expert = first_expert + static_cast<int>(g);
    const Fp8GemmOperands q = state_.operands(op, expert);
    const Tensor dinp_rows =
        dinp.empty() ? Tensor{} : dinp.slice(elements(row, in_features), elements(rows, in_features));
    state_.record(op,
                  ctx_.backend.fp8_kernels().fp8_matmul_backward(
                      dinp_rows, dweights.slice(g * weight, weight), Tensor{},
                      dout.slice(elements(row, out_features), elements(rows, out_features)),
                      inp.slice(elements(row, in_features), elements(rows, in_features)),
                      weights.slice(g * weight, weight), rows, in_features, out_features, q.input, q.weight,
                      q.gradient),
                  expert);
  });
}

}  // namespace twin::exec
