// Checked calls of the CUDA kernels and of everything built on them (exec/cuda): one macro per library, each reporting
// the failing call as written, the library's own message, and file:line, e.g.
//   "twin: CUDA error: out of memory (cudaErrorMemoryAllocation) in cudaMalloc(&data, bytes) at kernels/cuda/x.cu:12"
// and one precondition macro, the twin of kernels/cpu/check.hpp's TWIN_KERNEL_CHECK:
//   "twin::kernels::cuda::matmul_forward: precondition failed: rows > 0 (kernels/cuda/matmul.cu:120)"
// Library failures throw std::runtime_error (an internal error: the machine or the program is wrong), precondition
// failures std::invalid_argument (the caller is wrong). Both stay on in Release builds; they cost O(1) per call.
//
// This header is plain C++ (g++ compiles it in exec/cuda and in the tests) and includes only the CUDA runtime and
// cuBLAS headers. TWIN_NCCL_CHECK and TWIN_MPI_CHECK name NCCL's and MPI's functions only where they are used: include
// <nccl.h> or <mpi.h> before using them.
#pragma once

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace twin::kernels::cuda {

// "kernels/cuda/x.cu" rather than the build machine's absolute path
inline const char* repo_relative(const char* file) {
  for (const char* folder : {"kernels/", "exec/", "tests/", "bench/"}) {
    if (const char* in_repo = std::strstr(file, folder)) return in_repo;
  }
  return file;
}

[[noreturn]] inline void fail_library(const char* library, const std::string& message, const char* call,
                                      const char* file, int line) {
  throw std::runtime_error(std::string("twin: ") + library + " error: " + message + " in " + call + " at " +
                           repo_relative(file) + ":" + std::to_string(line));
}

[[noreturn]] inline void fail_precondition(const char* kernel, const char* condition, const char* file, int line) {
  throw std::invalid_argument(std::string("twin::kernels::cuda::") + kernel + ": precondition failed: " + condition +
                              " (" + repo_relative(file) + ":" + std::to_string(line) + ")");
}

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    fail_library("CUDA", std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")", call, file,
                 line);
  }
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail_library("cuBLAS", std::string(cublasLtGetStatusString(status)) + " (" + cublasLtGetStatusName(status) + ")",
                 call, file, line);
  }
}

}  // namespace twin::kernels::cuda

// TWIN_CUDA_CHECK(cudaMalloc(&p, n)): throw std::runtime_error when a CUDA runtime call fails.
#define TWIN_CUDA_CHECK(call) ::twin::kernels::cuda::check_cuda((call), #call, __FILE__, __LINE__)

// After every kernel launch: a bad launch configuration is reported here, an asynchronous fault at the next
// synchronizing call.
#define TWIN_CUDA_CHECK_LAUNCH() \
  ::twin::kernels::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// TWIN_CUBLAS_CHECK(cublasLtMatmul(...)): cuBLAS and cuBLASLt share cublasStatus_t.
#define TWIN_CUBLAS_CHECK(call) ::twin::kernels::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// TWIN_NCCL_CHECK(ncclAllReduce(...)): needs <nccl.h>.
#define TWIN_NCCL_CHECK(call)                                                                                        \
  do {                                                                                                               \
    const ncclResult_t twin_nccl_status_ = (call);                                                                   \
    if (twin_nccl_status_ != ncclSuccess) {                                                                          \
      ::twin::kernels::cuda::fail_library("NCCL", ncclGetErrorString(twin_nccl_status_), #call, __FILE__, __LINE__); \
    }                                                                                                                \
  } while (0)

// TWIN_MPI_CHECK(MPI_Bcast(...)): needs <mpi.h>. (MPI's default handler aborts before returning an error; this
// reports the errors that MPI_ERRORS_RETURN lets through.)
#define TWIN_MPI_CHECK(call)                                                                    \
  do {                                                                                          \
    const int twin_mpi_status_ = (call);                                                        \
    if (twin_mpi_status_ != MPI_SUCCESS) {                                                      \
      char twin_mpi_message_[MPI_MAX_ERROR_STRING] = {};                                        \
      int twin_mpi_length_ = 0;                                                                 \
      MPI_Error_string(twin_mpi_status_, twin_mpi_message_, &twin_mpi_length_);                 \
      ::twin::kernels::cuda::fail_library("MPI", twin_mpi_message_, #call, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)

// TWIN_CUDA_REQUIRE(cond): inside a kernel's host launcher, throw std::invalid_argument naming the launcher (__func__)
// and the condition when `cond` is false. Nothing is launched after a failed precondition.
#define TWIN_CUDA_REQUIRE(cond)                                                                 \
  do {                                                                                          \
    if (!(cond)) ::twin::kernels::cuda::fail_precondition(__func__, #cond, __FILE__, __LINE__); \
  } while (0)
