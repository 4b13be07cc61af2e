#include "exec/cuda/cuda_exec.hpp"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <string>

#include <fmt/core.h>

#include "exec/core/errors.hpp"
#include "exec/cuda/cuda_backend.hpp"
#include "exec/cuda/staging_communicator.hpp"
#include "exec/shard/model_shard.hpp"
#include "kernels/cuda/check.cuh"
#include "model/ops/context_parallel_ring.hpp"
#ifdef TWIN_HAVE_NCCL
#include "exec/cuda/nccl_communicator.hpp"
#endif

namespace twin::exec::cuda {

namespace {

// The launcher's rank on this host, or -1 outside mpirun / srun.
int local_rank() {
  for (const char* variable :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(variable)) return std::atoi(value);
  }
  return -1;
}

// Whether no two ranks of the job share a GPU (same host, same device ordinal), asked over `host`.
bool every_rank_has_its_own_gpu(Communicator& host, int device) {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  // a 48-bit hash of the host name and the device ordinal, both exact in a double
  const double mine[2] = {static_cast<double>(std::hash<std::string>{}(name) & ((std::uint64_t{1} << 48) - 1)),
                          static_cast<double>(device)};
  CommGroup world{"world", {}};
  for (int r = 0; r < host.world_size(); ++r) world.members.push_back(r);
  std::vector<double> all(2 * static_cast<std::size_t>(host.world_size()));
  host.all_gather(world, mine, all.data(), 2, DType::F64, "GPU of every rank");
  std::set<std::pair<double, double>> seen;
  for (std::size_t r = 0; r < all.size(); r += 2) {
    if (!seen.insert({all[r], all[r + 1]}).second) return false;
  }
  return true;
}

}  // namespace

bool have_nccl() {
#ifdef TWIN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    cudaGetLastError();
    throw RunError(fmt::format("the cuda backend needs a GPU, and none is usable here ({})",
                               status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device"));
  }
  BackendOptions chosen = options;
  if (chosen.device == 0 && local_rank() >= 0) chosen.device = local_rank() % devices;
  if (chosen.device < 0 || chosen.device >= devices) {
    throw RunError(
        fmt::format("GPU {} does not exist: this host has {} (ordinals 0 to {})", chosen.device, devices, devices - 1));
  }
  return std::make_unique<CudaBackend>(chosen);
}

std::unique_ptr<Communicator> make_device_communicator(Communicator& host, Backend& backend,
                                                       const model::Program& program, double timeout_s) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return nullptr;
  DeviceContext& context = cuda->device_context();
#ifdef TWIN_HAVE_NCCL
  if (host.name() == "mpi" && every_rank_has_its_own_gpu(host, context.device())) {
    NcclOptions options;
    options.groups = collective_groups(program);
    options.pipeline_pairs = pipeline_pairs(program);
    options.deferral = DeferralRule::of(program.scenario.parallel.dp_overlap, program.scenario.shards_parameters());
    options.timeout_s = timeout_s;
    return std::make_unique<NcclCommunicator>(host, context, std::move(options));
  }
#else
  (void)program;
  (void)timeout_s;
#endif
  return std::make_unique<StagingCommunicator>(host, context);
}

std::vector<CommGroup> collective_groups(const model::Program& program) {
  std::set<std::pair<std::string_view, std::vector<int>>> groups;
  const model::RankLayout& layout = program.layout;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    for (const model::Op& op : program.ops_of_rank(rank)) {
      if (op.kind != model::OpKind::Collective) continue;
      groups.insert({model::to_string(op.group), layout.group_members(op.group, rank)});
    }
  }
  std::vector<CommGroup> sorted;
  for (const auto& [kind, members] : groups) sorted.push_back(CommGroup{kind, members});
  return sorted;
}

std::vector<std::pair<int, int>> pipeline_pairs(const model::Program& program) {
  std::set<std::pair<int, int>> pairs;
  const model::RankLayout& layout = program.layout;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    for (const model::Op& op : program.ops_of_rank(rank)) {
      if (op.kind != model::OpKind::Send) continue;
      if (op.group == model::Group::Context) {  // a CP ring's: to the next CP rank, not to a stage
        const std::vector<int> ring = layout.group_members(model::Group::Context, rank);
        const int cp_rank = layout.index_in_group(model::Group::Context, rank), cp = static_cast<int>(ring.size());
        pairs.insert({rank, ring[static_cast<std::size_t>(model::cp_ring_peer(op, cp_rank, cp))]});
        continue;
      }
      pairs.insert({rank, layout.rank_on_stage(rank, op.peer_stage)});
    }
  }
  return {pairs.begin(), pairs.end()};
}

}  // namespace twin::exec::cuda
