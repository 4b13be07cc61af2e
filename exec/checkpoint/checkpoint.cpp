#include "exec/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "exec/checkpoint/io.hpp"
#include "exec/core/errors.hpp"
#include "model/program/program.hpp"
#include "model/scenario/files.hpp"

namespace twin::exec {

namespace fs = std::filesystem;

namespace {

constexpr char kShardMagic[8] = {'T', 'W', 'I', 'N', 'S', 'H', 'R', 'D'};
constexpr std::uint32_t kShardVersion = 1;
// A bucket's flags in a shard file (version 1 wrote 0 or 1: the first flag alone).
constexpr std::uint32_t kHasMasterWeights = 1;
// ZeRO-3: the file holds this rank's shard of the parameters, as of the Adam state, not the whole bucket: outside
// its gathers a rank has nothing else (the rest is NaN), and every rank's file together holds the model once.
constexpr std::uint32_t kParameterShardOnly = 2;
constexpr const char* kManifestFormat = "twin-checkpoint";
constexpr int kManifestVersion = 1;

// FNV-1a 64 of the losses' IEEE bits, in order (JSON writes doubles so that they read back exactly; a skipped step's
// NaN, written as null, counts as the one quiet NaN).
std::uint64_t losses_checksum(std::vector<double> losses) {
  for (double& loss : losses) {
    if (std::isnan(loss)) loss = std::numeric_limits<double>::quiet_NaN();
  }
  return fnv1a(reinterpret_cast<const char*>(losses.data()), losses.size() * sizeof(double));
}

// Reads the manifest's fields, each checked for presence, type and range before it is converted (a JSON 1e30 or -5
// must not wrap around into a plausible step or size); an error names the field and its value as written.
class ManifestFields {
 public:
  explicit ManifestFields(const fs::path& path) : path_(path) {}

  const nlohmann::json& at(const nlohmann::json& object, const std::string& key, const std::string& field) const {
    if (!object.is_object() || !object.contains(key)) {
      throw RunError(fmt::format("checkpoint manifest '{}' is corrupt: it has no {}", path_.string(), field));
    }
    return object.at(key);
  }

  template <typename T>
  T whole_number(const nlohmann::json& object, const std::string& key, const std::string& field,
                 T min = std::numeric_limits<T>::min(), T max = std::numeric_limits<T>::max()) const {
    const nlohmann::json& value = at(object, key, field);
    auto within = [&](auto v) { return std::cmp_less_equal(min, v) && std::cmp_less_equal(v, max); };
    if (value.is_number_unsigned()) {
      if (within(value.get<std::uint64_t>())) return static_cast<T>(value.get<std::uint64_t>());
    } else if (value.is_number_integer()) {
      if (within(value.get<std::int64_t>())) return static_cast<T>(value.get<std::int64_t>());
    }
    corrupt(field, value, fmt::format("a whole number from {} to {}", min, max));
  }

  std::string text(const nlohmann::json& object, const std::string& key, const std::string& field) const {
    const nlohmann::json& value = at(object, key, field);
    if (!value.is_string()) corrupt(field, value, "a string");
    return value.get<std::string>();
  }

  // A 64-bit checksum written as hex digits.
  std::uint64_t hex64(const nlohmann::json& object, const std::string& key, const std::string& field) const {
    const nlohmann::json& value = at(object, key, field);
    std::uint64_t parsed = 0;
    if (value.is_string()) {
      const std::string& digits = value.get_ref<const std::string&>();
      const char* last = digits.data() + digits.size();
      const auto [end, error] = std::from_chars(digits.data(), last, parsed, 16);
      if (!digits.empty() && digits.size() <= 16 && error == std::errc() && end == last) return parsed;
    }
    corrupt(field, value, "up to 16 hexadecimal digits");
  }

  [[noreturn]] void corrupt(const std::string& field, const nlohmann::json& value, const std::string& expected) const {
    throw RunError(fmt::format("checkpoint manifest '{}' is corrupt: {} is {}, expected {}", path_.string(), field,
                               value.dump(), expected));
  }

 private:
  const fs::path& path_;
};

std::vector<float> download(Backend& backend, const Tensor& t) {
  std::vector<float> host(t.numel);
  if (t.numel > 0) backend.download_f32(host.data(), t);
  return host;
}

}  // namespace

fs::path step_directory(const fs::path& dir, int step) {
  return dir / fmt::format("step-{:08d}", step);
}

std::string shard_file_name(int rank) {
  return fmt::format("rank-{:05d}.bin", rank);
}

ShardRecord write_shard(const fs::path& step_dir, int rank, int world_size, int step, const ModelShard& shard,
                        Backend& backend, const std::string& kill_writing) {
  std::error_code error;
  if (fs::is_symlink(fs::symlink_status(step_dir, error))) {  // no link is followed out of the checkpoint folder
    throw RunFailure(fmt::format("checkpoint: '{}' is a symbolic link: twin writes no checkpoint through it",
                                 step_dir.string()));
  }
  fs::create_directories(step_dir, error);
  if (error) throw RunFailure(fmt::format("checkpoint: cannot create '{}': {}", step_dir.string(), error.message()));
  std::string out(kShardMagic, sizeof(kShardMagic));
  put(out, kShardVersion);
  put(out, static_cast<std::uint32_t>(rank));
  put(out, static_cast<std::uint32_t>(world_size));
  put(out, static_cast<std::uint32_t>(shard.buckets().size()));
  put(out, static_cast<std::uint64_t>(step));
  for (const Bucket& b : shard.buckets()) {
    put(out, static_cast<std::uint32_t>(b.name.size()));
    out += b.name;
    put(out, static_cast<std::uint64_t>(b.padded_numel));
    put(out, static_cast<std::uint64_t>(b.shard_offset));
    put(out, static_cast<std::uint64_t>(b.shard_numel));
    put(out, (b.master.empty() ? 0 : kHasMasterWeights) | (b.parameters_sharded ? kParameterShardOnly : 0));
    const Tensor params = b.parameters_sharded ? b.params.slice(b.shard_offset, b.shard_numel) : b.params;
    for (const Tensor* t : {&params, &b.adam_m, &b.adam_v, &b.master}) {
      if (t->empty()) continue;
      const std::vector<float> host = download(backend, *t);
      out.append(reinterpret_cast<const char*>(host.data()), host.size() * sizeof(float));
    }
  }
  ShardRecord record;
  record.rank = rank;
  record.file = shard_file_name(rank);
  record.bytes = out.size();
  record.checksum = fnv1a(out.data(), out.size());
  write_atomically(step_dir / record.file, out, kill_writing);
  return record;
}

void write_manifest(const fs::path& step_dir, const Manifest& m, const std::string& kill_writing) {
  nlohmann::json json;
  json["format"] = kManifestFormat;
  json["version"] = kManifestVersion;
  json["step"] = m.step;
  json["world_size"] = m.world_size;
  json["scenario_toml"] = m.scenario_toml;
  json["data"] = {{"path", m.data_path}, {"bytes", m.data_bytes}, {"fnv1a64", hex(m.data_fingerprint)}};
  json["data_position"] = {{"next_step", m.step}};
  json["rng"] = {{"seed", m.seed}, {"kind", "counter-based (seed, stream, index): the step is the whole state"}};
  json["losses"] = m.losses;
  json["losses_fnv1a64"] = hex(losses_checksum(m.losses));
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardRecord& s : m.shards) {
    shards.push_back({{"rank", s.rank}, {"file", s.file}, {"bytes", s.bytes}, {"fnv1a64", hex(s.checksum)}});
  }
  json["shards"] = std::move(shards);
  if (!m.fp8_states.empty()) {
    nlohmann::json fp8 = nlohmann::json::array();
    for (const ShardRecord& s : m.fp8_states) {
      fp8.push_back({{"rank", s.rank}, {"file", s.file}, {"bytes", s.bytes}, {"fnv1a64", hex(s.checksum)}});
    }
    json["fp8_states"] = std::move(fp8);
  }
  write_atomically(step_dir / "manifest.json", json.dump(2) + "\n", kill_writing);
}

Manifest read_manifest(const fs::path& step_dir) {
  const fs::path path = step_dir / "manifest.json";
  const std::string text = read_file(path, model::kMaxManifestBytes);
  const ManifestFields fields(path);
  Manifest m;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    if (!json.is_object() || json.value("format", std::string()) != kManifestFormat) {
      throw RunError(fmt::format("'{}' is not a twin checkpoint manifest (format {})", path.string(),
                                 json.is_object() && json.contains("format") ? json["format"].dump() : "missing"));
    }
    const auto version = fields.whole_number<std::int64_t>(json, "version", "version");
    if (version != kManifestVersion) {
      throw RunError(fmt::format("checkpoint manifest '{}' has version {}, this twin reads version {}", path.string(),
                                 version, kManifestVersion));
    }
    m.step = fields.whole_number<int>(json, "step", "step", 0);
    m.world_size = fields.whole_number<int>(json, "world_size", "world_size", 1);
    m.scenario_toml = fields.text(json, "scenario_toml", "scenario_toml");
    const nlohmann::json& data = fields.at(json, "data", "data");
    m.data_path = fields.text(data, "path", "data.path");
    m.data_bytes = fields.whole_number<std::uint64_t>(data, "bytes", "data.bytes");
    m.data_fingerprint = fields.hex64(data, "fnv1a64", "data.fnv1a64");
    m.seed = fields.whole_number<std::uint64_t>(fields.at(json, "rng", "rng"), "seed", "rng.seed");
    if (json.contains("losses")) {
      const nlohmann::json& losses = json["losses"];
      if (!losses.is_array()) fields.corrupt("losses", losses, "a list");
      for (const nlohmann::json& loss : losses) {
        if (!loss.is_null() && !loss.is_number()) fields.corrupt("losses", loss, "numbers (null: a skipped step)");
        m.losses.push_back(loss.is_null() ? std::numeric_limits<double>::quiet_NaN() : loss.get<double>());
      }
    }
    // Written since the losses were covered: a manifest without it is older and still read.
    if (json.contains("losses_fnv1a64") &&
        fields.hex64(json, "losses_fnv1a64", "losses_fnv1a64") != losses_checksum(m.losses)) {
      throw RunError(
          fmt::format("checkpoint manifest '{}' is corrupt: its losses do not match losses_fnv1a64 {} "
                      "(edited or damaged)",
                      path.string(), json["losses_fnv1a64"].get<std::string>()));
    }
    auto records = [&](const std::string& key, std::vector<ShardRecord>& into) {
      const nlohmann::json& list = fields.at(json, key, key);
      if (!list.is_array()) fields.corrupt(key, list, "a list");
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string field = fmt::format("{}[{}]", key, i);
        into.push_back(ShardRecord{fields.whole_number<int>(list[i], "rank", field + ".rank", 0, m.world_size - 1),
                                   fields.text(list[i], "file", field + ".file"),
                                   fields.whole_number<std::uint64_t>(list[i], "bytes", field + ".bytes"),
                                   fields.hex64(list[i], "fnv1a64", field + ".fnv1a64")});
      }
    };
    records("shards", m.shards);
    // FP8 delayed scaling's state files, since checkpoints keep it: absent otherwise (and in older checkpoints)
    if (json.contains("fp8_states")) records("fp8_states", m.fp8_states);
  } catch (const RunError&) {
    throw;
  } catch (const std::exception& error) {
    throw RunError(fmt::format("checkpoint manifest '{}' is corrupt or truncated: {}", path.string(), error.what()));
  }
  if (static_cast<int>(m.shards.size()) != m.world_size) {
    throw RunError(fmt::format("checkpoint manifest '{}' lists {} shards for a world of {} ranks", path.string(),
                               m.shards.size(), m.world_size));
  }
  if (!m.fp8_states.empty() && static_cast<int>(m.fp8_states.size()) != m.world_size) {
    throw RunError(fmt::format("checkpoint manifest '{}' lists {} fp8_states for a world of {} ranks", path.string(),
                               m.fp8_states.size(), m.world_size));
  }
  // A folder copied or renamed to another step would resume from the wrong place and, being "newer", make the cleanup
  // of old checkpoints remove the real ones.
  const std::optional<int> named = step_of_directory_name(step_dir.filename().string());
  if (named != m.step) {
    throw RunError(fmt::format(
        "checkpoint '{}' {} but its manifest says step {} (was it copied or renamed?): remove it, or rename it to {} "
        "if that is what it holds",
        step_dir.string(), named ? fmt::format("is named for step {}", *named) : "is not named step-NNNNNNNN", m.step,
        step_directory("", m.step).string()));
  }
  return m;
}

model::Scenario checkpoint_scenario(const Manifest& m, const fs::path& step_dir) {
  const fs::path manifest_path = step_dir / "manifest.json";
  try {
    return model::parse_scenario(m.scenario_toml, manifest_path.string());
  } catch (const model::ScenarioError& error) {
    throw RunError(
        fmt::format("checkpoint manifest '{}': its scenario does not load: {}", manifest_path.string(), error.what()));
  }
}

std::string plan_text(const model::Scenario& s) {
  const auto& p = s.parallel;
  const std::string cp = p.cp > 1 ? fmt::format(" x CP {}", p.cp) : std::string();
  return fmt::format("TP {} x PP {} x DP {}{}", p.tp, p.pp, p.dp, cp);
}

bool same_layout(const model::Scenario& then, const model::Scenario& now) {
  const auto& a = then.parallel;
  const auto& b = now.parallel;
  return a.tp == b.tp && a.pp == b.pp && a.dp == b.dp && a.cp == b.cp && a.ep == b.ep && a.etp == b.etp &&
         a.virtual_stages == b.virtual_stages && a.first_stage_layers == b.first_stage_layers &&
         a.last_stage_layers == b.last_stage_layers && a.zero_stage == b.zero_stage &&
         then.shards_parameters() == now.shards_parameters() && then.padded_vocab() == now.padded_vocab();
}

std::vector<std::string> check_compatible(const Manifest& m, const fs::path& step_dir, const model::Scenario& now,
                                          const std::string& data_path, std::uint64_t data_fingerprint) {
  const model::Scenario then = checkpoint_scenario(m, step_dir);
  std::vector<std::string> refused, notes;
  auto compare = [](std::vector<std::string>& into, std::string_view key, const auto& before, const auto& after) {
    if (before != after) into.push_back(fmt::format("{}: {} in the checkpoint, {} now", key, before, after));
  };
  compare(refused, "model.layers", then.model.layers, now.model.layers);
  compare(refused, "model.hidden", then.model.hidden, now.model.hidden);
  compare(refused, "model.heads", then.model.heads, now.model.heads);
  compare(refused, "model.ffn_hidden", then.ffn_hidden(), now.ffn_hidden());
  compare(refused, "model.seq_len", then.model.seq_len, now.model.seq_len);
  compare(refused, "model.vocab", then.model.vocab, now.model.vocab);
  compare(refused, "model.dtype", model::to_string(then.model.dtype), model::to_string(now.model.dtype));
  compare(refused, "model.position_embedding", model::to_string(then.model.position_embedding),
          model::to_string(now.model.position_embedding));
  // The Llama-style keys change which tensors a layer holds and what they mean.
  compare(refused, "model.norm", model::to_string(then.model.norm), model::to_string(now.model.norm));
  compare(refused, "model.activation", model::to_string(then.model.activation), model::to_string(now.model.activation));
  compare(refused, "model.kv_heads", then.model.key_value_heads(), now.model.key_value_heads());
  compare(refused, "model.linear_bias", then.model.linear_bias, now.model.linear_bias);
  compare(refused, "model.parallel_residual", then.model.parallel_residual, now.model.parallel_residual);
  compare(refused, "model.shared_norm", then.model.shared_norm, now.model.shared_norm);
  compare(refused, "model.rotary_fraction", then.model.rotary_fraction, now.model.rotary_fraction);
  compare(refused, "model.experts", then.model.experts, now.model.experts);  // MoE: other tensors
  if (now.model.is_moe()) {
    compare(refused, "model.top_k", then.model.top_k, now.model.top_k);
    compare(refused, "model.moe_ffn_hidden", then.moe_ffn_hidden(), now.moe_ffn_hidden());
    compare(refused, "model.shared_experts", then.model.shared_experts, now.model.shared_experts);
    compare(refused, "model.dense_layers", then.model.dense_layers, now.model.dense_layers);
  }
  // The sequences of step i are (seed, i * global_batch + j): another global batch is another data order.
  compare(refused, "parallel.global_batch", then.parallel.global_batch, now.parallel.global_batch);
  compare(refused, "framework.tied_embeddings", then.framework.tied_embeddings, now.framework.tied_embeddings);
  compare(refused, "training.seed", then.training.seed, now.training.seed);
  if (m.data_fingerprint != data_fingerprint) {
    refused.push_back(
        fmt::format("data: the checkpoint was trained on '{}' (fnv1a64 {}), this run reads '{}' "
                    "(fnv1a64 {})",
                    m.data_path, hex(m.data_fingerprint), data_path, hex(data_fingerprint)));
  }
  if (!refused.empty()) {
    std::string message = fmt::format(
        "checkpoint '{}' was written by another model, global batch or data set and cannot be resumed here (use "
        "another --checkpoint directory):",
        step_dir.string());
    for (const auto& line : refused) message += "\n  " + line;
    throw RunError(message);
  }
  // The plan: the same model and data under another layout are re-sharded (reshard), the same math in another order.
  compare(notes, "parallel.tp", then.parallel.tp, now.parallel.tp);
  compare(notes, "parallel.pp", then.parallel.pp, now.parallel.pp);
  compare(notes, "parallel.dp", then.parallel.dp, now.parallel.dp);
  compare(notes, "parallel.cp", then.parallel.cp, now.parallel.cp);
  compare(notes, "parallel.ep", then.parallel.ep, now.parallel.ep);
  compare(notes, "parallel.virtual_stages", then.parallel.virtual_stages, now.parallel.virtual_stages);
  compare(notes, "parallel.first_stage_layers", then.parallel.first_stage_layers, now.parallel.first_stage_layers);
  compare(notes, "parallel.last_stage_layers", then.parallel.last_stage_layers, now.parallel.last_stage_layers);
  compare(notes, "parallel.zero_stage", then.parallel.zero_stage, now.parallel.zero_stage);
  compare(notes, "padded vocabulary (parallel.vocab_pad_multiple)", then.padded_vocab(), now.padded_vocab());
  compare(notes, "parallel.micro_batch", then.parallel.micro_batch, now.parallel.micro_batch);
  compare(notes, "parallel.schedule", model::to_string(then.parallel.schedule),
          model::to_string(now.parallel.schedule));
  compare(notes, "parallel.recompute", model::to_string(then.parallel.recompute),
          model::to_string(now.parallel.recompute));
  compare(notes, "parallel.sequence_parallel", then.parallel.sequence_parallel, now.parallel.sequence_parallel);
  compare(notes, "training.learning_rate", then.training.learning_rate, now.training.learning_rate);
  compare(notes, "training.min_learning_rate", then.training.min_learning_rate, now.training.min_learning_rate);
  compare(notes, "training.warmup_steps", then.training.warmup_steps, now.training.warmup_steps);
  compare(notes, "training.decay_steps", then.training.decay_steps, now.training.decay_steps);
  compare(notes, "training.weight_decay", then.training.weight_decay, now.training.weight_decay);
  compare(notes, "training.grad_clip", then.training.grad_clip, now.training.grad_clip);
  compare(notes, "training.adam_beta1", then.training.adam_beta1, now.training.adam_beta1);
  compare(notes, "training.adam_beta2", then.training.adam_beta2, now.training.adam_beta2);
  compare(notes, "training.adam_eps", then.training.adam_eps, now.training.adam_eps);
  return notes;
}

void read_shard(const fs::path& step_dir, const Manifest& m, int rank, ModelShard& shard, Backend& backend) {
  const ShardRecord* record = nullptr;
  for (const ShardRecord& s : m.shards) {
    if (s.rank == rank) record = &s;
  }
  const fs::path manifest_path = step_dir / "manifest.json";
  if (record == nullptr) {
    throw RunError(fmt::format("checkpoint manifest '{}' has no shard for rank {}", manifest_path.string(), rank));
  }
  const fs::path path = step_dir / record->file;
  const std::string bytes = read_file(path);
  if (bytes.size() < record->bytes) {
    throw RunError(fmt::format("checkpoint shard '{}' is truncated: {} bytes, the manifest says {}", path.string(),
                               bytes.size(), record->bytes));
  }
  if (bytes.size() != record->bytes || fnv1a(bytes.data(), bytes.size()) != record->checksum) {
    throw RunError(fmt::format(
        "checkpoint shard '{}' is corrupt: {} bytes with checksum {}, the manifest says {} bytes "
        "with checksum {}",
        path.string(), bytes.size(), hex(fnv1a(bytes.data(), bytes.size())), record->bytes, hex(record->checksum)));
  }
  BinaryReader in(bytes, path, "shard");
  char magic[sizeof(kShardMagic)];
  in.take(magic, sizeof(magic));
  if (std::memcmp(magic, kShardMagic, sizeof(magic)) != 0 || in.get<std::uint32_t>() != kShardVersion) {
    throw RunError(fmt::format("'{}' is not a twin checkpoint shard (version {})", path.string(), kShardVersion));
  }
  const auto file_rank = in.get<std::uint32_t>();
  const auto file_world = in.get<std::uint32_t>();
  const auto buckets = in.get<std::uint32_t>();
  const auto step = in.get<std::uint64_t>();
  if (static_cast<int>(file_rank) != rank || static_cast<int>(file_world) != m.world_size ||
      step != static_cast<std::uint64_t>(m.step)) {
    throw RunError(
        fmt::format("checkpoint shard '{}' belongs to rank {} of {} at step {}, expected rank {} of {} at "
                    "step {}",
                    path.string(), file_rank, file_world, step, rank, m.world_size, m.step));
  }
  if (buckets != shard.buckets().size()) {
    throw RunError(fmt::format("checkpoint shard '{}' holds {} parameter buckets, rank {} of this plan has {}",
                               path.string(), buckets, rank, shard.buckets().size()));
  }
  for (Bucket& b : shard.buckets()) {
    const std::string name = in.take_string(in.get<std::uint32_t>());
    const auto padded = in.get<std::uint64_t>(), offset = in.get<std::uint64_t>(), numel = in.get<std::uint64_t>();
    const auto flags = in.get<std::uint32_t>();
    const bool has_master = (flags & kHasMasterWeights) != 0, parameter_shard_only = (flags & kParameterShardOnly) != 0;
    if (name != b.name || padded != b.padded_numel || offset != b.shard_offset || numel != b.shard_numel ||
        parameter_shard_only != b.parameters_sharded || (flags & ~(kHasMasterWeights | kParameterShardOnly)) != 0) {
      auto parameters = [](bool shard_only) { return shard_only ? "its shard of the parameters" : "every parameter"; };
      throw RunError(
          fmt::format("checkpoint shard '{}': bucket '{}' ({} parameters, shard {}+{}, {}) does not match this "
                      "plan's '{}' ({} parameters, shard {}+{}, {})",
                      path.string(), name, padded, offset, numel, parameters(parameter_shard_only), b.name,
                      b.padded_numel, b.shard_offset, b.shard_numel, parameters(b.parameters_sharded)));
    }
    Tensor params = b.parameters_sharded ? b.params.slice(b.shard_offset, b.shard_numel) : b.params;
    for (Tensor* t : {&params, &b.adam_m, &b.adam_v}) {
      std::vector<float> host(t->numel);
      in.take(host.data(), host.size() * sizeof(float));
      backend.upload_f32(*t, host.data());
    }
    if (has_master) {
      std::vector<float> host(b.shard_numel);
      in.take(host.data(), host.size() * sizeof(float));
      if (!b.master.empty()) backend.upload_f32(b.master, host.data());
    }
    shard.free_other_shards(b);  // ZeRO-3: as after initialisation, only this rank's shard is held
  }
  if (!in.at_end()) throw RunError(fmt::format("checkpoint shard '{}' has trailing bytes", path.string()));
}

void reshard(const fs::path& step_dir, const Manifest& m, const model::Scenario& then, ModelShard& shard,
             Backend& backend) {
  // The full tensors this rank holds a part of, by name (the tied word embedding and its last-stage copy share one):
  // the values, and Adam's state and the master weights of the elements some rank of the old plan owned.
  struct FullTensor {
    std::vector<float> value, adam_m, adam_v, master;
    std::vector<unsigned char> has_value, has_state;  // has_value: 0 none, 1 a replica's copy, 2 its owner's
  };
  std::map<std::string, FullTensor> wanted;
  for (const Bucket& b : shard.buckets()) {
    for (const ParamTensor& t : b.tensors) {
      FullTensor& f = wanted[t.name];
      const auto n = static_cast<std::size_t>(t.rows * t.cols);
      for (auto* v : {&f.value, &f.adam_m, &f.adam_v, &f.master}) v->assign(n, 0.0f);
      f.has_value.assign(n, 0);
      f.has_state.assign(n, 0);
    }
  }
  const model::RankLayout old_layout = model::rank_layout(then);
  if (old_layout.world_size() != m.world_size) {
    throw RunError(fmt::format("checkpoint manifest '{}' says world_size {}, but its plan {} has {} ranks",
                               (step_dir / "manifest.json").string(), m.world_size, plan_text(then),
                               old_layout.world_size()));
  }
  // Every old rank whose stage holds one of those tensors: its shard read (and checked) as read_shard reads it, and
  // each of its local elements put where it sits in the full tensor.
  for (int old_rank = 0; old_rank < m.world_size; ++old_rank) {
    ModelShard old(then, old_layout.coord_of(old_rank), backend);
    bool needed = false;
    for (const Bucket& b : old.buckets()) {
      for (const ParamTensor& t : b.tensors) needed = needed || wanted.count(t.name) > 0;
    }
    if (!needed) continue;
    read_shard(step_dir, m, old_rank, old, backend);
    for (const Bucket& b : old.buckets()) {
      const std::vector<float> params = download(backend, b.params), adam_m = download(backend, b.adam_m),
                               adam_v = download(backend, b.adam_v);
      const std::vector<float> master = b.master.empty() ? std::vector<float>() : download(backend, b.master);
      const std::size_t owned_begin = b.shard_offset, owned_end = b.shard_offset + b.shard_numel;
      for (const ParamTensor& t : b.tensors) {
        const auto it = wanted.find(t.name);
        if (it == wanted.end()) continue;
        FullTensor& f = it->second;
        for (std::size_t i = 0; i < t.numel; ++i) {
          const std::size_t at = t.offset + i;
          const bool owned = at >= owned_begin && at < owned_end;
          if (b.parameters_sharded && !owned) continue;  // ZeRO-3: freed (NaN) outside the rank's shard
          const std::int64_t full = full_element_index(t, old.dims(), i);
          if (full < 0) continue;  // a padded vocabulary row
          const auto e = static_cast<std::size_t>(full);
          // The owner's value is the one its optimizer step wrote; another DP rank's copy is only as fresh as the
          // last all-gather, so it fills in where no owner has been read yet and never replaces an owner's.
          const unsigned char source = owned ? 2 : 1;
          if (f.has_value[e] <= source) f.value[e] = params[at];
          f.has_value[e] = std::max(f.has_value[e], source);
          if (!owned) continue;
          f.adam_m[e] = adam_m[at - owned_begin];
          f.adam_v[e] = adam_v[at - owned_begin];
          f.master[e] = master.empty() ? params[at] : master[at - owned_begin];
          f.has_state[e] = 1;
        }
      }
    }
  }
  // This rank's elements of them, in its own layout (padded vocabulary rows and bucket padding stay zero).
  for (Bucket& b : shard.buckets()) {
    std::vector<float> params(b.padded_numel, 0.0f), adam_m(b.shard_numel, 0.0f), adam_v(b.shard_numel, 0.0f),
        master(b.shard_numel, 0.0f);
    const std::size_t owned_begin = b.shard_offset, owned_end = b.shard_offset + b.shard_numel;
    for (const ParamTensor& t : b.tensors) {
      const FullTensor& f = wanted.at(t.name);
      for (std::size_t i = 0; i < t.numel; ++i) {
        const std::int64_t full = full_element_index(t, shard.dims(), i);
        if (full < 0) continue;
        const auto e = static_cast<std::size_t>(full);
        const std::size_t at = t.offset + i;
        const bool owned = at >= owned_begin && at < owned_end;
        if (!f.has_value[e] || (owned && !f.has_state[e])) {
          throw RunError(
              fmt::format("checkpoint '{}' ({}) holds no {} of {} element {}: its shards do not cover the model this "
                          "run re-shards them into",
                          step_dir.string(), plan_text(then), f.has_value[e] ? "Adam state" : "value", t.name, e));
        }
        params[at] = f.value[e];
        if (!owned) continue;
        adam_m[at - owned_begin] = f.adam_m[e];
        adam_v[at - owned_begin] = f.adam_v[e];
        master[at - owned_begin] = f.master[e];
      }
    }
    backend.upload_f32(b.params, params.data());
    backend.upload_f32(b.adam_m, adam_m.data());
    backend.upload_f32(b.adam_v, adam_v.data());
    if (!b.master.empty()) backend.upload_f32(b.master, master.data());
    shard.free_other_shards(b);  // ZeRO-3: as after initialisation, only this rank's shard is held
  }
}

}  // namespace twin::exec
