// Stragglers and degraded parts: parsing, the seeded draw, the engine's side (compute scales, link rates) and the
// report of where the slowdown went.
#include "sim/degraded.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

#include "model/ops/op_label.hpp"
#include "sim/engine.hpp"

namespace twin::sim {
namespace {

namespace sg4 = simgrid::s4u;

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

int whole_number(std::string_view text, std::string_view what, std::string_view spec) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) {
    throw std::invalid_argument(fmt::format("'{}': {} must be a whole number >= 0, got '{}'", spec, what, text));
  }
  return value;
}

double number(std::string_view text, std::string_view spec) {
  const std::string copy(text);
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(copy, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != copy.size() || copy.empty() || !std::isfinite(value)) {
    throw std::invalid_argument(fmt::format("'{}': the factor must be a number, got '{}'", spec, text));
  }
  return value;
}

double link_factor(std::string_view text, std::string_view spec) {
  const double factor = number(text, spec);
  if (!(factor > 0 && factor <= 1)) {
    throw std::invalid_argument(fmt::format(
        "'{}': a link's bandwidth factor must be above 0 and at most 1 (0.5: half its rate), got {}", spec, factor));
  }
  return factor;
}

}  // namespace

SlowGpu parse_slow_gpu(std::string_view text) {
  const auto parts = split(text, ':');
  if (parts.size() != 2) throw std::invalid_argument(fmt::format("'{}': expected RANK:FACTOR, e.g. 3:1.5", text));
  SlowGpu gpu{whole_number(parts[0], "the rank", text), number(parts[1], text)};
  if (!(gpu.factor >= 1 && gpu.factor <= 100)) {
    throw std::invalid_argument(
        fmt::format("'{}': a GPU's slowdown factor must be 1 to 100 (1.5: its compute takes 1.5 times as long), got {}",
                    text, gpu.factor));
  }
  return gpu;
}

SlowLink parse_slow_link(std::string_view text) {
  const auto parts = split(text, ':');
  SlowLink link;
  if (parts.size() == 3 && (parts[0] == "nic" || parts[0] == "nvlink")) {
    link.part = parts[0] == "nic" ? SlowLink::Part::Nic : SlowLink::Part::NvLink;
    link.rank = whole_number(parts[1], "the rank", text);
    link.factor = link_factor(parts[2], text);
    return link;
  }
  if (parts.size() == 4 && parts[0] == "uplink") {
    link.part = SlowLink::Part::UpLink;
    link.leaf = whole_number(parts[1], "the leaf", text);
    link.spine = whole_number(parts[2], "the spine", text);
    link.factor = link_factor(parts[3], text);
    return link;
  }
  throw std::invalid_argument(
      fmt::format("'{}': expected nic:RANK:FACTOR, nvlink:RANK:FACTOR or uplink:LEAF:SPINE:FACTOR", text));
}

SlowLink parse_failed_uplink(std::string_view text) {
  const auto parts = split(text, ':');
  if (parts.size() != 2) throw std::invalid_argument(fmt::format("'{}': expected LEAF:SPINE, e.g. 0:1", text));
  SlowLink link;
  link.part = SlowLink::Part::UpLink;
  link.leaf = whole_number(parts[0], "the leaf", text);
  link.spine = whole_number(parts[1], "the spine", text);
  link.factor = 0;
  return link;
}

std::vector<SlowGpu> draw_slow_gpus(int world, double fraction, double factor, std::uint64_t seed) {
  if (!(fraction >= 0 && fraction <= 1)) {
    throw std::invalid_argument(fmt::format("the fraction of slow GPUs must be 0 to 1, got {}", fraction));
  }
  const int count = static_cast<int>(std::lround(fraction * world));
  std::vector<int> ranks(static_cast<std::size_t>(world));
  for (int i = 0; i < world; ++i) ranks[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 random(seed);
  for (int i = 0; i < count; ++i) {  // the first `count` places of a Fisher-Yates shuffle
    const int j = i + static_cast<int>(random() % static_cast<std::uint64_t>(world - i));
    std::swap(ranks[static_cast<std::size_t>(i)], ranks[static_cast<std::size_t>(j)]);
  }
  std::vector<SlowGpu> gpus;
  for (int i = 0; i < count; ++i) gpus.push_back({ranks[static_cast<std::size_t>(i)], factor});
  std::sort(gpus.begin(), gpus.end(), [](const SlowGpu& a, const SlowGpu& b) { return a.rank < b.rank; });
  return gpus;
}

std::string slowdown_report(const model::Program& program, const report::Timeline& healthy,
                            const report::Timeline& degraded) {
  const double delta = degraded.iteration_time_s - healthy.iteration_time_s;
  std::string out = fmt::format("  degraded: iteration {:.4f} s against {:.4f} s healthy ({:+.4f} s, {:+.2f} %)\n",
                                degraded.iteration_time_s, healthy.iteration_time_s, delta,
                                healthy.iteration_time_s > 0 ? 100 * delta / healthy.iteration_time_s : 0.0);
  // Per recorded rank and op class: the change of its own compute (active to end) and of the waits of its
  // collectives and transfers (issued to active: the peers or the bytes it waited for) and their moving time.
  std::map<std::pair<int, std::string>, double> changes;
  const auto add = [&](const report::RankTimeline& rank, double sign) {
    for (const report::OpSpan& span : rank.spans) {
      const model::Op& op = program.stage_ops[static_cast<std::size_t>(rank.stage)][static_cast<std::size_t>(span.op)];
      const bool compute = op.kind == model::OpKind::Compute;
      const std::string what = compute ? "its own compute" : "in " + model::op_class(model::op_label(op));
      changes[{rank.rank, what}] += sign * (compute ? span.end_s - span.active_s : span.end_s - span.start_s);
    }
  };
  for (const report::RankTimeline& rank : degraded.ranks) {
    const auto same = std::find_if(healthy.ranks.begin(), healthy.ranks.end(),
                                   [&](const report::RankTimeline& other) { return other.rank == rank.rank; });
    if (same == healthy.ranks.end()) continue;
    add(rank, 1);
    add(*same, -1);
  }
  std::vector<std::pair<double, std::string>> largest;
  for (const auto& [key, seconds] : changes) {
    const int stage = program.layout.coord_of(key.first).pp;
    largest.emplace_back(seconds, fmt::format("stage {} (rank {}): {}", stage, key.first, key.second));
  }
  std::stable_sort(largest.begin(), largest.end(),
                   [](const auto& x, const auto& y) { return std::abs(x.first) > std::abs(y.first); });
  out +=
      "  absorbed by (the largest changes, per traced rank and op class: compute, or a collective's or transfer's "
      "time from its issue to its end):\n";
  int shown = 0;
  for (const auto& [seconds, what] : largest) {
    if (shown == 6 || std::abs(seconds) < 1e-9 * std::max(1.0, healthy.iteration_time_s)) break;
    out += fmt::format("    {:+10.4f} s  {}\n", seconds, what);
    ++shown;
  }
  if (shown == 0) out += "    nothing: the degraded part is off this iteration's critical path\n";
  return out;
}

namespace detail {

double Engine::compute_scale(int id) const {
  double scale = 1;
  const std::vector<int> ranks = fidelity_ == Fidelity::Rank
                                     ? std::vector<int>{id}
                                     : program_.layout.group_members(model::Group::Tensor, representative_rank(id));
  for (const SlowGpu& gpu : options_.degradations.gpus) {
    if (std::find(ranks.begin(), ranks.end(), gpu.rank) != ranks.end()) scale = std::max(scale, gpu.factor);
  }
  return scale;
}

void Engine::check_degradations() const {
  const int world = program_.layout.world_size();
  for (const SlowGpu& gpu : options_.degradations.gpus) {
    if (gpu.rank >= world) {
      throw SimulationError(fmt::format("--slow-gpu: rank {} is past the job's {} ranks", gpu.rank, world));
    }
  }
  for (const SlowLink& link : options_.degradations.links) {
    if (link.part != SlowLink::Part::UpLink && link.rank >= world) {
      throw SimulationError(fmt::format("--slow-link: rank {} is past the job's {} ranks", link.rank, world));
    }
    if (link.part == SlowLink::Part::NvLink && fidelity_ == Fidelity::Group) {
      throw SimulationError(
          "--slow-link nvlink: group fidelity times tensor-parallel collectives on NVLink analytically, without "
          "links: use --fidelity rank");
    }
  }
}

void Engine::degrade_links() {
  const topology::FatTreeShape& shape = platform_->shape();
  for (const SlowLink& link : options_.degradations.links) {
    std::vector<sg4::Link*> links;
    double factor = link.factor;
    try {
      if (link.part == SlowLink::Part::UpLink) {
        if (link.factor == 0) {  // failed: the leaf's load spread over its other up-links
          if (shape.levels != 2 || shape.spines < 2) {
            throw SimulationError(fmt::format("--failed-uplink {}:{}: no other route ({}): the fabric has {}",
                                              link.leaf, link.spine,
                                              shape.levels != 2 ? "one switch, no up-links" : "one spine",
                                              shape.levels != 2 ? "a single switch" : "a single spine per leaf"));
          }
          platform_->up_links(link.leaf, link.spine);  // checks that it exists
          for (int spine = 0; spine < shape.spines; ++spine) {
            for (sg4::Link* up : platform_->up_links(link.leaf, spine)) links.push_back(up);
          }
          factor = static_cast<double>(shape.spines - 1) / shape.spines;
        } else {
          links = platform_->up_links(link.leaf, link.spine);
        }
      } else if (fidelity_ == Fidelity::Rank) {
        const int gpu = placement_.gpu_of(link.rank);
        links = link.part == SlowLink::Part::Nic ? platform_->gpu_nic_links(gpu) : platform_->gpu_nvlink_links(gpu);
      } else {
        const int id = link.rank / program_.layout.tp();
        links = platform_->group_nic_links(node_of(id), group_slot_[static_cast<std::size_t>(id)]);
      }
    } catch (const std::invalid_argument& error) {
      throw SimulationError(fmt::format("{}: {}", link.factor == 0 ? "--failed-uplink" : "--slow-link", error.what()));
    }
    for (sg4::Link* one : links) one->set_bandwidth(one->get_bandwidth() * factor);
  }
}

}  // namespace detail
}  // namespace twin::sim
