// Data: a byte-level tokenizer over any text file and a deterministic loader.
//
// Tokenizer: one token per byte (vocabulary 256; the scenario's model.vocab must be >= 256, the rest is padding).
// Loader: sequence j of step i of the global batch starts at a position drawn from (seed, i * global_batch + j) with
// the counter-based RNG, so the global batch of a step is the same set of sequences whatever the plan, and resuming at
// step i needs no state but i. DP rank d takes sequences [d * m * b, (d + 1) * m * b) of the global batch, its
// micro-batch k the b sequences from d * m * b + k * b; targets are the inputs shifted by one token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exec/core/micro_batch.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::exec {

struct ByteTokenizer {
  static constexpr int kVocab = 256;
  static std::vector<int> encode(std::string_view text);
  static std::string decode(const std::vector<int>& tokens);
};

struct TextDataset {
  std::string path;
  std::span<const std::uint8_t> bytes;  // the file, one token per byte (mapped read-only, or held in memory)
  std::shared_ptr<const void> storage;  // what keeps `bytes` alive: the file's mapping, or a copy in memory
  std::uint64_t fingerprint = 0;        // FNV-1a of the contents: a checkpoint remembers what it was trained on
};

// The largest --data file: its fingerprint reads it once at start (about a second per GB), and a larger corpus
// belongs in a tokenized, sharded format this byte-level loader does not read.
constexpr std::uint64_t kMaxDataBytes = std::uint64_t{16} << 30;  // 16 GiB

// Maps the file read-only (pages come from the page cache as sequences are drawn; it is never copied whole into this
// process's memory). Throws RunError when it is missing, unreadable, not a regular file (a directory, a FIFO that
// would block the run, a device such as /dev/zero or /dev/urandom that never ends), larger than kMaxDataBytes, or
// shorter than `min_tokens`.
TextDataset load_text(const std::string& path, std::size_t min_tokens);
// load_text's checks alone (nothing mapped or read): what a launcher checks once before it starts the ranks.
void check_text_file(const std::string& path, std::size_t min_tokens);
// A dataset from memory (tests).
TextDataset text_from_string(std::string_view text, std::string name = "<memory>");

class DataLoader {
 public:
  // Throws RunError when the vocabulary cannot hold bytes or the text is shorter than a sequence.
  DataLoader(const TextDataset& data, const model::Scenario& scenario);

  // tokens (seq) and targets (seq) of sequence `index` (0 <= index < global_batch) of step `step`
  void sequence(std::int64_t step, std::int64_t index, int* tokens, int* targets) const;
  // The micro-batches DP rank `dp_rank` trains on at step `step`.
  std::vector<MicroBatch> micro_batches(std::int64_t step, int dp_rank) const;

 private:
  const TextDataset& data_;
  std::uint64_t seed_;
  std::int64_t seq_, micro_batch_, micro_batches_, global_batch_;
};

}  // namespace twin::exec
