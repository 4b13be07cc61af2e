#include "measured/program_work.hpp"

#include "model/ops/op_label.hpp"

namespace twin::measured {
namespace {

// An op-granularity compute op's kernels; a fused layer op's parts, each with its own.
void add_op(const model::Op& op, ProgramWork& work) {
  if (op.breakdown && !op.breakdown->parts.empty()) {
    for (const model::Op& part : op.breakdown->parts) add_op(part, work);
    return;
  }
  if (!op.breakdown || op.breakdown->kernels.empty()) {
    work.kernel_launches += 1;  // an op without its kernels: the cost model charges it one
    return;
  }
  const std::optional<KernelClass> cls = class_of(op.what);
  const std::string op_class = model::op_class(model::op_label(op));
  for (const model::Kernel& kernel : op.breakdown->kernels) {
    if (kernel.kind == model::KernelKind::Gemm) work.gemm_shape_by_op_class[op_class] = op.gemm;
    if (kernel.kind == model::KernelKind::Stream && cls == KernelClass::Gemm) {
      work.gemm_pass_bytes_by_op_class[op_class] = kernel.bytes;  // every layer's op of a class alike
    }
    work.kernel_launches += kernel.launches;
    const bool streams = kernel.kind == model::KernelKind::Stream ||
                         kernel.kind == model::KernelKind::AttentionPasses ||
                         kernel.kind == model::KernelKind::AttentionOperand;
    if (streams && cls) work.stream_bytes[*cls] += kernel.bytes;
  }
}

}  // namespace

ProgramWork program_work(const model::Program& program) {
  ProgramWork work;
  for (const model::Op& op : program.ops_of_rank(0)) {
    if (op.kind == model::OpKind::Compute) add_op(op, work);
  }
  return work;
}

}  // namespace twin::measured
