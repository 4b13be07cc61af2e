// One process per rank over MPI (OpenMPI), for `twin run --launcher mpi` or a job started by mpirun/srun.
// Collectives are built from non-blocking point-to-point messages so that they can time out (polling with a
// deadline, naming the ranks whose messages never came) and sum exactly like the threads communicator: member i
// receives chunk i from everyone, sums it in group-index order, then all-gathers the chunks. MPI's own reductions are
// not used: their order is the library's choice, and the threads and mpi launchers must give the same bits.
#pragma once

#include <memory>

#include "exec/comm/communicator.hpp"
#include "model/ops/op.hpp"

namespace twin::exec {

// true when this build has MPI
bool have_mpi();

// Initialises MPI (once per process) and returns this process's communicator over MPI_COMM_WORLD. Throws CommError
// when built without MPI. Destroying it finalises MPI.
std::unique_ptr<Communicator> make_mpi_communicator(CommOptions options = {});

// Ends the whole MPI job now (MPI_Abort) with `exit_code` as mpirun's exit status, printing nothing: for a rank that
// has already said why. Without MPI (or before it is loaded) it exits this process with that code.
[[noreturn]] void abort_mpi_job(int exit_code);

// Message tags a Program's sends and receives use (model::p2p_tag_key) are below this; MPI's tag space is limited.
inline constexpr std::uint64_t kMaxP2PTag = model::kP2PTagKeys;

}  // namespace twin::exec
