// Tokenizer and loader: the global batch of a step is the same whatever the plan; DP ranks split it.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "exec/core/errors.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

TEST(ExecByteTokenizer, RoundTripsAnyBytes) {
  const std::string text = std::string("Hello, world!\n\xc3\xa9\x00\xff", 17);
  const auto tokens = ByteTokenizer::encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (int token : tokens) EXPECT_TRUE(token >= 0 && token < 256);
  EXPECT_EQ(ByteTokenizer::decode(tokens), text);
}

std::vector<int> flatten(const std::vector<MicroBatch>& batches, bool targets) {
  std::vector<int> all;
  for (const auto& mb : batches)
    all.insert(all.end(), (targets ? mb.targets : mb.tokens).begin(), (targets ? mb.targets : mb.tokens).end());
  return all;
}

TEST(ExecDataLoader, TheGlobalBatchDoesNotDependOnThePlan) {
  const auto one = testing::scenario(testing::parity_toml());  // micro-batch 1 x 8
  const auto two = testing::scenario(testing::parity_toml(), {"parallel.dp=2", "parallel.micro_batch=2"});
  const DataLoader a(testing::corpus(), one), b(testing::corpus(), two);
  for (int step : {0, 5, 1000}) {
    std::vector<int> from_two = flatten(b.micro_batches(step, 0), false);
    const auto second = flatten(b.micro_batches(step, 1), false);
    from_two.insert(from_two.end(), second.begin(), second.end());
    EXPECT_EQ(flatten(a.micro_batches(step, 0), false), from_two) << "step " << step;
  }
  EXPECT_NE(flatten(a.micro_batches(0, 0), false), flatten(a.micro_batches(1, 0), false));
}

TEST(ExecDataLoader, TargetsAreTheNextTokens) {
  const auto s = testing::scenario(testing::small_toml());
  const DataLoader loader(testing::corpus(), s);
  std::vector<int> tokens(32), targets(32);
  loader.sequence(3, 2, tokens.data(), targets.data());
  for (int t = 0; t + 1 < 32; ++t) EXPECT_EQ(targets[t], tokens[t + 1]);
}

TEST(ExecDataLoader, RefusesTextsShorterThanASequenceAndSmallVocabularies) {
  const auto s = testing::scenario(testing::small_toml());
  const TextDataset tiny = text_from_string("too short");
  EXPECT_THROW(DataLoader(tiny, s), RunError);
  const auto small_vocab = testing::scenario(testing::small_toml(), {"model.vocab=100"});
  EXPECT_THROW(DataLoader(testing::corpus(), small_vocab), RunError);
  EXPECT_THROW(load_text("/no/such/file.txt", 10), RunError);
  try {
    load_text(testing::source_dir() + "/data", 10);  // a directory
    ADD_FAILURE() << "a directory was read as text";
  } catch (const RunError& error) {
    EXPECT_NE(std::string(error.what()).find("is a directory"), std::string::npos) << error.what();
  }
}

// --data is mapped, never read whole: what is not a regular file is refused before anything is read (a FIFO would
// block the run forever, /dev/zero and /dev/urandom never end), and so is a file past the stated limit.
TEST(ExecDataLoader, RefusesWhatIsNotARegularFileAndFilesPastTheLimit) {
  const std::string dir = testing::temp_dir("data");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto refusal = [](const std::string& path) {
    try {
      load_text(path, 10);
    } catch (const RunError& error) {
      return std::string(error.what());
    }
    return std::string("read");
  };
  EXPECT_NE(refusal(fifo).find("is a named pipe (FIFO)"), std::string::npos) << refusal(fifo);
  EXPECT_NE(refusal("/dev/zero").find("is a character device"), std::string::npos) << refusal("/dev/zero");
  EXPECT_NE(refusal("/dev/urandom").find("is a character device"), std::string::npos);
  const std::string huge = dir + "/huge.txt";  // sparse: no disk space used
  std::ofstream(huge).close();
  std::filesystem::resize_file(huge, kMaxDataBytes + 1);
  EXPECT_NE(refusal(huge).find("the byte-level loader reads files up to 16 GiB"), std::string::npos) << refusal(huge);
  EXPECT_THROW(check_text_file(huge, 10), RunError);
  std::filesystem::remove_all(dir);
}

TEST(ExecDataLoader, AMappedFileOutlivesItsFirstHolder) {
  const std::string dir = testing::temp_dir("mapped");
  std::ofstream(dir + "/text.txt") << std::string(1000, 'a') + "xyz";
  TextDataset copy;
  {
    const TextDataset data = load_text(dir + "/text.txt", 10);
    EXPECT_EQ(data.fingerprint, text_from_string(std::string(1000, 'a') + "xyz").fingerprint);
    copy = data;
  }
  ASSERT_EQ(copy.bytes.size(), 1003u);
  EXPECT_EQ(copy.bytes[1001], 'y');
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace twin::exec
