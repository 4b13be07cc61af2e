#include "exec/train/data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>

#include "exec/core/errors.hpp"
#include "exec/core/rng.hpp"

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

std::uint64_t fingerprint_of(std::span<const std::uint8_t> bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string kind_of_file(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory: give a text file";  // (a directory opened read-only on some systems)
  if (S_ISFIFO(mode)) return "a named pipe (FIFO), which could block the run forever";
  if (S_ISCHR(mode)) return "a character device (such as /dev/zero or /dev/urandom), which never ends";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// A read-only mapping of a whole file, unmapped when the last TextDataset holding it goes.
struct Mapping {
  const void* address = nullptr;
  std::size_t bytes = 0;
  Mapping(const void* a, std::size_t n) : address(a), bytes(n) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(const_cast<void*>(address), bytes); }
};

}  // namespace

namespace {

// An open --data file that passed every check, closed when it goes.
struct CheckedFile {
  int fd = -1;
  std::uint64_t size = 0;
  CheckedFile(const std::string& path, std::size_t min_tokens) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below, once fstat says what it is).
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      if (errno == EISDIR) throw RunError(fmt::format("--data '{}' is a directory: give a text file", path));
      throw RunError(fmt::format("--data '{}': cannot open the file", path));
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0) fail(fmt::format("--data '{}': {}", path, std::strerror(errno)));
    if (!S_ISREG(info.st_mode)) {
      fail(fmt::format("--data '{}' is {}{}", path, kind_of_file(info.st_mode),
                       S_ISDIR(info.st_mode) ? ""
                                             : ": give a regular text file (twin maps it and draws sequences from "
                                               "anywhere in it)"));
    }
    size = static_cast<std::uint64_t>(info.st_size);
    if (size > kMaxDataBytes) {
      fail(
          fmt::format("--data '{}' has {} bytes ({:.1f} GiB): the byte-level loader reads files up to {} GiB (its "
                      "fingerprint reads the whole file at start)",
                      path, size, static_cast<double>(size) / (1 << 30), kMaxDataBytes >> 30));
    }
    if (size < min_tokens) {
      fail(fmt::format("--data '{}' has {} bytes: a training sequence needs at least {}", path, size, min_tokens));
    }
  }
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;
  ~CheckedFile() {
    if (fd >= 0) ::close(fd);
  }
  [[noreturn]] void fail(const std::string& message) {
    ::close(fd);
    fd = -1;
    throw RunError(message);
  }
};

}  // namespace

void check_text_file(const std::string& path, std::size_t min_tokens) {
  const CheckedFile file(path, min_tokens);
}

TextDataset load_text(const std::string& path, std::size_t min_tokens) {
  const CheckedFile file(path, min_tokens);
  void* address = ::mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (address == MAP_FAILED) {
    throw RunError(fmt::format("--data '{}': cannot map the file: {}", path, std::strerror(errno)));
  }
  TextDataset data;
  data.path = path;
  data.bytes = std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(address), file.size);
  data.storage = std::make_shared<const Mapping>(address, file.size);
  ::madvise(address, file.size, MADV_SEQUENTIAL);  // the fingerprint reads it in order once ...
  data.fingerprint = fingerprint_of(data.bytes);
  ::madvise(address, file.size, MADV_RANDOM);  // ... then sequences are drawn from anywhere
  return data;
}

TextDataset text_from_string(std::string_view text, std::string name) {
  auto copy = std::make_shared<const std::vector<std::uint8_t>>(text.begin(), text.end());
  TextDataset data;
  data.path = std::move(name);
  data.bytes = std::span<const std::uint8_t>(copy->data(), copy->size());
  data.storage = copy;
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
