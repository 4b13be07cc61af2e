// One process per rank over MPI (OpenMPI), for `twin run --launcher mpi` or a job started by mpirun/srun.
// Collectives are built from non-blocking point-to-point messages so that they can time out (polling with a
// deadline, naming the ranks whose messages never came) and sum exactly like the threads communicator: member i
// receives chunk i from everyone, sums it in group-index order, then all-gathers the chunks. MPI's own reductions are
// not used: their order is the library's choice, and the threads and mpi launchers must give the same bits.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "exec/comm/communicator.hpp"
#include "model/ops/op.hpp"

namespace twin::exec {

// true when this build has MPI
bool have_mpi();

// Initialises MPI (once per process) and returns this process's communicator over MPI_COMM_WORLD. Throws CommError
// when built without MPI. Destroying it finalises MPI.
std::unique_ptr<Communicator> make_mpi_communicator(CommOptions options = {});

// Messages of any length between the processes of an MPI job, outside a Program: `twin search` and `twin sweep`
// spread their simulations over the ranks of an mpirun / srun job and gather what each rank found on rank 0.
// Nothing here waits for a peer: a rank that has died simply never answers, and the caller decides when to stop
// listening (mpirun ends the whole job when a rank dies unless started with --enable-recovery).
class MpiMailbox {
 public:
  virtual ~MpiMailbox() = default;  // finalises MPI once the posted messages have left (or after a few seconds)
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sends `message` to `peer` in the background (copied; never blocks).
  virtual void post(int peer, std::string message) = 0;
  // The next message from `peer`, if one has arrived (messages from one peer arrive in the order posted).
  virtual std::optional<std::string> take(int peer) = 0;
};

// Initialises MPI (once per process) for messages only. Throws CommError when built without MPI.
std::unique_ptr<MpiMailbox> open_mpi_mailbox();

// Ends the whole MPI job now (MPI_Abort) with `exit_code` as mpirun's exit status, printing nothing: for a rank that
// has already said why. Without MPI (or before it is loaded) it exits this process with that code.
[[noreturn]] void abort_mpi_job(int exit_code);

// Message tags a Program's sends and receives use (model::p2p_tag_key) are below this; MPI's tag space is limited.
inline constexpr std::uint64_t kMaxP2PTag = model::kP2PTagKeys;

}  // namespace twin::exec
