#include "exec/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <thread>

#include <fmt/core.h>

#include "exec/checkpoint/checkpoint.hpp"
#include "exec/checkpoint/fp8.hpp"
#include "exec/core/backend.hpp"
#include "exec/core/clock.hpp"
#include "exec/core/errors.hpp"
#include "exec/interpreter/fp8_state.hpp"
#include "exec/interpreter/interpreter.hpp"
#include "exec/shard/model_shard.hpp"
#include "exec/train/backend_factory.hpp"
#include "exec/train/check_supported.hpp"
#include "exec/train/context_parallel.hpp"
#include "exec/train/deferred_emulation.hpp"
#ifdef TWIN_HAVE_CUDA
#include "exec/cuda/cuda_exec.hpp"
#endif

namespace twin::exec {

namespace fs = std::filesystem;

namespace {

CommGroup world_group(int world_size) {
  CommGroup g{"world", {}};
  for (int r = 0; r < world_size; ++r) g.members.push_back(r);
  return g;
}

// One rank's whole run.
class RankRun {
 public:
  RankRun(const model::Program& program, const TextDataset& data, const TrainOptions& options, Communicator& comm,
          int threads, bool threads_launcher, TrainResult* result, RankProgress* progress)
      : program_(program),
        scenario_(program.scenario),
        data_(data),
        options_(options),
        comm_(comm),
        rank_(comm.rank()),
        world_(world_group(program.layout.world_size())),
        threads_launcher_(threads_launcher),
        result_(result),
        progress_(progress),
        work_flops_(compute_flops_per_rank(program)) {
    if (comm.world_size() != program.layout.world_size()) {
      const model::RankLayout& l = program.layout;
      const std::string needs =
          l.cp() > 1 ? fmt::format("tp * cp * pp * dp = {} * {} * {} * {}", l.tp(), l.cp(), l.pp(), l.dp())
                     : fmt::format("tp * pp * dp = {} * {} * {}", l.tp(), l.pp(), l.dp());
      throw RunError(
          fmt::format("the job has {} ranks but the plan needs {} = {}", comm.world_size(), needs, l.world_size()));
    }
    if (scenario_.model.attention_width() != scenario_.model.hidden) {
      throw RunError(fmt::format(
          "{}: model.head_dim = {}: the executor's attention is model.hidden wide; it does not "
          "train heads x head_dim = {} apart from hidden = {} yet (twin sim models it)",
          scenario_.source, scenario_.model.head_dim(), scenario_.model.attention_width(), scenario_.model.hidden));
    }
    // What the memory model and the simulator take from the framework but the executor does not train (yet): named,
    // not ignored.
    const std::string unmodelled = scenario_.parallel.zero_stage == 2   ? "parallel.zero_stage = 2"
                                   : !scenario_.framework.grad_reduce_in_fp32 ? "framework.grad_reduce_in_fp32 = false"
                                   : scenario_.framework.fp8_param_gather     ? "framework.fp8_param_gather = true"
                                                                              : "";
    if (!unmodelled.empty()) {
      throw RunError(fmt::format("{}: {}: the executor keeps whole fp32 gradients and 16-bit weights; it does not "
                                 "train this yet (twin sim and the memory estimate model it)",
                                 scenario_.source, unmodelled));
    }
    BackendOptions backend_options;
    backend_options.threads = threads;
    backend_options.shares_process = threads_launcher && program.layout.world_size() > 1;
    backend_ = make_backend(options.backend, backend_options);
    check_supported(program, *backend_);  // MoE, context parallelism and FP8 need the backend's capabilities
    // FP8 GEMMs: emulated on the host (exec/interpreter/fp8_linear.cpp), cuBLASLt's on sm_90 and later (exec/cuda)
#ifdef TWIN_HAVE_CUDA
    if (scenario_.model.fp8 != model::Fp8Format::None) cuda::require_fp8_gemms(*backend_, scenario_.source);
#endif
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
    if (fp8_restored_) interpreter.fp8_state()->restore(*fp8_restored_);
    const model::RankCoord coord = program_.layout.coord_of(rank_);
    const int dp_rank = coord.dp;
    const double tokens_per_step = static_cast<double>(scenario_.parallel.global_batch * scenario_.model.seq_len);
    const auto micro_batches_per_step =
        static_cast<double>(scenario_.parallel.global_batch / scenario_.parallel.micro_batch);
    const int trace_step = options_.trace_step == -1 ? options_.steps - 1 : options_.trace_step;  // < -1: none
    TrainingGuards guards(options_.guards, std::log(static_cast<double>(scenario_.model.vocab)), history_);
    std::vector<OpTiming> timings;
    StepClock clock(options_.slow.at(rank_) ? options_.slow.factor : 1.0);
    double counted_time = 0, counted_tokens = 0;
    double weights_before = first < options_.steps ? weight_norm() : 0;
    int skipped_in_a_row = 0;

    for (int step = first; step < options_.steps; ++step) {
      if (progress_ != nullptr) progress_->mark(step, -1);
      if (inject_fault(step)) return;
      IterationInput input;
      input.step = step;
      input.micro_batches = loader.micro_batches(step, dp_rank);
      if (scenario_.parallel.cp > 1) {  // each CP rank trains on its two chunks of every sequence
        for (MicroBatch& mb : input.micro_batches) {
          mb = context_parallel_share(mb, static_cast<int>(scenario_.parallel.micro_batch),
                                      static_cast<int>(scenario_.model.seq_len),
                                      static_cast<int>(scenario_.parallel.cp), coord.cp);
        }
      }
      input.skip_nonfinite = options_.skip_nonfinite;
      input.progress = progress_;
      input.observer = &clock;
      if (options_.fault.mode == FaultInjection::Mode::Nan && options_.fault.at(rank_, step)) {
        input.poison_after_op = options_.fault.op;
      }
      const bool trace = step == trace_step;
      double epoch = 0;
      if (trace) {  // one clock for every rank: rank 0's, after a barrier
        comm_.barrier(world_, "barrier before the traced step");
        epoch = now_s();
        comm_.broadcast(world_, &epoch, 1, DType::F64, 0, "epoch of the traced step");
      }
      const double start = now_s();
      IterationOutput out;
      try {
        out = interpreter.run_iteration(input, trace ? &timings : nullptr, epoch);
      } catch (const TrainingDiverged& error) {
        const std::string message = error.what() + set_aside_unverified(step);
        if (raised_by_every_rank(error)) throw GuardTripped(message);
        throw TrainingDiverged(message);
      }
      const double compute_s = clock.take_compute_s();
      std::vector<double> metrics = step_metrics(out, compute_s, now_s() - start - compute_s);
      comm_.all_reduce(world_, metrics.data(), metrics.size(), DType::F64,
                       "loss sum, weight norm and step times (reporting, guards, stragglers)");
      const double seconds = now_s() - start;
      if (trace) gather_timeline(timings, step);
      const double loss = metrics[0] / std::max(1.0, metrics[1]), weights_after = std::sqrt(metrics[2]);

      // The guards, on values every rank holds: the loss is the loss of the weights this step began with (those of
      // the checkpoint of `step`, if one was written), the norm that of the update's result.
      if (out.skipped) {
        if (++skipped_in_a_row >= kMaxConsecutiveSkips) {
          diverge(step,
                  fmt::format("{} updates in a row were skipped for non-finite values (--skip-nonfinite)",
                              skipped_in_a_row),
                  false);
        }
      } else {
        skipped_in_a_row = 0;
        if (const auto problem = guards.check_loss(loss)) diverge(step, *problem, true);
        if (last_written_ == step) known_good_ = step;
      }
      if (const auto problem = guards.check_weights(weights_before, weights_after)) diverge(step, *problem, false);
      weights_before = weights_after;

      if (result_ != nullptr) {
        result_->losses.push_back(loss);
        if (scenario_.model.is_moe()) result_->aux_losses.push_back(metrics[3] / micro_batches_per_step);
        if (scenario_.model.capacity_factor > 0) result_->moe_dropped_slots.push_back(static_cast<long>(metrics[4]));
        result_->iteration_time_s.push_back(seconds);
        result_->grad_norms.push_back(out.grad_norm);
        result_->learning_rates.push_back(out.learning_rate);
        result_->weight_norms.push_back(weights_after);
        if (out.skipped) result_->skipped_steps.push_back(step);
        Straggler straggler = straggler_of(metrics);
        const bool warm_up = step == first && options_.steps - first > 1;  // tokens/s leaves it out alike
        straggler.warm_up = warm_up;
        result_->slowest_ranks.push_back(straggler.rank);
        result_->lag_s.push_back(straggler.lag_s);
        result_->lag_fractions.push_back(straggler.lag_fraction);
        if (!warm_up) {
          counted_time += seconds;
          counted_tokens += tokens_per_step;
        }
        result_->tokens_per_s = counted_time > 0 ? counted_tokens / counted_time : 0;
        if (options_.on_step) {
          options_.on_step(StepReport{step, options_.steps, loss, out.grad_norm, out.learning_rate, seconds,
                                      tokens_per_step / seconds, weights_after, out.skipped, straggler});
        }
      }
      const int done = step + 1;
      const bool due = options_.checkpoint_every > 0 ? done % options_.checkpoint_every == 0 : false;
      if (!options_.checkpoint_dir.empty() && (due || done == options_.steps)) {
        save_checkpoint(done, interpreter.fp8_state());
      }
    }
  }

 private:
  static constexpr std::size_t kReportingSums = 5;  // loss sum, tokens, squared weights, aux loss, dropped slots

  // The reporting sums, and this rank's (compute, wait) seconds in its own slots for the straggler detector: one
  // all-reduce carries both (zeros in the other ranks' slots, so the sums are the values) where a gather would be one
  // more collective per step.
  std::vector<double> step_metrics(const IterationOutput& out, double compute_s, double wait_s) {
    std::vector<double> metrics(kReportingSums + 2 * world_.members.size(), 0.0);
    metrics[0] = out.loss_sum;
    metrics[1] = out.loss_tokens;
    metrics[2] = squared_weights();
    metrics[3] = out.aux_loss_sum;
    metrics[4] = out.moe_dropped_slots;
    metrics[kReportingSums + 2 * static_cast<std::size_t>(rank_)] = compute_s;
    metrics[kReportingSums + 2 * static_cast<std::size_t>(rank_) + 1] = wait_s;
    return metrics;
  }

  // The step's straggler, from every rank's (compute, wait) seconds after the reporting sums.
  Straggler straggler_of(const std::vector<double>& metrics) const {
    const std::size_t world = world_.members.size();
    std::vector<double> compute_s(world), wait_s(world);
    for (std::size_t r = 0; r < world; ++r) {
      compute_s[r] = metrics[kReportingSums + 2 * r];
      wait_s[r] = metrics[kReportingSums + 2 * r + 1];
    }
    return find_straggler(compute_s, wait_s, work_flops_);
  }

  static bool fp8_delayed(const model::Scenario& s) {
    return s.model.fp8 != model::Fp8Format::None && s.framework.fp8_recipe == model::Fp8Recipe::Delayed;
  }

  // FP8 delayed scaling's scales and amax histories, read with the shard (checkpoint_fp8.hpp) and put into the
  // interpreter's Fp8State when run() makes it. A checkpoint trained without delayed scaling has none: the scales start
  // at 1, as a fresh run's do.
  void restore_fp8_state(const fs::path& latest, const Manifest& manifest, const model::Scenario& then,
                         bool resharded) {
    if (!fp8_delayed(scenario_) || !fp8_delayed(then)) return;
    fp8_restored_ = resharded ? read_fp8_state_resharded(latest, manifest, then, *shard_)
                              : exec::read_fp8_state(latest, manifest, rank_);
  }

  // Returns the first step to run.
  int restore_or_initialize() {
    if (!options_.checkpoint_dir.empty() && options_.resume) {
      const auto unfinished = unfinished_checkpoints(options_.checkpoint_dir);
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
        restore_fp8_state(*latest, manifest, then, resharded);
        history_ = manifest.losses;
        last_written_ = manifest.step;
        if (result_ != nullptr) {
          result_->resumed_from = latest->string();
          result_->resharded = resharded;
          result_->earlier_losses = manifest.losses;
          if (options_.on_note) {
            for (const fs::path& dir : unfinished) {
              options_.on_note(
                  fmt::format("ignoring {}: its checkpoint was never completed (no manifest.json: the "
                              "run writing it was interrupted)",
                              dir.string()));
            }
            options_.on_note(fmt::format("resuming from {} (step {})", latest->string(), manifest.step));
            if (resharded) {
              options_.on_note(fmt::format("re-sharded from {} (ZeRO {}) to {} (ZeRO {})", plan_text(then),
                                           then.parallel.zero_stage, plan_text(scenario_),
                                           scenario_.parallel.zero_stage));
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

  // Returns true when this rank is to stop without a word (a killed rank of the threads launcher).
  bool inject_fault(int step) {
    const FaultInjection& f = options_.fault;
    if (!f.at(rank_, step)) return false;
    switch (f.mode) {
      case FaultInjection::Mode::Throw:
        throw RunFailure(fmt::format("rank {}: injected failure at step {}", rank_, step + 1));
      case FaultInjection::Mode::Kill:
        if (threads_launcher_) return true;  // a thread cannot be killed: it ends without a word
        std::fflush(nullptr);
        ::raise(SIGKILL);
        return true;
      case FaultInjection::Mode::Stop:
        if (threads_launcher_) block_forever();
        ::raise(SIGSTOP);  // resumes only if someone sends SIGCONT
        return false;
      case FaultInjection::Mode::Slow:
        std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
        return false;
      default:
        return false;  // nan: in the interpreter; kill-writing: in the checkpoint writer
    }
  }

  // The sum of the squares of the weights this rank is the one to count, as the gradient norm counts their gradients
  // (its ZeRO shard or DP rank 0; TP-replicated tensors on TP rank 0; a tied embedding's copy not at all).
  double squared_weights() {
    const bool zero = scenario_.parallel.zero_stage >= 1 && scenario_.parallel.dp * scenario_.parallel.cp > 1;
    const model::RankCoord coord = program_.layout.coord_of(rank_);
    double partial = 0;
    if (!zero && (coord.dp != 0 || coord.cp != 0)) return 0;  // the replicas of DP rank 0, CP rank 0's
    const auto& p = scenario_.parallel;
    if (p.bidirectional() && coord.pp >= p.pp / 2) return 0;  // DualPipe's second copies (gradient_norm)
    for (Bucket& b : shard_->buckets()) {
      const std::size_t begin = b.shard_offset, end = b.shard_offset + b.shard_numel;
      for (const ParamTensor& t : b.tensors) {
        if (t.copy || (t.tp_replicated && coord.tp != 0)) continue;
        const std::size_t lo = zero ? std::max(begin, t.offset) : t.offset;
        const std::size_t hi = zero ? std::min(end, t.offset + t.numel) : t.offset + t.numel;
        if (hi > lo) partial += backend_->squared_norm(b.params.slice(lo, hi - lo));
      }
    }
    return partial;
  }

  double weight_norm() {
    double squared = squared_weights();
    comm_.all_reduce(world_, &squared, 1, DType::F64, "weight norm (guards)");
    return std::sqrt(squared);
  }

  // Non-finite values at `step` (seen by one rank): the checkpoint of its starting weights, when it was written at the
  // end of the step before and no sane loss has vouched for it, is moved aside, so that resuming starts from the one
  // before. Returns what to add to the message.
  std::string set_aside_unverified(int step) {
    if (options_.checkpoint_dir.empty() || last_written_ != step || known_good_ == step) return {};
    // Every rank that saw it tries; the first moves it, and each names where it went.
    auto moved = set_aside_checkpoint(options_.checkpoint_dir, step);
    const fs::path rejected = fs::path(options_.checkpoint_dir) / ("rejected-step-" + fmt::format("{:08d}", step));
    std::error_code error;
    if (!moved && fs::is_directory(rejected, error)) moved = rejected;
    return moved ? fmt::format("; the checkpoint of step {}, whose weights this step began with, was moved to {}", step,
                               moved->string())
                 : std::string();
  }

  // A guard tripped at `step` (every rank alike). `loss_problem`: the loss of the weights the step began with was not
  // sane, so a checkpoint of them (written at the end of the step before, not yet known good) is set aside; resuming
  // then starts from the checkpoint before it.
  [[noreturn]] void diverge(int step, const std::string& problem, bool loss_problem) {
    const std::string& dir = options_.checkpoint_dir;
    std::string set_aside;
    if (!dir.empty()) {
      if (loss_problem && last_written_ == step && known_good_ != step && rank_ == 0) {
        if (const auto moved = set_aside_checkpoint(dir, step)) {
          set_aside = fmt::format(" (the checkpoint of step {}, whose weights gave this loss, was moved to {})", step,
                                  moved->string());
        }
      }
      comm_.barrier(world_, "divergence: the set-aside checkpoint");  // every rank names the same resume point
    }
    std::string resume = "; without --checkpoint, the run starts over";
    if (!dir.empty()) {
      const auto latest = latest_checkpoint(dir);
      resume = latest ? fmt::format(": it resumes from {}, the newest checkpoint left{}", latest->string(), set_aside)
                      : fmt::format(": no checkpoint is left in {}, it starts over{}", dir, set_aside);
    }
    const std::string saved = dir.empty() ? ""
                              : step == 0 ? "; no checkpoint was written"
                                          : fmt::format("; no checkpoint was written after step {}", step);
    throw GuardTripped(
        fmt::format("training diverged at step {}: {}{}. Lower training.learning_rate (now {:g}) and run again{}",
                    step + 1, problem, saved, scenario_.training.learning_rate, resume));
  }

  // `fp8`: the interpreter's FP8 state (null without FP8): delayed scaling's is saved beside the shard.
  void save_checkpoint(int done, const Fp8State* fp8) {
    const fs::path dir = step_directory(options_.checkpoint_dir, done);
    const FaultInjection& fault = options_.fault;
    const std::string kill_writing =
        fault.mode == FaultInjection::Mode::KillWriting && fault.step + 1 == done ? fault.file : std::string();
    const int world_size = static_cast<int>(world_.members.size());
    const ShardRecord mine = write_shard(dir, rank_, world_size, done, *shard_, *backend_, kill_writing);
    const bool keeps_fp8 = fp8 != nullptr && fp8->delayed();
    const ShardRecord fp8_mine =
        keeps_fp8 ? write_fp8_state(dir, rank_, world_size, done, fp8->saved(), kill_writing) : ShardRecord{};
    // everyone's (bytes, checksum) of both files, which also tells rank 0 that every file is in place
    const std::size_t world = world_.members.size();
    std::vector<std::uint64_t> records(4 * world);
    const std::uint64_t local[4] = {mine.bytes, mine.checksum, fp8_mine.bytes, fp8_mine.checksum};
    comm_.all_gather(world_, local, records.data(), 4, DType::F64, "checkpoint shard records");
    last_written_ = done;
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
      const int rank = static_cast<int>(r);
      manifest.shards.push_back(ShardRecord{rank, shard_file_name(rank), records[4 * r], records[4 * r + 1]});
      if (keeps_fp8) {
        manifest.fp8_states.push_back(
            ShardRecord{rank, fp8_state_file_name(rank), records[4 * r + 2], records[4 * r + 3]});
      }
    }
    write_manifest(dir, manifest, kill_writing);
    prune_checkpoints(options_.checkpoint_dir, options_.keep_checkpoints, known_good_);
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
  bool threads_launcher_;
  TrainResult* result_;
  RankProgress* progress_;
  std::vector<double> work_flops_;  // each rank's compute FLOPs per step: the straggler detector's measure of work
  std::unique_ptr<DeferredCollectives> deferred_;  // check_deferred_collectives: shared by the two below
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> device_comm_;  // the interpreter's, for a device backend (destroyed before it)
  std::unique_ptr<ModelShard> shard_;
  std::optional<std::vector<Fp8TensorScales>> fp8_restored_;  // FP8 delayed scaling's state from the checkpoint
  std::vector<double> history_;  // the losses of the steps before this run (the checkpoint's record)
  int last_written_ = -1;        // the newest checkpoint's step (resumed from or written), -1: none
  int known_good_ = -1;          // the newest checkpoint whose weights gave a sane loss, -1: none
};

}  // namespace

int default_threads_per_rank(int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_host));
}

void run_rank(const model::Program& program, const TextDataset& data, const TrainOptions& options, Communicator& comm,
              int threads, bool threads_launcher, TrainResult* result, RankProgress* progress) {
  RankRun run(program, data, options, comm, threads, threads_launcher, result, progress);
  run.run();
}

TrainResult train_rank(const model::Program& program, const TextDataset& data, const TrainOptions& options,
                       Communicator& comm, int threads_per_rank) {
  TrainResult result;
  std::optional<CheckpointLock> lock;
  if (comm.rank() == 0 && !options.checkpoint_dir.empty()) lock.emplace(options.checkpoint_dir);
  run_rank(program, data, options, comm, threads_per_rank, false, comm.rank() == 0 ? &result : nullptr, nullptr);
  return result;
}

}  // namespace twin::exec
