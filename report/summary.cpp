#include "report/summary.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>

#include "model/program/estimates.hpp"

namespace twin::report {

namespace {

// What occupies a rank at some instant, in decreasing priority. kHost: a compute op whose predecessors are done waits
// for the host to issue it.
enum Category : int {
  kCompute = 0,
  kTensor = 1,
  kContext = 2,
  kExpert = 3,
  kDataBlocking = 4,
  kDataBackground = 5,
  kPipeline = 6,
  kHost = 7,
  kCount = 8
};

int category_of(const model::Op& op) {
  // Both frameworks block on their sends as on their receives (model/ops/exchanges.hpp): from the moment its bytes move.
  if (op.kind == model::OpKind::Recv || op.kind == model::OpKind::Send) return kPipeline;
  if (op.stream == model::Stream::DataParallel) return kDataBackground;
  if (op.kind == model::OpKind::Compute) return kCompute;
  switch (op.group) {
    case model::Group::Tensor:
    case model::Group::ExpertTensor:  // one expert's weights split like a dense layer's
      return kTensor;
    case model::Group::Context:  // the K/V exchanges of context parallelism (all-gathers, ring, all-to-alls)
      return kContext;
    case model::Group::Expert:                 // the tokens' dispatch and combine
    case model::Group::ExpertTensorAndExpert:  // the tokens-per-expert counts' all-gather
      return kExpert;
    default:  // gradient and optimizer traffic over Data, DataWithContext, ExpertData, Embedding, World
      return kDataBlocking;
  }
}

// The compute stream's busy time; with framework.moe_a2a_overlap the union of it and the expert stream's (its
// all-to-alls would otherwise count as idle when exposed, where they counted as busy on the compute stream).
double busy_s(const std::vector<model::Op>& ops, const RankTimeline& rank) {
  double busy = 0;
  std::vector<std::pair<double, double>> spans;
  for (const OpSpan& span : rank.spans) {
    const model::Stream stream = ops[span.op].stream;
    if (stream == model::Stream::Expert) spans.emplace_back(span.active_s, span.end_s);
    if (stream != model::Stream::Compute) continue;
    busy += span.end_s - span.active_s;
    spans.emplace_back(span.active_s, span.end_s);
  }
  const bool expert =
      std::any_of(ops.begin(), ops.end(), [](const model::Op& op) { return op.stream == model::Stream::Expert; });
  if (!expert) return busy;  // one ordered stream: its spans never overlap
  std::sort(spans.begin(), spans.end());
  double merged = 0, from = 0, to = -1;
  for (const auto& [start, end] : spans) {
    if (start > to) {
      merged += std::max(0.0, to - from);
      from = start;
      to = end;
    } else {
      to = std::max(to, end);
    }
  }
  return merged + std::max(0.0, to - from);
}

}  // namespace

TimeSplit time_split(const model::Program& program, const RankTimeline& rank, double iteration_time_s) {
  const auto& ops = program.stage_ops[rank.stage];
  struct Event {
    double time;
    int category;
    int delta;
  };
  std::vector<Event> events;
  events.reserve(rank.spans.size() * 2);
  for (const OpSpan& span : rank.spans) {
    const int category = category_of(ops[span.op]);
    // Before `active` a collective or a Recv only waits: that counts as bubble; a compute op waits for the host.
    const double from = span.active_s;
    if (ops[span.op].kind == model::OpKind::Compute && span.active_s > span.start_s) {
      events.push_back({std::max(0.0, span.start_s), kHost, +1});
      events.push_back({std::min(iteration_time_s, span.active_s), kHost, -1});
    }
    if (category < 0 || !(span.end_s > from)) continue;
    events.push_back({std::max(0.0, from), category, +1});
    events.push_back({std::min(iteration_time_s, span.end_s), category, -1});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.time < b.time; });

  std::array<int, kCount> active{};
  std::array<double, kCount + 1> seconds{};  // last slot: bubble
  double now = 0;
  const auto account = [&](double until) {
    if (until <= now) return;
    int winner = kCount;
    for (int category = 0; category < kCount; ++category) {
      if (active[category] > 0) {
        winner = category;
        break;
      }
    }
    seconds[winner] += until - now;
    now = until;
  };
  for (const Event& event : events) {
    account(std::min(event.time, iteration_time_s));
    active[event.category] += event.delta;
  }
  account(iteration_time_s);

  TimeSplit split;
  split.compute_s = seconds[kCompute];
  split.tp_s = seconds[kTensor];
  split.cp_s = seconds[kContext];
  split.ep_s = seconds[kExpert];
  split.dp_s = seconds[kDataBlocking] + seconds[kDataBackground];
  split.pp_s = seconds[kPipeline];
  split.host_s = seconds[kHost];
  split.bubble_s = seconds[kCount];
  return split;
}

ComputeByKind compute_by_kind(const model::Program& program, const RankTimeline& rank, const LayerParts& layer_parts) {
  ComputeByKind seconds{};
  const auto& ops = program.stage_ops[rank.stage];
  for (const OpSpan& span : rank.spans) {
    const model::Op& op = ops[span.op];
    if (category_of(op) != kCompute) continue;  // what time_split counts as compute
    const double duration = std::max(0.0, span.end_s - span.active_s);
    if (op.what == model::ComputeKind::TransformerLayer && layer_parts) {
      const auto parts = layer_parts(op);
      double total = 0;
      for (const auto& part : parts) total += part.second;
      if (total > 0) {
        for (const auto& [what, cost] : parts) seconds[static_cast<std::size_t>(what)] += duration * cost / total;
        continue;
      }
    }
    seconds[static_cast<std::size_t>(op.what)] += duration;
  }
  return seconds;
}

Summary summarize(const model::Program& program, const Timeline& timeline, double peak_flops_per_gpu,
                  const std::string& engine, double gpu_memory_bytes, const LayerParts& layer_parts) {
  const model::Scenario& s = program.scenario;
  Summary summary;
  summary.scenario = s.model.name;
  summary.engine = engine;
  summary.gpus = program.layout.world_size();
  summary.tp = program.layout.tp();
  summary.pp = program.layout.pp();
  summary.dp = program.layout.dp();
  summary.cp = program.layout.cp();
  summary.ep = program.layout.ep();
  summary.micro_batches = static_cast<int>(s.parallel.micro_batches());
  summary.layers = s.model.layers;
  summary.hidden = s.model.hidden;
  summary.heads = s.model.heads;
  summary.seq_len = s.model.seq_len;
  summary.global_batch = s.parallel.global_batch;
  summary.micro_batch = s.parallel.micro_batch;
  summary.hardware = std::string(model::to_string(s.cluster.node));
  summary.precision = model::precision_label(s);
  summary.iteration_time_s = timeline.iteration_time_s;
  summary.peak_flops_per_gpu = peak_flops_per_gpu;
  const double T = timeline.iteration_time_s;
  summary.model_flops = model::reported_flops_per_iteration(s);
  if (T > 0) {
    summary.tflops_per_gpu = summary.model_flops / (T * summary.gpus) / 1e12;
    if (peak_flops_per_gpu > 0) {
      summary.mfu = model::model_flops_per_iteration(s, false) / (T * summary.gpus * peak_flops_per_gpu);
    }
  }

  const model::MemoryEstimate memory = model::estimate_memory(s);
  summary.memory.capacity_bytes = gpu_memory_bytes > 0 ? gpu_memory_bytes : memory.capacity_bytes;
  summary.memory.peak_bytes = memory.peak_bytes;
  summary.memory.fits = memory.peak_bytes <= summary.memory.capacity_bytes;
  for (const model::StageMemory& stage : memory.stages) {
    if (stage.peak_bytes >= memory.peak_bytes) {
      summary.memory.weights_bytes = stage.weights_bytes;
      summary.memory.gradients_bytes = stage.gradients_bytes;
      summary.memory.optimizer_bytes = stage.optimizer_bytes;
      summary.memory.activations_bytes = stage.activations_bytes;
      break;
    }
  }

  // One representative rank per stage: the first recorded one.
  std::vector<const RankTimeline*> representative(program.stages(), nullptr);
  for (const RankTimeline& rank : timeline.ranks) {
    if (rank.stage >= 0 && rank.stage < program.stages() && representative[rank.stage] == nullptr) {
      representative[rank.stage] = &rank;
    }
  }
  double bubble_sum = 0;
  for (int stage = 0; stage < program.stages(); ++stage) {
    const RankTimeline* rank = representative[stage];
    if (rank == nullptr) continue;
    StageSummary entry;
    entry.stage = stage;
    entry.rank = rank->rank;
    entry.busy_s = busy_s(program.stage_ops[stage], *rank);
    entry.idle_s = std::max(0.0, T - entry.busy_s);
    entry.bubble_fraction = T > 0 ? entry.idle_s / T : 0;
    entry.split = time_split(program, *rank, T);
    entry.compute_by_kind = compute_by_kind(program, *rank, layer_parts);
    for (std::size_t kind = 0; kind < model::kComputeKindCount; ++kind)
      summary.compute_by_kind[kind] += entry.compute_by_kind[kind];
    bubble_sum += entry.bubble_fraction;
    summary.split.compute_s += entry.split.compute_s;
    summary.split.tp_s += entry.split.tp_s;
    summary.split.cp_s += entry.split.cp_s;
    summary.split.ep_s += entry.split.ep_s;
    summary.split.dp_s += entry.split.dp_s;
    summary.split.pp_s += entry.split.pp_s;
    summary.split.host_s += entry.split.host_s;
    summary.split.bubble_s += entry.split.bubble_s;
    summary.stages.push_back(entry);
  }
  if (!summary.stages.empty()) {
    const double n = static_cast<double>(summary.stages.size());
    summary.bubble_fraction = bubble_sum / n;
    summary.split.compute_s /= n;
    summary.split.tp_s /= n;
    summary.split.cp_s /= n;
    summary.split.ep_s /= n;
    summary.split.dp_s /= n;
    summary.split.pp_s /= n;
    summary.split.host_s /= n;
    summary.split.bubble_s /= n;
    for (double& seconds : summary.compute_by_kind) seconds /= n;
  }
  return summary;
}

namespace {

nlohmann::json split_to_json(const TimeSplit& split) {
  return {{"compute_s", split.compute_s}, {"tp_s", split.tp_s}, {"cp_s", split.cp_s},     {"ep_s", split.ep_s},
          {"pp_s", split.pp_s},           {"dp_s", split.dp_s}, {"host_s", split.host_s}, {"bubble_s", split.bubble_s}};
}

// Only the kinds the stage ran, by their Program names ("qkv_projection", ...).
nlohmann::json compute_by_kind_to_json(const ComputeByKind& seconds) {
  nlohmann::json json = nlohmann::json::object();
  for (std::size_t kind = 0; kind < model::kComputeKindCount; ++kind) {
    if (seconds[kind] > 0) json[std::string(model::to_string(static_cast<model::ComputeKind>(kind)))] = seconds[kind];
  }
  return json;
}

// The table's groups of kinds, in the order printed.
struct KindGroup {
  const char* label;
  std::vector<model::ComputeKind> kinds;
};
const std::vector<KindGroup>& kind_groups() {
  using model::ComputeKind;
  static const std::vector<KindGroup> groups = {
      {"GEMMs",
       {ComputeKind::QkvProjection, ComputeKind::AttentionProjection, ComputeKind::MlpUp, ComputeKind::MlpDown,
        ComputeKind::LmHead}},
      {"experts and routing",
       {ComputeKind::ExpertUp, ComputeKind::ExpertDown, ComputeKind::Router, ComputeKind::ExpertPermute,
        ComputeKind::ExpertUnpermute, ComputeKind::ExpertSplitsSync}},
      {"attention core", {ComputeKind::AttentionCore}},
      {"layer norms, residuals, activations",
       {ComputeKind::LayerNormAttention, ComputeKind::AttentionResidual, ComputeKind::LayerNormMlp, ComputeKind::Gelu,
        ComputeKind::Swiglu, ComputeKind::MlpResidual, ComputeKind::FinalLayerNorm}},
      {"embedding and loss", {ComputeKind::Embedding, ComputeKind::CrossEntropy}},
      {"optimizer", {ComputeKind::OptimizerStep}},
      {"layers not split", {ComputeKind::TransformerLayer}},
  };
  return groups;
}

}  // namespace

nlohmann::json summary_to_json(const Summary& summary) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageSummary& stage : summary.stages) {
    nlohmann::json entry = {{"stage", stage.stage},
                            {"rank", stage.rank},
                            {"busy_s", stage.busy_s},
                            {"bubble_s", stage.idle_s},
                            {"bubble_fraction", stage.bubble_fraction}};
    entry["time_split"] = split_to_json(stage.split);
    entry["compute_by_kind_s"] = compute_by_kind_to_json(stage.compute_by_kind);
    stages.push_back(std::move(entry));
  }
  const double T = summary.iteration_time_s;
  const auto fraction = [T](double seconds) { return T > 0 ? seconds / T : 0.0; };
  nlohmann::json json;
  json["scenario"] = {{"name", summary.scenario},
                      {"gpus", summary.gpus},
                      {"tp", summary.tp},
                      {"pp", summary.pp},
                      {"dp", summary.dp},
                      {"micro_batches", summary.micro_batches},
                      {"layers", summary.layers},
                      {"hidden", summary.hidden},
                      {"heads", summary.heads},
                      {"seq_len", summary.seq_len},
                      {"global_batch", summary.global_batch},
                      {"micro_batch", summary.micro_batch},
                      {"hardware", summary.hardware}};
  if (summary.cp > 1) json["scenario"]["cp"] = summary.cp;
  if (summary.ep > 1) json["scenario"]["ep"] = summary.ep;
  json["scenario"]["precision"] = summary.precision;
  json["engine"] = summary.engine;
  json["iteration_time_s"] = T;
  json["bubble_fraction"] = summary.bubble_fraction;
  json["tflops_per_gpu"] = summary.tflops_per_gpu;
  json["mfu"] = summary.mfu;
  json["model_flops_per_iteration"] = summary.model_flops;
  json["peak_flops_per_gpu"] = summary.peak_flops_per_gpu;
  json["memory_per_gpu_bytes"] = summary.memory.peak_bytes;
  json["memory"] = {{"weights_bytes", summary.memory.weights_bytes},
                    {"gradients_bytes", summary.memory.gradients_bytes},
                    {"optimizer_bytes", summary.memory.optimizer_bytes},
                    {"activations_bytes", summary.memory.activations_bytes},
                    {"peak_bytes", summary.memory.peak_bytes},
                    {"capacity_bytes", summary.memory.capacity_bytes},
                    {"fits", summary.memory.fits}};
  json["time_split"] = {{"compute", fraction(summary.split.compute_s)}, {"tp", fraction(summary.split.tp_s)},
                        {"cp", fraction(summary.split.cp_s)},           {"ep", fraction(summary.split.ep_s)},
                        {"pp", fraction(summary.split.pp_s)},           {"dp", fraction(summary.split.dp_s)},
                        {"host", fraction(summary.split.host_s)},       {"bubble", fraction(summary.split.bubble_s)}};
  json["compute_by_kind_s"] = compute_by_kind_to_json(summary.compute_by_kind);
  json["stages"] = std::move(stages);
  return json;
}

std::string summary_table(const Summary& s) {
  const double T = s.iteration_time_s;
  const auto percent = [T](double seconds) { return T > 0 ? 100.0 * seconds / T : 0.0; };
  const auto gib = [](double bytes) { return bytes / (1024.0 * 1024 * 1024); };  // as twin graph, search and sweep
  std::string out;
  auto line = std::back_inserter(out);
  const std::string context = s.cp > 1 ? fmt::format(" x CP {}", s.cp) : "";
  // Expert parallelism splits the same ranks again (ep x etp divides tp x cp x dp): beside the grid, not a factor of it.
  const std::string experts = s.ep > 1 ? fmt::format(" (EP {})", s.ep) : "";
  fmt::format_to(line, "{}: {} GPUs, TP {}{} x PP {} x DP {}{}, {}, {} micro-batches per iteration  [{}]\n\n",
                 s.scenario, s.gpus, s.tp, context, s.pp, s.dp, experts,
                 s.precision.empty() ? "bf16" : s.precision, s.micro_batches, s.engine);
  fmt::format_to(line, "  iteration time          {:10.3f} s\n", T);
  fmt::format_to(line, "  model TFLOP/s per GPU   {:10.1f}     (Narayanan's count, as papers quote it)\n",
                 s.tflops_per_gpu);
  fmt::format_to(line, "  MFU                     {:10.1f} %   (72-form model FLOPs over {:.0f} TFLOP/s peak)\n",
                 100 * s.mfu, s.peak_flops_per_gpu / 1e12);
  fmt::format_to(line,
                 "  memory per GPU          {:10.1f} GiB of {:.0f} GiB{} (weights {:.1f}, gradients {:.1f}, optimizer "
                 "{:.1f}, activations {:.1f})\n",
                 gib(s.memory.peak_bytes), gib(s.memory.capacity_bytes), s.memory.fits ? "" : " - DOES NOT FIT",
                 gib(s.memory.weights_bytes), gib(s.memory.gradients_bytes), gib(s.memory.optimizer_bytes),
                 gib(s.memory.activations_bytes));
  fmt::format_to(line,
                 "  bubble (mean of stages) {:10.1f} %   (idle compute stream: exposed PP and DP + fill/drain)\n\n",
                 100 * s.bubble_fraction);
  // The host's share only where the host held the GPU back by a share the table can show (0.05 % and more): every
  // node has a host model (cluster.host_us_per_kernel), hidden behind long kernels on most plans, whose lines stay
  // as they were. The JSON has the share whatever its size.
  const bool host = s.iteration_time_s > 0 && s.split.host_s >= 0.0005 * s.iteration_time_s;
  const std::string host_share = host ? fmt::format(", host {:.1f} %", percent(s.split.host_s)) : "";
  // CP's and EP's exchanges only for plans that have them: a dense plan's lines stay as they were.
  const bool cp = s.cp > 1 || s.split.cp_s > 0, ep = s.ep > 1 || s.split.ep_s > 0;
  const std::string exchanges = (cp ? fmt::format(", CP {:.1f} %", percent(s.split.cp_s)) : "") +
                                (ep ? fmt::format(", EP {:.1f} %", percent(s.split.ep_s)) : "");
  fmt::format_to(line,
                 "  time split (mean of stages): compute {:.1f} %, exposed TP {:.1f} %{}, PP {:.1f} %, DP {:.1f} %, "
                 "fill/drain {:.1f} %{}\n",
                 percent(s.split.compute_s), percent(s.split.tp_s), exchanges, percent(s.split.pp_s),
                 percent(s.split.dp_s), percent(s.split.bubble_s), host_share);
  fmt::format_to(line, "  compute by kernel: {}\n\n", compute_by_kernel_line(s));
  fmt::format_to(line, "  stage   rank    busy s  bubble %  compute %    TP %{}{}    PP %    DP %  fill/drain %{}\n",
                 cp ? "    CP %" : "", ep ? "    EP %" : "", host ? "  host %" : "");
  // A long pipeline's middle stages usually print the same numbers: a run of them is one line, not thirty.
  const auto columns = [&](const StageSummary& stage) {
    return fmt::format("{:9.3f} {:9.1f} {:10.1f} {:7.1f}", stage.busy_s, 100 * stage.bubble_fraction,
                       percent(stage.split.compute_s), percent(stage.split.tp_s)) +
           (cp ? fmt::format(" {:7.1f}", percent(stage.split.cp_s)) : "") +
           (ep ? fmt::format(" {:7.1f}", percent(stage.split.ep_s)) : "") +
           fmt::format(" {:7.1f} {:7.1f} {:12.1f}", percent(stage.split.pp_s), percent(stage.split.dp_s),
                       percent(stage.split.bubble_s)) +
           (host ? fmt::format(" {:7.1f}", percent(stage.split.host_s)) : "");
  };
  for (std::size_t i = 0; i < s.stages.size();) {
    const std::string row = columns(s.stages[i]);
    fmt::format_to(line, "  {:5d} {:6d} {}\n", s.stages[i].stage, s.stages[i].rank, row);
    std::size_t same = i + 1;
    while (same < s.stages.size() && columns(s.stages[same]) == row) ++same;
    if (same - i > 2) {  // two or more repeats; a single one prints as itself
      fmt::format_to(line, "    ...  (stages {} to {} like stage {})\n", s.stages[i + 1].stage,
                     s.stages[same - 1].stage, s.stages[i].stage);
      i = same;
    } else {
      ++i;
    }
  }
  return out;
}

std::string compute_by_kernel_line(const Summary& s) {
  const double T = s.iteration_time_s;
  // The "layers not split" group only where no cost model split the fused layer ops.
  std::string kinds;
  for (const KindGroup& group : kind_groups()) {
    double seconds = 0;
    for (model::ComputeKind kind : group.kinds) seconds += s.compute_by_kind[static_cast<std::size_t>(kind)];
    const bool optional = group.kinds.front() == model::ComputeKind::TransformerLayer ||
                          group.kinds.front() == model::ComputeKind::ExpertUp;  // printed when the model has them
    if (seconds <= 0 && optional) continue;
    fmt::format_to(std::back_inserter(kinds), "{}{} {:.1f} %", kinds.empty() ? "" : ", ", group.label,
                   T > 0 ? 100 * seconds / T : 0.0);
  }
  return kinds;
}

}  // namespace twin::report
