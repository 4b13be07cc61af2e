// Stragglers and degraded parts: what-ifs `twin sim` applies to the cluster model (--slow-gpu, --slow-gpu-fraction,
// --slow-link, --failed-uplink), and the report of where the slowdown went.
//
//   slow GPU    its compute ops take `factor` times as long (thermal throttling, a weak part). At group fidelity the
//               slowest member sets its TP group's pace: the group's ranks meet at a TP collective after every
//               layer's halves, so a rank fidelity run of the same case differs only by the slack inside one layer.
//   slow link   its bandwidth times `factor` (0 < factor <= 1): a GPU's NIC or NVLink port, or a leaf switch's up-link
//               to one spine. At group fidelity a NIC is one of its TP group's bundled rails, which move in lockstep:
//               the bundle runs at the slow rail's rate. An NVLink is refused there (TP collectives on NVLink are
//               timed analytically at group fidelity): use --fidelity rank.
//   failed up-link  the subnet manager routes the leaf's traffic over its other up-links (a fat-tree's spines are
//               interchangeable); modelled as every up-link of that leaf at (spines - 1) / spines of its rate, the
//               leaf's capacity once its load is spread again. Refused where there is no other route: a one-level tree
//               or a single spine.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/program/program.hpp"
#include "report/timeline.hpp"

namespace twin::sim {

struct SlowGpu {
  int rank = 0;
  double factor = 1;  // compute time multiplier, >= 1
};

struct SlowLink {
  enum class Part : unsigned char { Nic, NvLink, UpLink };
  Part part = Part::Nic;
  int rank = 0;             // Nic, NvLink: the rank whose GPU it serves
  int leaf = 0, spine = 0;  // UpLink
  double factor = 1;        // bandwidth multiplier in (0, 1]; 0: a failed up-link, its traffic rerouted
};

struct Degradations {
  std::vector<SlowGpu> gpus;
  std::vector<SlowLink> links;
  bool empty() const { return gpus.empty() && links.empty(); }
};

// "RANK:FACTOR" (factor 1 to 100). Throws std::invalid_argument saying what is wrong.
SlowGpu parse_slow_gpu(std::string_view text);
// "nic:RANK:FACTOR", "nvlink:RANK:FACTOR" or "uplink:LEAF:SPINE:FACTOR" (factor above 0, at most 1).
SlowLink parse_slow_link(std::string_view text);
// "LEAF:SPINE": that up-link failed.
SlowLink parse_failed_uplink(std::string_view text);
// round(fraction x world) distinct ranks, each slowed by `factor`, drawn from `seed` (std::mt19937_64 and a
// Fisher-Yates shuffle written here: the same ranks on every machine).
std::vector<SlowGpu> draw_slow_gpus(int world, double fraction, double factor, std::uint64_t seed);

// Where a degraded run's extra time went against the same run without the degradation: the iteration's change, and
// per traced rank (dp = 0, tp = 0 of each stage, and --trace-ranks) and op class the largest changes: its own compute,
// or a collective's or transfer's time from its issue to its end (what it waited for a slower peer, or for bytes on a
// slower link).
std::string slowdown_report(const model::Program& program, const report::Timeline& healthy,
                            const report::Timeline& degraded);

}  // namespace twin::sim
