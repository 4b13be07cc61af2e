#include "exec/data.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include <fmt/core.h>

#include "exec/errors.hpp"
#include "exec/rng.hpp"

namespace twin::exec {

std::vector<int> ByteTokenizer::encode(std::string_view text) {
  std::vector<int> tokens;
  tokens.reserve(text.size());
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int token : tokens) text.push_back(static_cast<char>(static_cast<unsigned char>(token)));
  return text;
}

namespace {
std::uint64_t fingerprint_of(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ull;
  }
  return hash;
}
}  // namespace

TextDataset load_text(const std::string& path, std::size_t min_tokens) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw RunError(fmt::format("--data '{}' is a directory: give a text file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunError(fmt::format("--data '{}': cannot open the file", path));
  TextDataset data;
  data.path = path;
  data.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw RunError(fmt::format("--data '{}': reading failed", path));
  if (data.bytes.size() < min_tokens) {
    throw RunError(fmt::format("--data '{}' has {} bytes: a training sequence needs at least {}", path,
                               data.bytes.size(), min_tokens));
  }
  data.fingerprint = fingerprint_of(data.bytes);
  return data;
}

TextDataset text_from_string(std::string_view text, std::string name) {
  TextDataset data;
  data.path = std::move(name);
  data.bytes.assign(text.begin(), text.end());
  data.fingerprint = fingerprint_of(data.bytes);
  return data;
}

DataLoader::DataLoader(const TextDataset& data, const model::Scenario& scenario)
    : data_(data),
      seed_(scenario.training.seed),
      seq_(scenario.model.seq_len),
      micro_batch_(scenario.parallel.micro_batch),
      micro_batches_(scenario.parallel.micro_batches()),
      global_batch_(scenario.parallel.global_batch) {
  if (scenario.model.vocab < ByteTokenizer::kVocab) {
    throw RunError(fmt::format("{}: model.vocab = {} cannot hold the byte-level tokenizer's {} tokens", scenario.source,
                               scenario.model.vocab, ByteTokenizer::kVocab));
  }
  if (static_cast<std::int64_t>(data.bytes.size()) < seq_ + 2) {
    throw RunError(fmt::format("--data '{}' has {} bytes: a sequence of model.seq_len = {} needs at least {}",
                               data.path, data.bytes.size(), seq_, seq_ + 2));
  }
}

void DataLoader::sequence(std::int64_t step, std::int64_t index, int* tokens, int* targets) const {
  static const std::uint64_t stream = fnv1a64("data.sequence_start");
  const auto positions = static_cast<std::uint64_t>(static_cast<std::int64_t>(data_.bytes.size()) - seq_);
  const auto counter = static_cast<std::uint64_t>(step * global_batch_ + index);
  const std::uint64_t start = random_bits(seed_, stream, counter) % positions;
  for (std::int64_t t = 0; t < seq_; ++t) {
    tokens[t] = data_.bytes[start + static_cast<std::uint64_t>(t)];
    targets[t] = data_.bytes[start + static_cast<std::uint64_t>(t) + 1];
  }
}

std::vector<MicroBatch> DataLoader::micro_batches(std::int64_t step, int dp_rank) const {
  std::vector<MicroBatch> out(static_cast<std::size_t>(micro_batches_));
  for (std::int64_t k = 0; k < micro_batches_; ++k) {
    MicroBatch& mb = out[static_cast<std::size_t>(k)];
    mb.tokens.resize(static_cast<std::size_t>(micro_batch_ * seq_));
    mb.targets.resize(mb.tokens.size());
    for (std::int64_t b = 0; b < micro_batch_; ++b) {
      const std::int64_t index = (dp_rank * micro_batches_ + k) * micro_batch_ + b;
      sequence(step, index, mb.tokens.data() + b * seq_, mb.targets.data() + b * seq_);
    }
  }
  return out;
}

}  // namespace twin::exec
