// NCCL between GPUs, one process per GPU (mpirun / srun), bootstrapped over the job's host communicator (MPI).
//
//   collectives  one NCCL communicator per CommGroup, created when the group first communicates: member 0's unique
//                id is broadcast over the host communicator, then ncclCommInitRank (all members reach that point
//                together, as every collective requires). Each has its own stream, which first waits for the work
//                already on the rank's compute stream; the compute stream then waits for the collective, so the
//                interpreter sees a finished call. Under dp_overlap the "data" group's gradient reductions
//                (all-reduce, reduce-scatter) are deferred instead: the compute stream goes on with the backward and
//                waits only before it reads gradients (norm, AdamW), hands data to the host, or before another
//                collective (DeviceContext::wait_deferred).
//   P2P          one two-rank NCCL communicator and stream per (sender, receiver) pair, created when this object is
//                built, for every pair of the job in one global order (so the blocking inits cannot deadlock). A send
//                copies the message (buffered: it returns at once, the caller may free or overwrite its buffer) and
//                sends a (tag, bytes) header then the payload inside one ncclGroupStart/End; a receive reads headers in
//                arrival order and keeps the messages of other tags until asked for: messages are matched by tag,
//                never by order, as the Program's semantics require. A receive waits at most the timeout, then fails
//                naming the peer.
//   host memory  calls on host pointers (the trainer's loss sums, the gradient norm) go to the host communicator.
//
// NCCL sums in its own order (ring or tree): results are deterministic for a given job shape, but their bits differ
// from the threads and mpi communicators'. NCCL refuses two ranks on one GPU: make_device_communicator
// (cuda_exec.hpp) uses the StagingCommunicator then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/comm/communicator.hpp"
#include "exec/cuda/device_context.hpp"

namespace twin::exec::cuda {

struct NcclOptions {
  std::vector<std::pair<int, int>> pipeline_pairs;  // every (sender, receiver) of the job, the same list on every rank
  bool overlap_data_parallel = false;               // the scenario's dp_overlap
  double timeout_s = 60;                            // a receive waiting longer fails
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& host, DeviceContext& context, NcclOptions options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return host_.rank(); }
  int world_size() const override { return host_.world_size(); }

  void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype, std::string_view label) override;
  void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                      std::string_view label) override;
  void all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                  std::string_view label) override;
  void broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                 std::string_view label) override;
  void barrier(const CommGroup& group, std::string_view label) override;
  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) override;
  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) override;
  void abort(std::string_view reason) override;

  struct Channel;  // an NCCL communicator with its stream (nccl_communicator.cpp)

 private:
  Channel& group_channel(const CommGroup& group);
  Channel& pair_channel(int from, int to, std::string_view label);
  // `enqueue(channel)` issues NCCL calls on the channel's stream after the compute stream's current work; the compute
  // stream then waits for them (or defers that wait).
  template <class Enqueue>
  void run(Channel& channel, bool deferred, std::string_view what, std::vector<ByteRange> memory, Enqueue&& enqueue);
  bool deferred(const CommGroup& group) const;
  // a received (tag, bytes) header, read on the host
  struct Header {
    std::uint64_t tag = 0, bytes = 0;
  };
  Header next_header(Channel& channel, int peer, std::uint64_t wanted_tag, std::string_view label);

  Communicator& host_;
  DeviceContext& context_;
  NcclOptions options_;
  std::map<std::pair<std::string, std::vector<int>>, std::unique_ptr<Channel>> groups_;
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> pairs_;
  struct Stashed {  // a message that arrived before its receive was asked for
    void* data = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t ready = nullptr;
  };
  std::multimap<std::pair<int, std::uint64_t>, Stashed> stash_;  // by (peer, tag), in arrival order
};

}  // namespace twin::exec::cuda
