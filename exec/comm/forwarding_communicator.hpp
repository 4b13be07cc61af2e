// ForwardingCommunicator: a Communicator that passes every call to another one (`host`), the base of the wrappers that
// change only some calls: DeferringCommunicator (exec/train/deferred_emulation.hpp) holds the deferrable reductions
// back, StagingCommunicator (exec/cuda/staging_communicator.hpp) stages device buffers through host memory. A wrapper
// overrides the calls it changes and, where every forwarded call needs the same preparation, before_forward().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "exec/comm/communicator.hpp"

namespace twin::exec {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator& host) : host_(host) {}

  int rank() const override { return host_.rank(); }
  int world_size() const override { return host_.world_size(); }

  void all_reduce(const CommGroup& group, void* data, std::size_t count, DType dtype, std::string_view label) override {
    before_forward();
    host_.all_reduce(group, data, count, dtype, label);
  }
  void reduce_scatter(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                      std::string_view label) override {
    before_forward();
    host_.reduce_scatter(group, in, out, count, dtype, label);
  }
  void all_gather(const CommGroup& group, const void* in, void* out, std::size_t count, DType dtype,
                  std::string_view label) override {
    before_forward();
    host_.all_gather(group, in, out, count, dtype, label);
  }
  void broadcast(const CommGroup& group, void* data, std::size_t count, DType dtype, int root,
                 std::string_view label) override {
    before_forward();
    host_.broadcast(group, data, count, dtype, root, label);
  }
  void barrier(const CommGroup& group, std::string_view label) override {
    before_forward();
    host_.barrier(group, label);
  }
  void all_to_all(const CommGroup& group, const void* in, const std::vector<std::size_t>& send_counts, void* out,
                  const std::vector<std::size_t>& recv_counts, DType dtype, std::string_view label) override {
    before_forward();
    host_.all_to_all(group, in, send_counts, out, recv_counts, dtype, label);
  }
  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) override {
    before_forward();
    host_.send(peer, tag, data, bytes);
  }
  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes, std::string_view label) override {
    before_forward();
    host_.recv(peer, tag, data, bytes, label);
  }
  void abort(std::string_view reason) override { host_.abort(reason); }  // at once: a failing rank waits for nothing

 protected:
  // Runs before each call the base forwards (every call but abort); nothing unless a wrapper overrides it.
  virtual void before_forward() {}
  Communicator& host() const { return host_; }

 private:
  Communicator& host_;
};

}  // namespace twin::exec
