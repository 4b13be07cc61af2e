// fp8-rank-RRRRR.bin: "TWINFP8S", version, rank, world size, step, the number of GEMMs, then per GEMM its layer and
// kind and, per role (input, weight, output gradient), its scale and its amax history (length, values), all
// little-endian as the shards are.
#include "exec/checkpoint/fp8.hpp"

#include <cstdint>
#include <cstring>
#include <set>
#include <utility>

#include <fmt/core.h>

#include "exec/checkpoint/io.hpp"
#include "exec/core/errors.hpp"
#include "model/program/program.hpp"

namespace twin::exec {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'T', 'W', 'I', 'N', 'F', 'P', '8', 'S'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kLongestHistory = 1u << 20;  // TE's amax_history_len is 1024 by default: a bound for reading

const ShardRecord& fp8_record(const fs::path& step_dir, const Manifest& m, int rank) {
  const fs::path manifest_path = step_dir / "manifest.json";
  if (m.fp8_states.empty()) {
    throw RunError(fmt::format(
        "checkpoint manifest '{}' has no fp8_states: it was written without FP8 delayed scaling's amax history and "
        "scales (framework.fp8_recipe = \"delayed\"; an older twin's checkpoint), so it cannot be resumed as it ran; "
        "start over (--no-resume) or train with another recipe",
        manifest_path.string()));
  }
  for (const ShardRecord& r : m.fp8_states) {
    if (r.rank == rank) return r;
  }
  throw RunError(
      fmt::format("checkpoint manifest '{}' has no fp8_states entry for rank {}", manifest_path.string(), rank));
}

}  // namespace

std::string fp8_state_file_name(int rank) {
  return fmt::format("fp8-rank-{:05d}.bin", rank);
}

ShardRecord write_fp8_state(const fs::path& step_dir, int rank, int world_size, int step,
                            const std::vector<Fp8TensorScales>& scales, const std::string& kill_writing) {
  std::string out(kMagic, sizeof(kMagic));
  put(out, kVersion);
  put(out, static_cast<std::uint32_t>(rank));
  put(out, static_cast<std::uint32_t>(world_size));
  put(out, static_cast<std::uint64_t>(step));
  put(out, static_cast<std::uint32_t>(scales.size()));
  for (const Fp8TensorScales& s : scales) {
    put(out, static_cast<std::int32_t>(s.layer));
    put(out, static_cast<std::int32_t>(s.what));
    for (std::size_t role = 0; role < 3; ++role) {
      put(out, s.scale[role]);
      put(out, static_cast<std::uint32_t>(s.amax_history[role].size()));
      for (float amax : s.amax_history[role]) put(out, amax);
    }
  }
  ShardRecord record{rank, fp8_state_file_name(rank), out.size(), fnv1a(out.data(), out.size())};
  write_atomically(step_dir / record.file, out, kill_writing);
  return record;
}

std::vector<Fp8TensorScales> read_fp8_state(const fs::path& step_dir, const Manifest& m, int rank) {
  const ShardRecord& record = fp8_record(step_dir, m, rank);
  const fs::path path = step_dir / record.file;
  const std::string bytes = read_file(path);
  if (bytes.size() != record.bytes || fnv1a(bytes.data(), bytes.size()) != record.checksum) {
    throw RunError(fmt::format(
        "checkpoint FP8 state '{}' is {}: {} bytes with checksum {}, the manifest says {} bytes with checksum {}",
        path.string(), bytes.size() < record.bytes ? "truncated" : "corrupt", bytes.size(),
        hex(fnv1a(bytes.data(), bytes.size())), record.bytes, hex(record.checksum)));
  }
  BinaryReader in(bytes, path, "FP8 state");
  char magic[sizeof(kMagic)];
  in.take(magic, sizeof(magic));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0 || in.get<std::uint32_t>() != kVersion) {
    throw RunError(fmt::format("'{}' is not a twin FP8 state file (version {})", path.string(), kVersion));
  }
  const auto file_rank = in.get<std::uint32_t>(), file_world = in.get<std::uint32_t>();
  const auto step = in.get<std::uint64_t>();
  if (static_cast<int>(file_rank) != rank || static_cast<int>(file_world) != m.world_size ||
      step != static_cast<std::uint64_t>(m.step)) {
    throw RunError(
        fmt::format("checkpoint FP8 state '{}' belongs to rank {} of {} at step {}, expected rank {} of {} "
                    "at step {}",
                    path.string(), file_rank, file_world, step, rank, m.world_size, m.step));
  }
  // Each tensor's record takes at least 32 bytes (layer, kind, and a scale and a length per role): a count the bytes
  // left cannot hold is a corrupt file, refused before the records are allocated.
  const auto count = in.get<std::uint32_t>();
  if (count > in.remaining() / 32) {
    throw RunError(fmt::format("checkpoint FP8 state '{}' is corrupt: {} tensors in {} bytes", path.string(), count,
                               in.remaining()));
  }
  std::vector<Fp8TensorScales> scales(count);
  for (Fp8TensorScales& s : scales) {
    s.layer = in.get<std::int32_t>();
    s.what = in.get<std::int32_t>();
    for (std::size_t role = 0; role < 3; ++role) {
      s.scale[role] = in.get<float>();
      const auto length = in.get<std::uint32_t>();
      if (length > kLongestHistory) {
        throw RunError(
            fmt::format("checkpoint FP8 state '{}' is corrupt: an amax history of {} steps", path.string(), length));
      }
      s.amax_history[role].resize(length);
      for (float& amax : s.amax_history[role]) amax = in.get<float>();
    }
  }
  if (!in.at_end()) throw RunError(fmt::format("checkpoint FP8 state '{}' has trailing bytes", path.string()));
  return scales;
}

std::vector<Fp8TensorScales> read_fp8_state_resharded(const fs::path& step_dir, const Manifest& m,
                                                      const model::Scenario& then, const ModelShard& shard) {
  const model::RankLayout old_layout = model::rank_layout(then);
  std::vector<Fp8TensorScales> mine;
  std::set<std::pair<int, int>> taken;  // (layer, GEMM): a routed expert's, from the first old rank that held it
  for (int old_rank = 0; old_rank < old_layout.world_size(); ++old_rank) {
    const model::RankCoord coord = old_layout.coord_of(old_rank);
    // A layer GEMM's copies over its amax group are the same: tp = dp = cp = 0's. A routed expert lives on its EP
    // ranks, carved out of TP and DP: whichever held it (the same state on each, reduced by expert).
    const bool group_first = coord.tp == 0 && coord.dp == 0 && coord.cp == 0;
    for (Fp8TensorScales& s : read_fp8_state(step_dir, m, old_rank)) {
      if (!shard.has_layer(s.layer) || (!group_first && s.what < kExpertTensors)) continue;
      if (taken.insert({s.layer, s.what}).second) mine.push_back(std::move(s));
    }
  }
  return mine;
}

}  // namespace twin::exec
