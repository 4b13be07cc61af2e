// Checkpoints: DIR/step-NNNNNNNN/ holds one shard file per rank (rank-RRRRR.bin: its parameters, Adam state and
// master weights, bucket by bucket; under ZeRO-3 its shard of the parameters alone, like the Adam state: the other
// ranks' regions are freed, NaN, outside the gathers; CP ranks write theirs as DP replicas do), under FP8 delayed
// scaling one state file per rank (fp8-rank-RRRRR.bin, checkpoint_fp8.hpp), and manifest.json (the scenario as TOML,
// the step, the data position and fingerprint, the RNG state, each file's size and checksum). Every file is written to
// a temporary and renamed; the manifest is written last, by rank 0, once every rank has renamed its shard: a step
// directory with a manifest is complete, one without is ignored.
//
// Loading checks, each failure a RunError naming the file: every file read is a regular file (not a directory or a
// link loop); the manifest parses, each field has its type and range (named with its value as written otherwise), and
// its step is the one the folder's name says (a copied or renamed folder is refused); the scenario's model, global
// batch, seed and data are this run's (else refused with the list of differences); each shard exists, has the
// manifest's size (else "truncated") and checksum (else "corrupt"), and holds the buckets its rank's plan gives it.
// A checkpoint of another plan (TP, PP, DP, CP, virtual stages, stage sizes, ZeRO stage, vocabulary padding) is
// re-sharded: every element of every full tensor, and Adam's state of it, goes to whichever rank of the new plan holds
// it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "exec/core/backend.hpp"
#include "exec/shard/model_shard.hpp"
#include "model/plan/ranks.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::exec {

struct ShardRecord {
  int rank = 0;
  std::string file;  // relative to the step directory
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // FNV-1a 64 of the whole file
};

struct Manifest {
  int step = 0;  // iterations done: the run resumes with step `step` (0-based)
  int world_size = 1;
  std::string scenario_toml;
  std::string data_path;
  std::uint64_t data_bytes = 0, data_fingerprint = 0;
  std::uint64_t seed = 0;      // the counter-based RNG's whole state with `step` (no other random state exists)
  std::vector<double> losses;  // per step so far (for the run's record)
  std::vector<ShardRecord> shards;
  std::vector<ShardRecord> fp8_states;  // FP8 delayed scaling: each rank's scales (checkpoint_fp8.hpp); else empty
};

std::filesystem::path step_directory(const std::filesystem::path& dir, int step);
std::string shard_file_name(int rank);
// "step-00000012" -> 12; other names (and steps past an int) are not checkpoints.
std::optional<int> step_of_directory_name(const std::string& name);

// Writing fails with a RunFailure naming the file (a full disk, a file size limit, an I/O error: the run stops, exit
// 1), its temporary removed. `kill_writing`: the name of a file (rank-00000.bin, manifest.json) whose write this
// process is to be killed in the middle of (fault injection, exec/train/faults.hpp); empty: none.

// Writes this rank's shard into `step_dir` atomically; returns its record (size and checksum).
ShardRecord write_shard(const std::filesystem::path& step_dir, int rank, int world_size, int step,
                        const ModelShard& shard, Backend& backend, const std::string& kill_writing = {});
// Writes the manifest atomically (last: it makes the checkpoint complete). Its `losses_fnv1a64` covers the losses.
void write_manifest(const std::filesystem::path& step_dir, const Manifest& manifest,
                    const std::string& kill_writing = {});

// The newest complete checkpoint under `dir` (highest step with a manifest), if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir);
// Step folders newer than the newest complete checkpoint that have no manifest: writes that never finished (a run
// killed or failed while writing), which resuming ignores.
std::vector<std::filesystem::path> unfinished_checkpoints(const std::filesystem::path& dir);
// Removes all but the newest `keep` complete checkpoints (and incomplete ones older than the newest), never the one
// of step `protect` (the last known-good one: its weights gave a sane loss; -1: none). A folder whose manifest does
// not read back as its name's step is neither counted nor removed.
void prune_checkpoints(const std::filesystem::path& dir, int keep, int protect = -1);
// Moves the checkpoint of `step` aside, to DIR/rejected-step-NNNNNNNN (resuming never picks it): its weights gave a
// loss that tripped a guard. Returns where it went, or nothing when there was no such folder.
std::optional<std::filesystem::path> set_aside_checkpoint(const std::filesystem::path& dir, int step);

// Throws RunError unless `dir` can hold checkpoints: it is created if missing, and a file written and removed in it
// (checked before step 1, so that a run does not train for nothing); a step-* entry or twin.lock in it that is a
// symbolic link is refused by name (no link is followed out of a checkpoint folder: README "Reliability").
void require_writable_checkpoint_directory(const std::filesystem::path& dir);
// Throws RunError when `dir` holds a complete checkpoint newer than `first_step`, the first step a run started afresh
// (--no-resume) writes: that old run's checkpoints would outlive the new one's (pruning keeps the newest) and a later
// resume would continue the old run. Names the newest such step.
void require_no_newer_checkpoint(const std::filesystem::path& dir, int first_step);

// The lock of a checkpoint directory, held while the object lives: DIR/twin.lock (never followed if a link: refused),
// flock'ed (released by the kernel
// when the holder dies: a stale lock file never blocks), holding the holder's pid and host. A second run on the same
// directory is refused with a RunError naming the holder.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::filesystem::path& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

Manifest read_manifest(const std::filesystem::path& step_dir);
// The scenario the checkpoint was written under (its manifest's TOML); RunError naming the manifest if it does not
// load.
model::Scenario checkpoint_scenario(const Manifest& manifest, const std::filesystem::path& step_dir);
// The plan as a reader names it: "TP 2 x PP 1 x DP 2", with " x CP n" under context parallelism (its ranks:
// model::rank_layout).
std::string plan_text(const model::Scenario& s);
// Whether `now` lays the model's tensors out across ranks as `then` did (tp, pp, dp, cp, virtual stages, stage sizes,
// ZeRO stage, padded vocabulary): each rank then reads its own shard (read_shard), else resuming re-shards (reshard).
bool same_layout(const model::Scenario& then, const model::Scenario& now);
// Throws RunError listing every difference that forbids resuming `now` from `manifest`; returns notes about
// differences that are allowed (the plan, schedule, recompute, learning rate, Adam's settings...).
std::vector<std::string> check_compatible(const Manifest& manifest, const std::filesystem::path& step_dir,
                                          const model::Scenario& now, const std::string& data_path,
                                          std::uint64_t data_fingerprint);
// Restores this rank's shard (parameters, Adam state, master weights); under ZeRO-3 the other ranks' regions of the
// parameters are then freed, as after initialisation.
void read_shard(const std::filesystem::path& step_dir, const Manifest& manifest, int rank, ModelShard& shard,
                Backend& backend);

// Restores this rank's shard from a checkpoint written under the plan of `then` (another layout, same_layout false):
// each old rank's shard that holds one of this rank's tensors is read and checked as read_shard does, its elements
// placed in the full tensors by name (full_element_index), and this rank's elements taken out, with Adam's state (and
// master weights) from whichever old DP rank owned each element. Throws RunError naming a tensor element no shard held.
void reshard(const std::filesystem::path& step_dir, const Manifest& manifest, const model::Scenario& then,
             ModelShard& shard, Backend& backend);

}  // namespace twin::exec
