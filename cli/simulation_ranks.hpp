// `twin search` and `twin sweep` spread over the ranks of an mpirun / srun job: each rank simulates its share of the
// variants with the child-process pool (simulation_pool.hpp) and rank 0 gathers every outcome, in the order of the
// lists, so that it prints and writes exactly what one process would.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/variants.hpp"
#include "cli/simulation_pool.hpp"

namespace twin::cli {

// This process's place in the job that started it, from the launcher's environment: mpirun (OMPI_COMM_WORLD_RANK /
// _SIZE), MPICH and Intel MPI (PMI_RANK / PMI_SIZE), srun (SLURM_PROCID / SLURM_STEP_NUM_TASKS). Outside a job:
// rank 0 of 1.
struct LaunchedRank {
  int rank = 0;
  int size = 1;
};
LaunchedRank launched_rank();

// The simulator a command hands the library (api::run_search, api::run_sweep): simulate_in_children over the job's
// ranks, `jobs` at a time on each, `extra_arguments` on each child's command line. Variant i of a call is simulated by
// rank i % size; rank 0 gathers every outcome and sends them all to the other ranks, so that every rank returns the
// same outcomes and takes the same next step (a search calls it batch after batch: MPI stays open between calls, for
// as long as the simulator lives). A rank that fails, or falls silent for kSilentRankS, is named on stderr and the
// variants it had not reported are outcomes whose error names it; that rank's own calls return no outcomes from then
// on. Outside a job (or in a job of one rank) it is simulate_in_children. `progress`: the pool's progress line, on the
// first call only (a search's later batches are a plan or two each). On a rank other than 0 it sets `follower`:
// such a rank prints and writes nothing.
api::VariantSimulator ranks_simulator(int jobs, const std::string& command, std::vector<std::string> extra_arguments,
                                      bool progress, bool& follower);

// Rank 0, once it has printed and written everything: when a rank of the job died, ends the job (MPI_Abort with
// status 0), since MPI_Finalize on the ranks still alive would wait for the dead one forever; otherwise nothing. Rank
// 0's MPI stays open until then for that reason (ranks_simulator leaves it open when a rank fell silent).
void end_job_if_a_rank_died();

// A rank sends a word at least every second while it works; this long without one, rank 0 takes it for dead (mpirun
// --enable-recovery or srun without --kill-on-bad-exit keep the other ranks running when one dies).
inline constexpr double kSilentRankS = 10;

}  // namespace twin::cli
