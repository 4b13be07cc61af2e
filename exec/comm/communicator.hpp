// Communicator: the collectives and point-to-point messages a Program needs, behind one interface.
//
//   threads  comm/threads_communicator.hpp  ranks are threads of one process; shared memory
//   mpi      comm/mpi_communicator.hpp      one process per rank (OpenMPI), launched by mpirun or srun
//   nccl     device buffers, bootstrapped over MPI
//
// Semantics every implementation keeps:
//   - every member of a group calls the same collectives in the same order (the Program guarantees it);
//   - sums are deterministic: element k of a reduction is ((x_0 + x_1) + x_2) + ... in group-index order, in the
//     buffer's dtype (f32 or f64), whatever the timing; so threads and mpi give the same bits;
//   - send copies the message and returns at once (buffered, never blocks); recv blocks until the message with that
//     tag from that peer has arrived (messages are matched by (peer, tag), not by order);
//   - a blocked call gives up after the timeout with a CommError naming the group, the call and the ranks that did
//     not arrive; when a rank fails, abort() makes every blocked peer fail at once with an error naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "exec/core/errors.hpp"  // CommError, PeerFailure
#include "exec/core/tensor.hpp"

namespace twin::exec {

struct CommGroup {
  std::string_view kind = "world";  // "tensor", "data", "embedding", "world": for messages and to keep groups apart
  std::vector<int> members;         // global ranks in group-index order
};

struct CommOptions {
  double timeout_s = 60;  // how long a collective or recv waits for its peers before failing
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // data (count) <- the sum over the members of their data (count); f32 or f64.
  virtual void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype,
                          std::string_view label) = 0;
  // out (count) <- chunk `my index` of the sum over the members of their in (members * count); out may be this
  // rank's own chunk of in (in place).
  virtual void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                              std::string_view label) = 0;
  // out (members * count), chunk i <- member i's in (count); in may be this rank's own chunk of out (in place).
  virtual void all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                          std::string_view label) = 0;
  // data (count) <- the data of the member at group index `root`
  virtual void broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                         std::string_view label) = 0;
  virtual void barrier(const CommGroup& group, std::string_view label) = 0;
  // Each member sends chunk j of its in to member j and receives member j's chunk for it into chunk j of its out; the
  // chunks lie back to back and differ in size (send_counts[j], recv_counts[j] elements: an MoE dispatch sends each
  // expert's tokens). Member j's send_counts[me] must equal this rank's recv_counts[j]; in and out do not overlap.
  // Any dtype (a copy, no sum).
  virtual void all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts,
                          void* out, const std::vector<std::size_t>& recv_counts, DType dtype,
                          std::string_view label) = 0;

  virtual void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) = 0;
  virtual void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) = 0;

  // This rank failed with `reason`: make every peer blocked on this rank fail fast (threads: a PeerFailure in each;
  // mpi: MPI_Abort, which ends the job).
  virtual void abort(std::string_view reason) = 0;
};

// "ranks 1, 3" for messages
std::string format_ranks(const std::vector<int>& ranks);
// `rank`'s index in `group` (model::index_in); throws CommError naming the group when it is not a member.
int index_in(const CommGroup& group, int rank);
// Where each chunk of an all-to-all buffer starts (elements): offsets[j] = counts[0] + ... + counts[j-1], and
// offsets[members] the total; throws CommError naming `rank`, the group and `label` unless counts has one entry per
// member.
std::vector<std::size_t> chunk_offsets(const CommGroup& group, int rank, const std::vector<std::size_t>& counts,
                                       std::string_view label);

}  // namespace twin::exec
