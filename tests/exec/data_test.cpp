// Tokenizer and loader: the global batch of a step is the same whatever the plan; DP ranks split it.
#include <gtest/gtest.h>

#include "exec/errors.hpp"
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

}  // namespace
}  // namespace twin::exec
