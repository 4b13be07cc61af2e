// What the rest of exec/ calls to run on GPUs (compiled only when the CUDA toolkit is found: TWIN_HAVE_CUDA):
//
//   make_cuda_backend         `--backend cuda`: exec/train/backend_factory.cpp's make_backend("cuda", ...) returns it
//   make_device_communicator  the communicator the interpreter uses with that backend, wrapping the launcher's host
//                             communicator: NCCL when every rank of the job has a GPU of its own (mpi launcher, one
//                             process per GPU, built with NCCL), else device buffers staged through the host
//                             communicator (threads launcher: ranks sharing one GPU)
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/comm/communicator.hpp"
#include "exec/core/backend.hpp"
#include "model/program/program.hpp"

namespace twin::exec::cuda {

// The CUDA backend on options.device; when the process was started by mpirun or srun and options.device is 0, on
// (local rank) % (GPUs on this host) instead, so that the ranks of one node spread over its GPUs. Throws RunError
// when no GPU is usable.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// nullptr unless `backend` is a CUDA backend (then use `host` as it is).
std::unique_ptr<Communicator> make_device_communicator(Communicator& host, Backend& backend,
                                                       const model::Program& program, double timeout_s);

// Every group the Program's collectives run on (kind and members), sorted: the same list on every rank. The
// interpreter builds its groups alike (model::RankLayout::group_members).
std::vector<CommGroup> collective_groups(const model::Program& program);

// Every (sender, receiver) pair of global ranks that the Program's sends connect (the pipeline's, and a CP ring's from
// each CP rank to the next), sorted: the same list on every rank.
std::vector<std::pair<int, int>> pipeline_pairs(const model::Program& program);

// true when this build has NCCL
bool have_nccl();

// model.fp8 on the cuda backend: cuBLASLt's FP8 GEMMs need sm_90 or later. The refusal for a GPU of compute capability
// 10 * major + minor ("" from sm_90 on), and the check the trainer makes before a run (nothing for other backends).
std::string fp8_gemm_refusal(int compute_capability);
void require_fp8_gemms(const Backend& backend, const std::string& source);

}  // namespace twin::exec::cuda
