// twin graph SCENARIO: the Program as a readable summary, and as JSON with --json.
#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "model/ops/moe_ops.hpp"
#include "model/program/estimates.hpp"
#include "model/program/program.hpp"
#include "model/program/program_json.hpp"
#ifdef TWIN_HAVE_CHAKRA
#include "measured/chakra.hpp"
#include "measured/kineto.hpp"
#endif

namespace twin::cli {
namespace {

struct GraphOptions {
  ScenarioOptions scenario;
  std::string granularity = "op";
  std::string json_path;
  std::string chakra_directory;
};

std::string gib(double bytes) {
  constexpr double KiB = 1024.0, MiB = KiB * 1024, GiB = MiB * 1024;
  if (bytes >= GiB) return fmt::format("{:.1f} GiB", bytes / GiB);
  if (bytes >= MiB) return fmt::format("{:.1f} MiB", bytes / MiB);
  return fmt::format("{:.1f} KiB", bytes / KiB);
}

std::string human_count(double value) {
  if (value >= 1e12) return fmt::format("{:.2f} T", value / 1e12);
  if (value >= 1e9) return fmt::format("{:.2f} B", value / 1e9);
  if (value >= 1e6) return fmt::format("{:.2f} M", value / 1e6);
  if (value >= 1e3) return fmt::format("{:.2f} K", value / 1e3);
  return fmt::format("{:.0f}", value);
}

void print_summary(const model::Program& program) {
  const model::Scenario& s = program.scenario;
  const auto& p = s.parallel;
  const auto params = model::count_parameters(s);
  fmt::print("scenario      {} ({})\n", s.model.name, s.source);
  std::string block;  // what a GPT-2 block does differently
  if (s.model.position_embedding == model::PositionEmbedding::Alibi) block += ", ALiBi (no position embedding)";
  if (s.model.position_embedding == model::PositionEmbedding::Rope) {
    block += s.model.rotary_fraction < 1
                 ? fmt::format(", rotary positions on {} of {} dimensions", s.model.rotary_dim(), s.model.head_dim())
                 : std::string(", rotary positions");
  }
  if (s.model.norm == model::Norm::RmsNorm) block += ", RMSNorm";
  if (s.model.activation == model::Activation::Swiglu) block += ", SwiGLU";
  if (s.model.key_value_heads() != s.model.heads) {
    block += fmt::format(", {} key/value heads (grouped-query attention)", s.model.key_value_heads());
  }
  if (s.model.head_dim_given > 0) block += fmt::format(", heads of {} dimensions", s.model.head_dim());
  if (!s.model.linear_bias) block += ", no linear biases";
  if (s.model.parallel_residual) {
    block +=
        s.model.shared_norm ? ", attention and MLP in parallel on one layer norm" : ", attention and MLP in parallel";
  }
  fmt::print("model         {} layers, hidden {}, {} heads, ffn {}, seq {}, vocab {} (padded {}), {}{}\n",
             s.model.layers, s.model.hidden, s.model.heads, s.ffn_hidden(), s.model.seq_len, s.model.vocab,
             s.padded_vocab(), model::to_string(s.model.dtype), block);
  if (s.model.is_moe()) {
    const auto moe = model::count_moe_parameters(s);
    fmt::print("parameters    {} ({:.0f}), {} active per token\n", human_count(moe.total), moe.total,
               human_count(moe.active));
    fmt::print("experts       {} routed (top {}) of width {}, {} shared, the first {} layers dense; ep {} x etp {}\n",
               s.model.experts, s.model.top_k, s.moe_ffn_hidden(), s.model.shared_experts, s.model.dense_layers, p.ep,
               p.etp);
  } else {
    fmt::print("parameters    {} ({:.0f})\n", human_count(params.total), params.total);
  }
  fmt::print("plan          tp {} x pp {} x dp {} = {} ranks on {} x {} ({} per node)\n", p.tp, p.pp, p.dp,
             p.world_size(), s.cluster.nodes, model::to_string(s.cluster.node), s.cluster.gpus_per_node);
  fmt::print("schedule      {}{}, {} micro-batches of {} per pipeline, recompute {}, sequence parallel {}, ZeRO-{}\n",
             model::to_string(p.schedule),
             p.virtual_stages > 1 ? fmt::format(" (v = {})", p.virtual_stages) : std::string(), p.micro_batches(),
             p.micro_batch,
             p.recompute_num_layers > 0 && p.recompute == model::Recompute::Full
                 ? fmt::format("full (the first {} layers of a chunk)", p.recompute_num_layers)
                 : std::string(model::to_string(p.recompute)),
             p.sequence_parallel ? "on" : "off", p.zero_stage);
  const double program_flops = program.total_flops();
  const double narayanan = model::reported_flops_per_iteration(s);
  fmt::print("FLOPs/iter    {:.4e} in the Program's GEMMs; Narayanan's formula {:.4e} ({:+.3f}%)\n", program_flops,
             narayanan, 100.0 * (program_flops / narayanan - 1.0));

  std::size_t fewest = SIZE_MAX, most = 0;
  for (int stage = 0; stage < program.stages(); ++stage) {
    fewest = std::min(fewest, program.ops_per_rank(stage));
    most = std::max(most, program.ops_per_rank(stage));
  }
  fmt::print("ops           {} per rank ({} granularity), {} in all\n",
             fewest == most ? fmt::format("{}", most) : fmt::format("{} to {}", fewest, most),
             model::to_string(program.granularity), program.total_ops());

  const auto memory = model::estimate_memory(s);
  fmt::print("\nmemory per GPU (capacity {}):\n", gib(memory.capacity_bytes));
  fmt::print("  stage  layers  params    weights   grads     optimizer activ.    in-flight  peak\n");
  for (const auto& m : memory.stages) {
    fmt::print("  {:>5}  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}  {:>8}{}\n", m.stage, s.layers_on_stage(m.stage),
               human_count(m.parameters),
               gib(m.weights_bytes), gib(m.gradients_bytes), gib(m.optimizer_bytes), gib(m.activations_bytes),
               m.in_flight_micro_batches, gib(m.peak_bytes), m.peak_bytes > memory.capacity_bytes ? "  > capacity" : "");
  }
  fmt::print("fits          {} (peak {} of {})\n", memory.fits ? "yes" : "NO", gib(memory.peak_bytes),
             gib(memory.capacity_bytes));
}

// What --chakra writes, estimated before writing it: about 200 bytes per op (measured: `twin graph --chakra` wrote 197
// bytes per op for gpt-tiny and 202 for gpt3-175b on one node). Refused when the file system has not that much free,
// said up front past 200 MB (gpt3-175b's 1024 ranks: about 9 GB).
void check_chakra_size(const model::Program& program, const std::string& directory) {
  constexpr double kBytesPerOp = 200, kSayPastBytes = 200e6;
  const double bytes = kBytesPerOp * static_cast<double>(program.total_ops());
  std::filesystem::path existing = std::filesystem::absolute(directory);
  std::error_code error;
  while (!std::filesystem::exists(existing, error) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  struct statvfs disk {};
  if (::statvfs(existing.c_str(), &disk) == 0) {
    const double free_bytes = static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize);
    if (bytes > free_bytes) {
      throw UserError(fmt::format("--chakra '{}': the traces of {} ranks would take about {:.1f} GB ({} ops at about "
                                  "{:.0f} bytes each) but '{}' has {:.1f} GB free",
                                  directory, program.layout.world_size(), bytes / 1e9, program.total_ops(),
                                  kBytesPerOp, existing.string(), free_bytes / 1e9));
    }
  }
  if (bytes > kSayPastBytes) {
    fmt::print(stderr, "twin graph: writing Chakra traces of {} ranks, about {:.1f} GB ({} ops at about {:.0f} bytes)\n",
               program.layout.world_size(), bytes / 1e9, program.total_ops(), kBytesPerOp);
  }
}

}  // namespace

void register_graph_command(CLI::App& app) {
  auto options = std::make_shared<GraphOptions>();
  CLI::App* command = app.add_subcommand("graph", "build the Program of a scenario and summarise it (ranks, ops, "
                                                  "FLOPs, parameters, memory per GPU)");
  add_scenario_options(*command, options->scenario);
  command->add_option("--granularity", options->granularity, "op (every kernel) or layer (one op per layer and phase)")
      ->check(CLI::IsMember({"op", "layer"}));
  command->add_option("--json", options->json_path, "write the Program (per stage: schedule and ops) as JSON")
      ->check(output_file());
  command->add_option("--chakra", options->chakra_directory,
                      "write the Program as Chakra execution traces (MLCommons; one file per rank, DIR/twin.RANK.et, "
                      "and DIR/twin.comm_groups.json), for ASTRA-sim");
  command->callback([options] {
    const model::Scenario scenario = load_scenario(options->scenario);
    require_outputs_before_work({{"--json", options->json_path}}, {scenario_input(options->scenario)});
    const auto granularity = options->granularity == "layer" ? model::Granularity::Layer : model::Granularity::Op;
    const model::Program program = build_program_within_memory(scenario, granularity);
    print_summary(program);
    if (!options->json_path.empty()) {
      write_file_atomically(options->json_path, model::program_to_json(program).dump(1) + "\n");
      fmt::print("\nProgram written to {}\n", options->json_path);
    }
    if (!options->chakra_directory.empty()) {
#ifdef TWIN_HAVE_CHAKRA
      try {
        check_chakra_size(program, options->chakra_directory);
        const auto files = measured::write_chakra(program, options->chakra_directory);
        fmt::print("\nChakra execution traces of {} ranks written to {}/twin.RANK.et (groups: twin.comm_groups.json)\n",
                   files.size() - 1, options->chakra_directory);
      } catch (const measured::MeasuredError& error) {
        throw UserError(error.what());
      }
#else
      throw UserError("--chakra: this twin was built without protobuf (apt install libprotobuf-dev protobuf-compiler)");
#endif
    }
  });
}

}  // namespace twin::cli
