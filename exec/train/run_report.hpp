// What a run reports, in the simulator's formats: the --json document and the Chrome trace.
//
// --json: {"losses": [one per step run], "iteration_time_s": [one per step run], "tokens_per_s", "grad_norms",
//          "learning_rates", "first_step", "steps", "earlier_losses" (from a resumed checkpoint), "engine",
//          per step the straggler detector's "slowest_rank" (-1 with one rank), "lag_s" and "lag_fraction",
//          "summary": {the simulator's summary keys (report/summary.hpp) for the traced step: iteration_time_s,
//                      bubble_fraction, tflops_per_gpu, mfu, time_split, stages, ...}}
// Note: the top-level "iteration_time_s" is the per-step list; the summary's is the traced step's.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "exec/train/trainer.hpp"

namespace twin::exec {

// `peak_flops_per_rank`: for the summary's MFU (0: unknown, MFU 0).
nlohmann::json run_json(const model::Program& program, const TrainResult& result, const std::string& engine,
                        double peak_flops_per_rank = 0);

// "step N: compute by kernel: GEMMs 40.1 %, ..." for the traced step (1-based N), or empty when none was traced.
std::string compute_by_kernel_note(const model::Program& program, const TrainResult& result);

// Chrome trace of the traced step (one process per rank, one track per stream); empty when none was traced.
std::string run_trace(const model::Program& program, const TrainResult& result);

}  // namespace twin::exec
