// The executor's whole backward pass against central finite differences of its own forward, tensor by tensor: what
// parity across plans cannot see (a backward wrong the same way on every plan), for the GPT-2 block and the
// Llama-style one. One rank, fp32, the Program without its optimizer ops, so that an iteration leaves the gradient
// in the shard's buckets; the loss is the micro-batches' mean per-token cross-entropy, whose gradient that is.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "exec/comm/threads_communicator.hpp"
#include "exec/data.hpp"
#include "exec/interpreter.hpp"
#include "exec/model_shard.hpp"
#include "exec_test_util.hpp"

namespace twin::exec {
namespace {

class OneRankModel {
 public:
  explicit OneRankModel(const model::Scenario& s)
      : program_(model::build_program(s, model::Granularity::Op)),
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
    return out.loss_sum / out.loss_tokens;
  }

  std::vector<Bucket>& buckets() { return shard_.buckets(); }
  Backend& backend() { return *backend_; }

 private:
  model::Program program_;
  ThreadsWorld world_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Backend> backend_;
  ModelShard shard_;
  std::unique_ptr<Interpreter> interpreter_;
  IterationInput input_;
};

std::vector<float> download(Backend& backend, const Tensor& t) {
  std::vector<float> host(t.numel);
  backend.download_f32(host.data(), t);
  return host;
}

// For every parameter tensor t with gradient g_t: along d = g_t / |g_t| (zero elsewhere) the loss must change at
// |g_t|, measured as (L(theta + eps d) - L(theta - eps d)) / (2 eps).
void expect_gradients_match_finite_differences(const model::Scenario& s, const char* name) {
  OneRankModel model(s);
  model.loss_and_gradient();
  struct Case {
    std::size_t bucket;
    const ParamTensor* tensor;
    std::vector<float> direction;
    double norm;
  };
  std::vector<Case> cases;
  for (std::size_t b = 0; b < model.buckets().size(); ++b) {
    const Bucket& bucket = model.buckets()[b];
    const std::vector<float> grads = download(model.backend(), bucket.grads);
    for (const ParamTensor& t : bucket.tensors) {
      if (t.copy) continue;
      double norm = 0;
      for (std::size_t i = 0; i < t.numel; ++i) norm += double(grads[t.offset + i]) * grads[t.offset + i];
      norm = std::sqrt(norm);
      std::vector<float> direction(t.numel, 0.0f);
      if (norm > 0) {
        for (std::size_t i = 0; i < t.numel; ++i) direction[i] = static_cast<float>(grads[t.offset + i] / norm);
      }
      cases.push_back({b, &t, std::move(direction), norm});
    }
  }
  ASSERT_GT(cases.size(), 10u);
  int checked = 0;
  for (const Case& c : cases) {
    Bucket& bucket = model.buckets()[c.bucket];
    const std::vector<float> original = download(model.backend(), bucket.params);
    const double eps = 1e-2;
    auto loss_at = [&](double step) {
      std::vector<float> moved = original;
      for (std::size_t i = 0; i < c.direction.size(); ++i) {
        moved[c.tensor->offset + i] = static_cast<float>(original[c.tensor->offset + i] + step * c.direction[i]);
      }
      model.backend().upload_f32(bucket.params, moved.data());
      return model.loss_and_gradient();
    };
    const double slope = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    model.backend().upload_f32(bucket.params, original.data());
    // fp32 losses of about 5 resolve 1e-6 of a step of 2 eps: gradients below that are checked to be small.
    EXPECT_NEAR(slope, c.norm, 0.02 * c.norm + 2e-5) << name << ": " << c.tensor->name;
    checked += c.norm > 1e-3;
  }
  EXPECT_GE(checked, 8) << name << ": too few tensors with a gradient to check";
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

}  // namespace
}  // namespace twin::exec
