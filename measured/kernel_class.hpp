// What a kernel (GPU) or operator (CPU) of a real run is, from its name alone: the classes twin's cost model times
// (GEMMs, the attention core, norms, elementwise, embedding, loss, optimizer), collectives, and the classes a
// Transformer's Program has no op for (convolutions, copies, reductions, sorting). A name no rule knows stays
// Unclassified: reports list those by name, never drop them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/program/program.hpp"

namespace twin::measured {

enum class KernelClass : std::uint8_t {
  Gemm,           // cuBLAS / cuBLASLt / CUTLASS matrix multiplies, OpenBLAS sgemm (aten::mm, addmm, bmm, linear)
  Attention,      // FlashAttention and other fused attention kernels, the unfused attention's softmax
  Norm,           // layer norm, RMSNorm (and batch / group norm)
  Elementwise,    // bias, activation, dropout, residual adds, casts, fills
  Embedding,      // token / position lookups and their backward
  Loss,           // (log-)softmax cross-entropy
  Optimizer,      // Adam(W), SGD, the gradient-norm and multi-tensor kernels of an optimizer step
  Communication,  // NCCL (or gloo / MPI) collectives and point-to-point
  Convolution,    // cuDNN convolutions, implicit GEMMs, FFT and Winograd (no Transformer op)
  Copy,           // memcpy, memset, layout transposes, concatenation
  Reduction,      // sums, means, pooling, scans and sorts
  Unclassified,   // (keep it last)
};
inline constexpr std::size_t kKernelClassCount = static_cast<std::size_t>(KernelClass::Unclassified) + 1;

std::string_view to_string(KernelClass kind);  // "gemm", "attention", ..., "unclassified"

// The collective a communication kernel runs.
enum class CommKind : std::uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, SendRecv,
                                     Other };
std::string_view to_string(CommKind kind);

struct Classified {
  KernelClass kind = KernelClass::Unclassified;
  CommKind comm = CommKind::Other;  // for Communication
};

// A GPU kernel's class from its name (as CUPTI reports it: demangled C++ or a library's own kernel name).
Classified classify_kernel(std::string_view name);

// A CPU operator's class from its name (PyTorch's profiler on a CPU run: "aten::addmm", "aten::native_layer_norm",
// "Optimizer.step#AdamW.step", "autograd::engine::evaluate_function: GeluBackward0"); nullopt for a name that says
// nothing (a wrapper such as "aten::linear" or "aten::to", whose time its children explain).
std::optional<KernelClass> classify_cpu_op(std::string_view name);

// Which measured class twin's compute kind is timed as: the GEMM kinds as Gemm, attention_core as Attention, the
// layer norms as Norm, residuals and activations as Elementwise, and so on (TransformerLayer: nullopt, a fused op
// that a summary splits into its parts before it is compared).
std::optional<KernelClass> class_of(model::ComputeKind kind);

// Whether twin's Program has ops of this class (Convolution, Copy, Reduction and Unclassified it has not).
bool modelled_by_twin(KernelClass kind);

}  // namespace twin::measured
