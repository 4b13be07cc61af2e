// NCCL between GPUs, one process per GPU (mpirun / srun), bootstrapped over the job's host communicator (MPI).
//
//   set-up       every NCCL communicator the Program needs is created when this object is built, before any
//                kernel runs: one per collective group, and one per (sender, receiver) pair of the pipeline, each
//                rank walking the job's whole list in one global order (so the unique-id broadcasts over the host
//                communicator cannot cross). Communicators are non-blocking (ncclConfig_t::blocking = 0): their
//                initialisation proceeds together and is awaited within the timeout. A call on a group or pair
//                outside the Program's is an error, never a late ncclCommInitRank with kernels in flight.
//   collectives  each group has its own stream, which first waits for the work already on the rank's compute
//                stream; the compute stream then waits for the collective, so the interpreter sees a finished call.
//                Under dp_overlap the "data" group's gradient reductions (DeferralRule) are deferred instead: the
//                compute stream goes on and waits only before it reads gradients, hands data to the host, touches
//                their memory, or before another collective (DeviceContext).
//   P2P          one two-rank communicator and stream per (sender, receiver) pair. A send passes the caller's buffer
//                to ncclSend as it is (no copy, no allocation): the compute stream's next touch of that memory, and
//                the buffer's release, wait for the send (DeviceContext::hold). Its (tag, bytes) header goes over
//                the host communicator (buffered, tag-matched, with the host's timeouts and aborts) on one reserved
//                tag, in send order; a receive reads headers in that order, keeps the payloads of other tags (in
//                stream-ordered scratch) until asked for, and receives its own straight into the caller's buffer:
//                messages are matched by tag, never by order, and no host thread polls the device for them.
//   failures     a watchdog thread (exec/comm/watchdog.hpp) follows every NCCL call issued: one that has not
//                finished within the timeout, or an error ncclCommGetAsyncError reports, aborts every NCCL
//                communicator of the rank (ncclCommAbort: their kernels end, host waits return) and is recorded in
//                the DeviceContext, whose next host wait, like the next call here, throws CommError with the story.
//                abort() aborts them too before the host communicator's abort.
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
#include "exec/comm/deferred_work.hpp"
#include "exec/comm/watchdog.hpp"
#include "exec/cuda/device_context.hpp"

namespace twin::exec::cuda {

struct NcclOptions {
  std::vector<CommGroup> groups;                    // every collective group of the job, the same list on every rank
  std::vector<std::pair<int, int>> pipeline_pairs;  // every (sender, receiver) of the job, the same list on every rank
  DeferralRule deferral;                            // which collectives may run under compute
  double timeout_s = 60;                            // a call not finished by then fails, and aborts NCCL
};

// The host tag that carries NCCL messages' headers (Program tags stay below it).
inline constexpr std::uint64_t kNcclHeaderTag = (std::uint64_t{1} << 30) - 1;

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
  void all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts, void* out,
                  const std::vector<std::size_t>& recv_counts, DType dtype, std::string_view label) override;
  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) override;
  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) override;
  void abort(std::string_view reason) override;

  struct Channel;  // an NCCL communicator with its stream (nccl_communicator.cpp)

 private:
  void create_channels();
  Channel& group_channel(const CommGroup& group, std::string_view label);
  Channel& pair_channel(int from, int to, std::string_view label);
  // `enqueue(channel)` issues NCCL calls on the channel's stream after the compute stream's current work; the compute
  // stream then waits for them (or defers that wait, holding `memory`). Returns the completion event.
  template <class Enqueue>
  SharedEvent run(Channel& channel, bool deferred, const std::string& what, std::vector<ByteRange> memory,
                  Enqueue&& enqueue);
  // an event on the channel's stream now, watched until it completes
  SharedEvent watched_event(Channel& channel, const std::string& what);
  void abort_nccl(const std::string& story);  // every channel, once; the story for the rank's next call
  std::string health();                       // the first asynchronous NCCL error, "" if none

  Communicator& host_;
  DeviceContext& context_;
  NcclOptions options_;
  std::map<std::pair<std::string, std::vector<int>>, std::unique_ptr<Channel>> groups_;  // fixed after set-up
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> pairs_;                        // fixed after set-up
  struct Stashed {  // a message that arrived before its receive was asked for
    void* data = nullptr;
    std::size_t bytes = 0;
    SharedEvent ready;
  };
  std::multimap<std::pair<int, std::uint64_t>, Stashed> stash_;  // by (peer, tag), in arrival order
  std::unique_ptr<Watchdog> watchdog_;                           // last: stopped first
};

}  // namespace twin::exec::cuda
