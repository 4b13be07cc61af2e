// The Program as Chakra execution traces, read back: every op of every rank is a node with its label, its
// dependencies (data: the op's deps; control: the previous op of its ordered stream), its FLOPs and bytes, and for
// communication its kind, size, group or peer and tag; every Send has its Recv on the peer with the same tag.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "measured/chakra.hpp"
#include "measured/kineto.hpp"
#include "model/ops/op_label.hpp"
#include "tests/model/test_scenarios.hpp"

namespace twin::measured {
namespace {

constexpr int kCompNode = 4, kSendNode = 5, kRecvNode = 6, kCollNode = 7;  // et_def.proto NodeType

TEST(Chakra, EveryOpAndDependencyRoundTrips) {
  // tp 2 x pp 2 x dp 2, 1F1B over 4 micro-batches, ZeRO-1 and overlapped DP reduction: every op kind and stream.
  model::Scenario s = model::testing::make_scenario(4, 64, 4, 32, 256, 2, 2, 2, 1, 8);
  s.parallel.zero_stage = 1;
  s.parallel.dp_overlap = true;
  const model::Program program = model::build_program(s, model::Granularity::Op);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("twin-chakra-" + std::to_string(::getpid()))).string();
  const std::vector<std::string> files = write_chakra(program, dir);
  ASSERT_EQ(files.size(), 9u);  // 8 ranks and the groups

  std::ifstream groups_file(dir + "/twin.comm_groups.json");
  const nlohmann::json groups = nlohmann::json::parse(groups_file);
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, int> sends, receives;  // (src, dst, tag) -> count
  for (int rank = 0; rank < 8; ++rank) {
    const ChakraTrace trace = read_chakra(dir + "/twin." + std::to_string(rank) + ".et");
    EXPECT_EQ(trace.rank, rank);
    EXPECT_EQ(trace.schema, "1.0.2-chakra.1.0.0");
    const std::vector<model::Op>& ops = program.ops_of_rank(rank);
    ASSERT_EQ(trace.nodes.size(), ops.size()) << "rank " << rank;
    std::map<model::Stream, std::uint64_t> last;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const model::Op& op = ops[i];
      const ChakraNode& node = trace.nodes[i];
      ASSERT_EQ(node.id, i);
      EXPECT_EQ(node.name, model::op_label(op));
      EXPECT_EQ(node.data_deps, std::vector<std::uint64_t>(op.deps.begin(), op.deps.end())) << node.name;
      std::vector<std::uint64_t> control;
      if (op.stream != model::Stream::Pipeline) {
        if (last.count(op.stream)) control.push_back(last[op.stream]);
        last[op.stream] = i;
      }
      EXPECT_EQ(node.ctrl_deps, control) << node.name;
      switch (op.kind) {
        case model::OpKind::Compute:
          EXPECT_EQ(node.type, kCompNode);
          EXPECT_EQ(node.num_ops, static_cast<std::int64_t>(op.flops));
          EXPECT_EQ(node.tensor_size, static_cast<std::int64_t>(op.bytes));
          break;
        case model::OpKind::Collective: {
          EXPECT_EQ(node.type, kCollNode);
          const int expected_type = op.collective == model::CollectiveKind::AllReduce   ? 0
                                    : op.collective == model::CollectiveKind::AllGather ? 2
                                                                                        : 7;
          EXPECT_EQ(node.comm_type, expected_type);
          EXPECT_EQ(node.comm_size, static_cast<std::int64_t>(op.bytes));
          ASSERT_TRUE(groups.contains(node.pg_name)) << node.pg_name;
          EXPECT_EQ(groups[node.pg_name].get<std::vector<int>>(), program.layout.group_members(op.group, rank));
          break;
        }
        case model::OpKind::Send:
        case model::OpKind::Recv: {
          const bool send = op.kind == model::OpKind::Send;
          EXPECT_EQ(node.type, send ? kSendNode : kRecvNode);
          const model::RankCoord me = program.layout.coord_of(rank);
          const int peer = program.layout.rank_of({me.dp, op.peer_stage, me.tp});
          EXPECT_EQ(node.comm_src, send ? rank : peer);
          EXPECT_EQ(node.comm_dst, send ? peer : rank);
          EXPECT_EQ(node.comm_tag, chakra_tag(op));
          EXPECT_EQ(node.comm_size, static_cast<std::int64_t>(op.bytes));
          (send ? sends : receives)[{node.comm_src, node.comm_dst, node.comm_tag}] += 1;
          break;
        }
      }
    }
  }
  // Tags are unique per pair of ranks, and each message is sent once and received once.
  EXPECT_FALSE(sends.empty());
  EXPECT_EQ(sends, receives);
  for (const auto& [key, count] : sends) EXPECT_EQ(count, 1);
  std::filesystem::remove_all(dir);
}

TEST(Chakra, ATruncatedTraceIsNamed) {
  const model::Program program =
      model::build_program(model::testing::make_scenario(2, 64, 4, 32, 256, 1, 1, 1, 1, 1), model::Granularity::Op);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("twin-chakra-t-" + std::to_string(::getpid()))).string();
  write_chakra(program, dir);
  const std::string path = dir + "/twin.0.et";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  try {
    read_chakra(path);
    FAIL() << "expected MeasuredError";
  } catch (const MeasuredError& error) {
    EXPECT_THAT(error.what(), testing::HasSubstr("does not parse as a Chakra Node"));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace twin::measured
