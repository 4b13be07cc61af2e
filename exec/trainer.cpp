#include "exec/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/core.h>

#include "exec/backend.hpp"
#include "exec/checkpoint.hpp"
#include "exec/comm/threads_communicator.hpp"
#include "exec/deferred_emulation.hpp"
#include "exec/errors.hpp"
#include "exec/interpreter.hpp"
#include "exec/model_shard.hpp"
#ifdef TWIN_HAVE_CUDA
#include "exec/cuda/cuda_exec.hpp"
#endif

namespace twin::exec {

namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CommGroup world_group(int world_size) {
  CommGroup g{"world", {}};
  for (int r = 0; r < world_size; ++r) g.members.push_back(r);
  return g;
}

// One rank's whole run.
class RankRun {
 public:
  RankRun(const model::Program& program, const TextDataset& data, const TrainOptions& options, Communicator& comm,
          int threads, bool shares_process, TrainResult* result)
      : program_(program),
        scenario_(program.scenario),
        data_(data),
        options_(options),
        comm_(comm),
        rank_(comm.rank()),
        world_(world_group(program.layout.world_size())),
        result_(result) {
    // The Program carries FP8's kernels and amax reductions for the simulator; the interpreter does not run them yet.
    if (scenario_.model.fp8 != model::Fp8Format::None) {
      throw RunError(
          fmt::format("{}: model.fp8 = \"{}\": the executor does not train in FP8 yet (twin sim predicts "
                      "it); run with model.fp8 = \"none\"",
                      scenario_.source, model::to_string(scenario_.model.fp8)));
    }
    if (scenario_.parallel.cp > 1) {
      throw RunError(
          fmt::format("{}: parallel.cp = {}: the executor does not run context parallelism yet (twin sim "
                      "predicts it); run with parallel.cp = 1",
                      scenario_.source, scenario_.parallel.cp));
    }
    if (comm.world_size() != program.layout.world_size()) {
      throw RunError(fmt::format("the job has {} ranks but the plan needs tp * pp * dp = {} * {} * {} = {}",
                                 comm.world_size(), program.layout.tp(), program.layout.pp(), program.layout.dp(),
                                 program.layout.world_size()));
    }
    BackendOptions backend_options;
    backend_options.threads = threads;
    backend_options.shares_process = shares_process;
    backend_ = make_backend(options.backend, backend_options);
    if (options.check_deferred_collectives && backend_->device() == Device::Host) {
      deferred_ = std::make_unique<DeferredCollectives>(rank_, DeferredCheck::Strict);
      backend_ = make_deferred_check_backend(std::move(backend_), *deferred_);
      device_comm_ = std::make_unique<DeferringCommunicator>(
          comm, *deferred_, DeferralRule::of(scenario_.parallel.dp_overlap, scenario_.shards_parameters()));
    }
#ifdef TWIN_HAVE_CUDA
    // device buffers need a device communicator (NCCL, or staging through this one); host pointers pass through
    if (!device_comm_) device_comm_ = cuda::make_device_communicator(comm, *backend_, program, options.comm_timeout_s);
#endif
    shard_ = std::make_unique<ModelShard>(scenario_, program.layout.coord_of(rank_), *backend_);
  }

  void run() {
    const int first = restore_or_initialize();
    if (result_ != nullptr) {
      result_->first_step = first;
      result_->steps = options_.steps;
    }
    const DataLoader loader(data_, scenario_);
    Interpreter interpreter(program_, rank_, *backend_, device_comm_ ? *device_comm_ : comm_, *shard_);
    const int dp_rank = program_.layout.coord_of(rank_).dp;
    const double tokens_per_step = static_cast<double>(scenario_.parallel.global_batch * scenario_.model.seq_len);
    const int trace_step = options_.trace_step == -1 ? options_.steps - 1 : options_.trace_step;  // < -1: none
    std::vector<OpTiming> timings;
    double counted_time = 0, counted_tokens = 0;

    for (int step = first; step < options_.steps; ++step) {
      if (inject_fault(step)) return;
      IterationInput input;
      input.step = step;
      input.micro_batches = loader.micro_batches(step, dp_rank);
      const bool trace = step == trace_step;
      double epoch = 0;
      if (trace) {  // one clock for every rank: rank 0's, after a barrier
        comm_.barrier(world_, "barrier before the traced step");
        epoch = now_s();
        comm_.broadcast(world_, &epoch, 1, DType::F64, 0, "epoch of the traced step");
      }
      const double start = now_s();
      const IterationOutput out = interpreter.run_iteration(input, trace ? &timings : nullptr, epoch);
      double metrics[2] = {out.loss_sum, out.loss_tokens};
      comm_.all_reduce(world_, metrics, 2, DType::F64, "loss sum (reporting)");
      const double seconds = now_s() - start;
      if (trace) gather_timeline(timings, step);

      if (result_ != nullptr) {
        const double loss = metrics[0] / std::max(1.0, metrics[1]);
        result_->losses.push_back(loss);
        result_->iteration_time_s.push_back(seconds);
        result_->grad_norms.push_back(out.grad_norm);
        result_->learning_rates.push_back(out.learning_rate);
        if (step > first || options_.steps - first == 1) {
          counted_time += seconds;
          counted_tokens += tokens_per_step;
        }
        result_->tokens_per_s = counted_time > 0 ? counted_tokens / counted_time : 0;
        if (options_.on_step) {
          options_.on_step(StepReport{step, options_.steps, loss, out.grad_norm, out.learning_rate, seconds,
                                      tokens_per_step / seconds});
        }
      }
      const int done = step + 1;
      const bool due = options_.checkpoint_every > 0 ? done % options_.checkpoint_every == 0 : false;
      if (!options_.checkpoint_dir.empty() && (due || done == options_.steps)) save_checkpoint(done);
    }
  }

 private:
  // Returns the first step to run.
  int restore_or_initialize() {
    if (!options_.checkpoint_dir.empty() && options_.resume) {
      if (const auto latest = latest_checkpoint(options_.checkpoint_dir)) {
        const Manifest manifest = read_manifest(*latest);
        const auto notes = check_compatible(manifest, *latest, scenario_, data_.path, data_.fingerprint);
        const model::Scenario then = checkpoint_scenario(manifest, *latest);
        const bool resharded = !same_layout(then, scenario_);
        if (resharded) {
          reshard(*latest, manifest, then, *shard_, *backend_);
        } else {
          read_shard(*latest, manifest, rank_, *shard_, *backend_);
        }
        if (result_ != nullptr) {
          result_->resumed_from = latest->string();
          result_->resharded = resharded;
          result_->earlier_losses = manifest.losses;
          if (options_.on_note) {
            options_.on_note(fmt::format("resuming from {} (step {})", latest->string(), manifest.step));
            if (resharded) {
              options_.on_note(fmt::format(
                  "re-sharded from TP {} x PP {} x DP {} (ZeRO {}) to TP {} x PP {} x DP {} (ZeRO {})",
                  then.parallel.tp, then.parallel.pp, then.parallel.dp, then.parallel.zero_stage, scenario_.parallel.tp,
                  scenario_.parallel.pp, scenario_.parallel.dp, scenario_.parallel.zero_stage));
            }
            for (const auto& note : notes) options_.on_note("changed since the checkpoint: " + note);
          }
        }
        return manifest.step;
      }
    }
    shard_->initialize(scenario_.training.seed);
    return 0;
  }

  bool inject_fault(int step) {
    const FaultInjection& f = options_.fault;
    if (f.mode == FaultInjection::Mode::None || f.rank != rank_ || f.step != step) return false;
    if (f.mode == FaultInjection::Mode::Throw) {
      throw std::runtime_error(fmt::format("rank {}: injected failure at step {}", rank_, step));
    }
    return true;  // Vanish: stop without a word
  }

  void save_checkpoint(int done) {
    const fs::path dir = step_directory(options_.checkpoint_dir, done);
    const ShardRecord mine = write_shard(dir, rank_, static_cast<int>(world_.members.size()), done, *shard_, *backend_);
    // everyone's (bytes, checksum), which also tells rank 0 that every shard is in place
    const std::size_t world = world_.members.size();
    std::vector<std::uint64_t> records(2 * world);
    const std::uint64_t local[2] = {mine.bytes, mine.checksum};
    comm_.all_gather(world_, local, records.data(), 2, DType::F64, "checkpoint shard records");
    if (rank_ != 0) return;
    Manifest manifest;
    manifest.step = done;
    manifest.world_size = static_cast<int>(world);
    manifest.scenario_toml = model::to_toml(scenario_);
    manifest.data_path = data_.path;
    manifest.data_bytes = data_.bytes.size();
    manifest.data_fingerprint = data_.fingerprint;
    manifest.seed = scenario_.training.seed;
    if (result_ != nullptr) {
      manifest.losses = result_->earlier_losses;
      manifest.losses.insert(manifest.losses.end(), result_->losses.begin(), result_->losses.end());
    }
    for (std::size_t r = 0; r < world; ++r) {
      manifest.shards.push_back(
          ShardRecord{static_cast<int>(r), shard_file_name(static_cast<int>(r)), records[2 * r], records[2 * r + 1]});
    }
    write_manifest(dir, manifest);
    prune_checkpoints(options_.checkpoint_dir, options_.keep_checkpoints);
    if (result_ != nullptr) result_->last_checkpoint = dir.string();
  }

  // Every rank's op timings to rank 0, as a report::Timeline (ranks' lists differ in length by stage: pad with NaN).
  void gather_timeline(const std::vector<OpTiming>& timings, int step) {
    std::size_t longest = 0;
    for (int stage = 0; stage < program_.stages(); ++stage) longest = std::max(longest, program_.ops_per_rank(stage));
    std::vector<double> mine(2 * longest, std::numeric_limits<double>::quiet_NaN());
    for (const OpTiming& t : timings) {
      mine[2 * static_cast<std::size_t>(t.op_index)] = t.start_s;
      mine[2 * static_cast<std::size_t>(t.op_index) + 1] = t.end_s;
    }
    const std::size_t world = world_.members.size();
    std::vector<double> all(2 * longest * world);
    comm_.all_gather(world_, mine.data(), all.data(), 2 * longest, DType::F64, "timeline of the traced step");
    if (result_ == nullptr) return;
    report::Timeline timeline;
    timeline.engine = "exec";
    for (std::size_t r = 0; r < world; ++r) {
      report::RankTimeline rank;
      rank.rank = static_cast<int>(r);
      rank.stage = program_.layout.coord_of(rank.rank).pp;
      const std::size_t ops = program_.ops_per_rank(rank.stage);
      for (std::size_t i = 0; i < ops; ++i) {
        const double start = all[(r * longest + i) * 2], end = all[(r * longest + i) * 2 + 1];
        report::OpSpan span;
        span.op = static_cast<std::int32_t>(i);
        span.start_s = start;
        span.active_s = start;  // the executor does not see when a collective's last member arrived
        span.end_s = end;
        rank.spans.push_back(span);
        timeline.iteration_time_s = std::max(timeline.iteration_time_s, end);
      }
      timeline.ranks.push_back(std::move(rank));
    }
    result_->timeline = std::move(timeline);
    result_->traced_step = step;
  }

  const model::Program& program_;
  const model::Scenario& scenario_;
  const TextDataset& data_;
  const TrainOptions& options_;
  Communicator& comm_;
  int rank_;
  CommGroup world_;
  TrainResult* result_;
  std::unique_ptr<DeferredCollectives> deferred_;  // check_deferred_collectives: shared by the two below
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> device_comm_;  // the interpreter's, for a device backend (destroyed before it)
  std::unique_ptr<ModelShard> shard_;
};

}  // namespace

int default_threads_per_rank(int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_host));
}

TrainResult train_rank(const model::Program& program, const TextDataset& data, const TrainOptions& options,
                       Communicator& comm, int threads_per_rank) {
  TrainResult result;
  RankRun run(program, data, options, comm, threads_per_rank, false, comm.rank() == 0 ? &result : nullptr);
  run.run();
  return result;
}

TrainResult train_threads(const model::Program& program, const TextDataset& data, const TrainOptions& options) {
  const int world = program.layout.world_size();
  ThreadsWorld threads_world(world, CommOptions{options.comm_timeout_s});
  const int threads = options.threads_per_rank > 0 ? options.threads_per_rank : default_threads_per_rank(world);
  TrainResult result;
  std::mutex mutex;
  std::exception_ptr root_failure, peer_failure;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto comm = threads_world.communicator(rank);
        RankRun run(program, data, options, *comm, threads, world > 1, rank == 0 ? &result : nullptr);
        run.run();
      } catch (const PeerFailure&) {
        std::lock_guard lock(mutex);
        if (!peer_failure) peer_failure = std::current_exception();
      } catch (const std::exception& error) {
        {
          std::lock_guard lock(mutex);
          if (!root_failure) root_failure = std::current_exception();
        }
        threads_world.abort(rank, error.what());
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  if (root_failure) std::rethrow_exception(root_failure);
  if (peer_failure) std::rethrow_exception(peer_failure);
  return result;
}

}  // namespace twin::exec
