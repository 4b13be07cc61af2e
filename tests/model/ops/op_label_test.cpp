// One op-label format for both engines (model/ops/op_label.hpp): the class first, then the op's place; op_class gives the
// class back, as README.md documents it for twin compare.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "model/ops/op_label.hpp"
#include "model/program/program.hpp"
#include "test_scenarios.hpp"

namespace twin::model {
namespace {

TEST(OpLabel, ClassThenPlace) {
  Op gemm;
  gemm.what = ComputeKind::QkvProjection;
  gemm.layer = 3;
  gemm.micro_batch = 1;
  EXPECT_EQ(op_label(gemm), "forward qkv_projection layer 3 micro-batch 1");
  Op reduce;
  reduce.kind = OpKind::Collective;
  reduce.payload = Payload::InputGrad;
  reduce.what = ComputeKind::MlpUp;
  reduce.phase = Phase::Backward;
  reduce.layer = 7;
  reduce.micro_batch = 0;
  reduce.chunk = 1;
  EXPECT_EQ(op_label(reduce), "all_reduce tensor input_grad (backward mlp_up) layer 7 micro-batch 0 chunk 1");
  Op step;
  step.what = ComputeKind::OptimizerStep;
  step.phase = Phase::Optimizer;
  EXPECT_EQ(op_label(step), "optimizer optimizer_step");
  Op recv;
  recv.kind = OpKind::Recv;
  recv.phase = Phase::Backward;
  recv.micro_batch = 4;
  recv.peer_stage = 2;
  EXPECT_EQ(op_label(recv), "recv backward micro-batch 4 from stage 2");
}

TEST(OpLabel, TheClassDropsThePlace) {
  EXPECT_EQ(op_class("forward qkv_projection layer 3 micro-batch 1"), "forward qkv_projection");
  EXPECT_EQ(op_class("all_reduce tensor input_grad (backward mlp_up) layer 7 micro-batch 0 chunk 1"),
            "all_reduce tensor input_grad");
  EXPECT_EQ(op_class("send forward micro-batch 10 to stage 2"), "send forward");
  EXPECT_EQ(op_class("optimizer optimizer_step"), "optimizer optimizer_step");
  // Every label of a Program begins with its class, which names no place.
  const Program program = build_program(testing::make_scenario(4, 64, 4, 32, 300, 2, 2, 2, 1, 4), Granularity::Op);
  std::set<std::string> classes;
  for (const auto& ops : program.stage_ops) {
    for (const Op& op : ops) {
      const std::string label = op_label(op), cls = op_class(label);
      EXPECT_EQ(label.rfind(cls, 0), 0u) << label;
      EXPECT_EQ((" " + cls + " ").find(" layer "), std::string::npos) << label;
      classes.insert(cls);
    }
  }
  EXPECT_TRUE(classes.count("backward mlp_up"));
  EXPECT_TRUE(classes.count("all_reduce tensor layer_output"));
  EXPECT_TRUE(classes.count("send forward"));
}

}  // namespace
}  // namespace twin::model
