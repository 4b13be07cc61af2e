// The checkpoint readers (exec/checkpoint): the manifest (manifest.json, with the scenario it carries) and a rank's
// shard (rank-00000.bin, with the manifest's size and checksum made to match, so that the bytes reach the parser).
// The input's first byte picks which; the rest is the file. The shard is read into the shard of a tiny model (one
// layer of hidden 16) saved once at start. Refusal: twin::UserError (exec::RunError).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/checkpoint/io.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec/train/backend_factory.hpp"
#include "fuzz_util.hpp"
#include "model/program/program.hpp"
#include "model/scenario/scenario.hpp"

namespace {

namespace ex = twin::exec;

constexpr const char* kTiny = R"(
[model]
name = "fuzz-tiny"
layers = 1
hidden = 16
heads = 2
seq_len = 8
vocab = 32
dtype = "fp32"
[parallel]
micro_batch = 1
global_batch = 1
[cluster]
node = "cpu-host"
)";

// A tiny model's checkpoint, written once: its folder, manifest and a shard to read into.
struct Saved {
  twin::model::Scenario scenario = twin::model::parse_scenario(kTiny, "fuzz-tiny.toml");
  std::unique_ptr<ex::Backend> backend = ex::make_backend("cpu");
  ex::ModelShard shard{scenario, twin::model::rank_layout(scenario).coord_of(0), *backend};
  std::filesystem::path dir = twin::fuzz::scratch() / "step-00000001";
  ex::Manifest manifest;

  Saved() {
    shard.initialize(1);
    std::filesystem::create_directories(dir);
    manifest.step = 1;
    manifest.scenario_toml = twin::model::to_toml(scenario);
    manifest.data_path = "corpus.txt";
    manifest.shards.push_back(ex::write_shard(dir, 0, 1, 1, shard, *backend));
    // TWIN_FUZZ_WRITE_SEEDS=FOLDER: the two seeds of corpus/fuzz_checkpoint/ (this checkpoint's manifest and shard,
    // each behind the byte that picks it) are written there.
    if (const char* seeds = std::getenv("TWIN_FUZZ_WRITE_SEEDS")) {
      ex::write_manifest(dir, manifest);
      for (const auto& [pick, file] : {std::pair{'\0', std::string("manifest.json")}, {'\1', ex::shard_file_name(0)}}) {
        std::ofstream(std::filesystem::path(seeds) / (file + ".seed"), std::ios::binary)
            << pick << ex::read_file(dir / file);
      }
    }
  }
};

Saved& saved() {
  static Saved s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  Saved& s = saved();
  const bool manifest = data[0] % 2 == 0;
  const std::string name = manifest ? "manifest.json" : ex::shard_file_name(0);
  twin::fuzz::write_input("step-00000001/" + name, data + 1, size - 1);
  twin::fuzz::expect_refusal_only<twin::UserError>([&] {
    if (manifest) {
      const ex::Manifest m = ex::read_manifest(s.dir);
      ex::checkpoint_scenario(m, s.dir);
      return;
    }
    ex::Manifest m = s.manifest;
    m.shards[0].bytes = size - 1;
    m.shards[0].checksum = ex::fnv1a(reinterpret_cast<const char*>(data + 1), size - 1);
    ex::read_shard(s.dir, m, 0, s.shard, *s.backend);
  });
  return 0;
}
