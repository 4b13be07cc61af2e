// Collectives that a device communicator leaves running under compute, and the memory they hold until the rank waits
// for them.
//
// Under dp_overlap the data-parallel group's gradient reductions (all-reduce, reduce-scatter) on device buffers do not
// make the compute stream wait (exec/cuda/nccl_communicator.hpp): the backward goes on while they run on their own
// stream. Until the rank waits for such a collective it reads and writes its buffers, and a kernel that touches them
// in between races it. DeferredWork keeps each one's byte ranges with a handle to wait on (a CUDA event on the GPU;
// the call itself in the CPU emulation, exec/train/deferred_emulation.hpp), so that a touch is ordered after it, or, in the
// emulation's strict mode, reported.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "exec/comm/communicator.hpp"

namespace twin::exec {

// The collectives a device communicator defers: the data group's reductions under dp_overlap, unless ZeRO-3 shards
// the parameters (its gathers feed the next kernel, and its reduce-scatters run under the next micro-batch's backward
// into the same buffers).
struct DeferralRule {
  bool overlap_data_parallel = false;

  static DeferralRule of(bool dp_overlap, bool shards_parameters) { return {dp_overlap && !shards_parameters}; }
  bool defers_reduction(const CommGroup& group) const { return overlap_data_parallel && group.kind == "data"; }
};

// [begin, begin + bytes) of one buffer
struct ByteRange {
  const void* begin = nullptr;
  std::size_t bytes = 0;

  bool overlaps(const void* other, std::size_t other_bytes) const {
    const auto* a = static_cast<const std::byte*>(begin);
    const auto* b = static_cast<const std::byte*>(other);
    return bytes > 0 && other_bytes > 0 && a < b + other_bytes && b < a + bytes;
  }
};

// The deferred collectives of one rank, in issue order (they complete in that order: one stream, or one rendezvous
// sequence per group).
template <class Handle>
class DeferredWork {
 public:
  struct Entry {
    Handle done;                    // what to wait on
    std::string what;               // "reduce_scatter <label> on the data group (ranks 0, 2)", for messages
    std::vector<ByteRange> memory;  // every buffer it reads or writes
  };

  void add(Entry entry) { entries_.push_back(std::move(entry)); }
  bool empty() const { return entries_.empty(); }

  // The first entry whose memory overlaps [data, data + bytes), or nullptr.
  const Entry* find_overlapping(const void* data, std::size_t bytes) const {
    for (const Entry& entry : entries_) {
      if (touches(entry, data, bytes)) return &entry;
    }
    return nullptr;
  }

  // What must finish before [data, data + bytes) may be touched: every entry up to the last one that overlaps it,
  // in issue order, removed from the list (empty when none overlaps).
  std::vector<Entry> take_through_overlapping(const void* data, std::size_t bytes) {
    std::size_t through = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (touches(entries_[i], data, bytes)) through = i + 1;
    }
    std::vector<Entry> taken(std::make_move_iterator(entries_.begin()),
                             std::make_move_iterator(entries_.begin() + static_cast<std::ptrdiff_t>(through)));
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(through));
    return taken;
  }

  // Exactly the entries whose memory overlaps [data, data + bytes), removed (for work that completes in no order).
  std::vector<Entry> take_overlapping(const void* data, std::size_t bytes) {
    std::vector<Entry> taken, kept;
    for (Entry& entry : entries_) (touches(entry, data, bytes) ? taken : kept).push_back(std::move(entry));
    entries_ = std::move(kept);
    return taken;
  }

  std::vector<Entry> take_all() { return std::exchange(entries_, {}); }

 private:
  static bool touches(const Entry& entry, const void* data, std::size_t bytes) {
    for (const ByteRange& range : entry.memory) {
      if (range.overlaps(data, bytes)) return true;
    }
    return false;
  }

  std::vector<Entry> entries_;
};

}  // namespace twin::exec
