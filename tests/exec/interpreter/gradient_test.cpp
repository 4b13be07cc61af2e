// The executor's whole backward pass against central finite differences of its own forward, tensor by tensor: what
// parity across plans cannot see (a backward wrong the same way on every plan), for the GPT-2 block and the
// Llama-style one. One rank, fp32, the Program without its optimizer ops, so that an iteration leaves the gradient
// in the shard's buckets; the loss is the micro-batches' mean per-token cross-entropy (with MoE layers, plus their
// load-balancing losses), whose gradient that is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "exec/comm/threads_communicator.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec/train/data.hpp"
#include "model/program/stage_builder.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

class OneRankModel {
 public:
  explicit OneRankModel(const model::Scenario& s) : OneRankModel(model::build_program(s, model::Granularity::Op)) {}
  explicit OneRankModel(model::Program program)
      : program_(std::move(program)),
        world_(1),
        comm_(world_.communicator(0)),
        backend_(make_backend("cpu")),
        shard_(program_.scenario, program_.layout.coord_of(0), *backend_) {
    // Up to the first gradient-norm or optimizer op: what stays is forward, backward and the gradient reductions.
    std::vector<model::Op>& ops = program_.stage_ops[0];
    std::size_t end = 0;
    while (end < ops.size() && ops[end].phase != model::Phase::Optimizer &&
           !(ops[end].kind == model::OpKind::Collective && ops[end].payload == model::Payload::GradNormSquared)) {
      ++end;
    }
    ops.resize(end);
    shard_.initialize(program_.scenario.training.seed);
    interpreter_ = std::make_unique<Interpreter>(program_, 0, *backend_, *comm_, shard_);
    input_.micro_batches = DataLoader(testing::corpus(), program_.scenario).micro_batches(0, 0);
  }

  // The mean loss at the current parameters, the gradient left in the buckets.
  double loss_and_gradient() {
    shard_.zero_grads();
    const IterationOutput out = interpreter_->run_iteration(input_);
    last_output_ = out;
    // with MoE layers, plus their load-balancing losses (a mean over the micro-batches, as the gradient's)
    const auto& p = program_.scenario.parallel;
    return out.loss_sum / out.loss_tokens + out.aux_loss_sum / static_cast<double>(p.global_batch / p.micro_batch);
  }

  std::vector<Bucket>& buckets() { return shard_.buckets(); }
  Backend& backend() { return *backend_; }
  const IterationOutput& last_output() const { return last_output_; }

 private:
  model::Program program_;
  ThreadsWorld world_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Backend> backend_;
  ModelShard shard_;
  std::unique_ptr<Interpreter> interpreter_;
  IterationInput input_;
  IterationOutput last_output_;
};

std::vector<float> download(Backend& backend, const Tensor& t) {
  std::vector<float> host(t.numel);
  backend.download_f32(host.data(), t);
  return host;
}

// A direction in one tensor's parameters and the slope the loss must have along it.
struct Direction {
  std::string what;
  std::vector<float> vector;  // over the tensor's elements
  double slope = 0;           // <g, d>
  double tolerance = 0;
};

// For every parameter tensor t with gradient g_t, the loss's central difference (L(theta + eps d) - L(theta - eps d))
// / (2 eps) along:
//   d = g_t / |g_t|, where it must be |g_t|: a gradient of the wrong size or direction;
//   two random coordinates i (among the elements with |g_i| >= max |g| / 4, which fp32 differences resolve), where it
//   must be g_i within 3 %: an error orthogonal to g_t (14 % of |g_t| changes the slope along g_t by 2 %, within the
//   first check's tolerance) is off by about as much in every element.
//
// `kinked`: top-k routing (top_k < experts) makes the loss piecewise smooth: a step that moves a token's k-th and
// (k+1)-th router logits past each other swaps an expert, a jump in the loss. Such a direction shows as one-sided
// slopes that disagree (a wrong gradient does not: it is wrong on both sides alike); it is skipped and counted, and
// at most a third of the directions may be.
void expect_gradients_match_finite_differences(model::Program program, const char* name, bool kinked = false) {
  OneRankModel model(std::move(program));
  const double at_original = model.loss_and_gradient();
  struct Case {
    std::size_t bucket;
    const ParamTensor* tensor;
    std::vector<Direction> directions;
    double norm;
  };
  std::mt19937 random(20261203);
  std::vector<Case> cases;
  for (std::size_t b = 0; b < model.buckets().size(); ++b) {
    const Bucket& bucket = model.buckets()[b];
    const std::vector<float> grads = download(model.backend(), bucket.grads);
    for (const ParamTensor& t : bucket.tensors) {
      if (t.copy) continue;
      double norm = 0, largest = 0;
      for (std::size_t i = 0; i < t.numel; ++i) {
        norm += double(grads[t.offset + i]) * grads[t.offset + i];
        largest = std::max(largest, std::abs(double(grads[t.offset + i])));
      }
      norm = std::sqrt(norm);
      Case c{b, &t, {}, norm};
      Direction along{"along the gradient", std::vector<float>(t.numel, 0.0f), norm, 0.02 * norm + 2e-5};
      if (norm > 0) {
        for (std::size_t i = 0; i < t.numel; ++i) along.vector[i] = static_cast<float>(grads[t.offset + i] / norm);
      }
      c.directions.push_back(std::move(along));
      std::vector<std::size_t> resolved;
      for (std::size_t i = 0; i < t.numel; ++i) {
        if (largest > 1e-3 && std::abs(grads[t.offset + i]) >= largest / 4) resolved.push_back(i);
      }
      for (int k = 0; k < 2 && !resolved.empty(); ++k) {
        const std::size_t i = resolved[std::uniform_int_distribution<std::size_t>(0, resolved.size() - 1)(random)];
        Direction coordinate{fmt::format("element {}", i), std::vector<float>(t.numel, 0.0f), grads[t.offset + i], 0};
        coordinate.vector[i] = 1.0f;
        coordinate.tolerance = 0.03 * std::abs(coordinate.slope) + 2e-5;
        c.directions.push_back(std::move(coordinate));
      }
      cases.push_back(std::move(c));
    }
  }
  ASSERT_GT(cases.size(), 10u);
  int checked = 0, coordinates = 0, directions = 0, skipped = 0;
  for (const Case& c : cases) {
    Bucket& bucket = model.buckets()[c.bucket];
    const std::vector<float> original = download(model.backend(), bucket.params);
    const double eps = 1e-2;
    for (const Direction& d : c.directions) {
      auto loss_at = [&](double step) {
        std::vector<float> moved = original;
        for (std::size_t i = 0; i < d.vector.size(); ++i) {
          moved[c.tensor->offset + i] = static_cast<float>(original[c.tensor->offset + i] + step * d.vector[i]);
        }
        model.backend().upload_f32(bucket.params, moved.data());
        return model.loss_and_gradient();
      };
      const double ahead = loss_at(eps), behind = loss_at(-eps);
      const double slope = (ahead - behind) / (2 * eps);
      model.backend().upload_f32(bucket.params, original.data());
      ++directions;
      if (kinked && std::abs((ahead - at_original) - (at_original - behind)) / eps > d.tolerance) {
        ++skipped;  // a routing change on one side
        continue;
      }
      // fp32 losses of about 5 resolve 1e-6 of a step of 2 eps: gradients below that are checked to be small.
      EXPECT_NEAR(slope, d.slope, d.tolerance) << name << ": " << c.tensor->name << ", " << d.what;
      coordinates += d.what != "along the gradient";
    }
    checked += c.norm > 1e-3;
  }
  EXPECT_GE(checked, 8) << name << ": too few tensors with a gradient to check";
  EXPECT_LE(3 * skipped, directions) << name << ": " << skipped << " of " << directions
                                     << " directions crossed a routing change";
  if (kinked) std::printf("[ gradient ] %s: %d of %d directions crossed a routing change\n", name, skipped, directions);
  EXPECT_GE(coordinates, (kinked ? 1 : 2) * checked) << name << ": too few random coordinates";
}

void expect_gradients_match_finite_differences(const model::Scenario& s, const char* name, bool kinked = false) {
  expect_gradients_match_finite_differences(model::build_program(s, model::Granularity::Op), name, kinked);
}

model::Scenario tiny(const std::vector<std::string>& block) {
  // Weights large enough (init_std 0.2) that attention is far from uniform: the queries' and keys' gradients are
  // not negligible, so the rotary embedding's backward is seen.
  std::vector<std::string> sets = {"training.init_std=0.2", "parallel.micro_batch=2", "parallel.global_batch=4"};
  sets.insert(sets.end(), block.begin(), block.end());
  return testing::scenario(testing::small_toml(), sets);
}

TEST(ExecGradient, TheGpt2BlockMatchesFiniteDifferences) {
  expect_gradients_match_finite_differences(tiny({}), "GPT-2 block");
}

TEST(ExecGradient, TheLlamaBlockMatchesFiniteDifferences) {
  expect_gradients_match_finite_differences(
      tiny({"model.norm=\"rmsnorm\"", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
            "model.kv_heads=2", "model.linear_bias=false", "framework.tied_embeddings=false"}),
      "Llama-style block");
}

TEST(ExecGradient, TheParallelBlockMatchesFiniteDifferences) {
  // Both branches read the layer input and dy: a backward that handed the attention branch the residual gradient
  // after LN2's share, or left LN2's input gradient out, fails here on every layer's tensors.
  expect_gradients_match_finite_differences(tiny({"model.parallel_residual=true"}), "parallel block");
  expect_gradients_match_finite_differences(
      tiny({"model.parallel_residual=true", "model.activation=\"swiglu\"", "model.position_embedding=\"rope\"",
            "model.rotary_fraction=0.5", "model.kv_heads=2", "model.linear_bias=false"}),
      "parallel block with SwiGLU, rotary embeddings on half of each head and grouped queries");
  expect_gradients_match_finite_differences(tiny({"model.parallel_residual=true", "model.shared_norm=true"}),
                                            "parallel block on one shared layer norm");
}

TEST(ExecGradient, TheMoeLayerMatchesFiniteDifferences) {
  // Every expert chosen (top_k = experts): the routing is smooth, so every router, expert and shared-expert weight is
  // checked; then top-2 with a heavy load-balancing loss (its gradient through the router's softmax), GELU and SwiGLU.
  const std::vector<std::string> moe = {"model.experts=4", "model.moe_ffn_hidden=48", "model.shared_experts=1",
                                        "model.linear_bias=false"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return tiny(more);
  };
  expect_gradients_match_finite_differences(with({"model.top_k=4"}), "MoE, every expert chosen");
  // top-2: 64 tokens a layer (fewer routing changes within a step); the coefficient 3, not 1, so that a backward that
  // drops or misplaces it (the forward's loss scaled by 3, its gradient by 1) fails
  expect_gradients_match_finite_differences(
      with({"model.top_k=2", "model.moe_aux_loss_coeff=3", "parallel.micro_batch=1", "parallel.global_batch=2"}),
      "MoE, top-2 with the load-balancing loss", true);
  expect_gradients_match_finite_differences(
      with({"model.top_k=2", "model.moe_aux_loss_coeff=1", "model.activation=\"swiglu\"", "model.dense_layers=1",
            "parallel.micro_batch=1", "parallel.global_batch=2"}),
      "MoE with SwiGLU experts after a dense layer", true);
  // token dropping (capacity factor 1.25: an expert takes 20 of a micro-batch's 64 pairs): a dropped pair adds nothing
  // and gets no gradient, its probability's included (a dropped slot given a probability gradient fails this check).
  // The drop is one more kink, where an expert's last kept pair changes: at capacity factor 1 (16 an expert) over a
  // third of the directions cross one.
  const model::Scenario dropping = with({"model.top_k=2", "model.moe_aux_loss_coeff=1", "model.capacity_factor=1.25",
                                         "parallel.micro_batch=1", "parallel.global_batch=2"});
  OneRankModel model(dropping);
  model.loss_and_gradient();
  EXPECT_GT(model.last_output().moe_dropped_slots, 0) << "capacity factor 1.25 dropped no token";
  std::printf("[ gradient ] capacity factor 1.25 drops %.0f (token, slot) pairs\n",
              model.last_output().moe_dropped_slots);
  expect_gradients_match_finite_differences(dropping, "MoE, top-2 dropping tokens past capacity", true);
}

// parallel.schedule = "zb-h1"'s split backward on one rank: B (input gradients) and W (the linear layers' weight
// gradients, from the inputs B kept) in the zero-bubble schedule's order, F B W per micro-batch. The scenario refuses
// the schedule at pp 1 (no bubble to fill), but the Program is well defined: the stage builder expands the schedule.
// ZB-V on one rank: two chunks, the V's turn (chunk 0's output chunk 1's input, and back) passed within the rank.
model::Program split_backward_program(model::Scenario s,
                                      model::ScheduleKind schedule = model::ScheduleKind::ZeroBubbleH1) {
  s.parallel.schedule = schedule;
  s.parallel.virtual_stages = schedule == model::ScheduleKind::ZeroBubbleV ? 2 : 1;
  model::Program program;
  program.scenario = s;
  program.granularity = model::Granularity::Op;
  program.layout = model::rank_layout(s);
  program.schedule =
      model::build_schedule(s.parallel.schedule, 1, static_cast<int>(s.parallel.micro_batches()),
                            static_cast<int>(s.parallel.virtual_stages));
  program.stage_ops.push_back(model::StageBuilder(s, model::Granularity::Op, program.schedule[0], 0).build());
  program.exchange_issue = model::exchange_issue(s);
  program.stage_exchanges.push_back(model::pipeline_exchanges(s, program.stage_ops[0], 0));
  int weight_grads = 0, deferring = 0;
  for (const model::Op& op : program.stage_ops[0]) {
    weight_grads += op.phase == model::Phase::WeightGrad;
    deferring += op.defers_weight_grad;
  }
  const int linears = 4 * static_cast<int>(s.model.layers * s.parallel.micro_batches());
  EXPECT_EQ(weight_grads, linears);  // every linear layer's W, once per micro-batch
  EXPECT_EQ(deferring, linears);
  return program;
}

TEST(ExecGradient, TheZeroBubbleSplitBackwardMatchesFiniteDifferences) {
  expect_gradients_match_finite_differences(split_backward_program(tiny({})), "GPT-2 block, B and W");
}

TEST(ExecGradient, TheZeroBubbleVSplitBackwardMatchesFiniteDifferences) {
  expect_gradients_match_finite_differences(split_backward_program(tiny({}), model::ScheduleKind::ZeroBubbleV),
                                            "GPT-2 blocks in a V, B and W");
}

}  // namespace
}  // namespace twin::exec
