#include "sim/simgrid_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <simgrid/s4u/Engine.hpp>

namespace twin::sim {

std::string simgrid_library_path() {
  Dl_info info{};
  // Engine::get_clock is a static member of the library's own (not inlined into twin: it reads the engine's state).
  const auto clock = &simgrid::s4u::Engine::get_clock;
  if (dladdr(reinterpret_cast<const void*>(clock), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

std::optional<std::string> rank_fidelity_hint(long long gpus, const std::string& library_path) {
  // Debian's package: /usr/lib/<triplet>, found as /lib/<triplet> too (usrmerge makes /lib a link to /usr/lib).
  const bool system = library_path.rfind("/usr/lib/", 0) == 0 || library_path.rfind("/lib/", 0) == 0;
  if (gpus < kRankFidelityHintGpus || !system) return std::nullopt;
  return fmt::format(
      "twin sim: {} GPUs at rank fidelity on {}: minutes on two cores, most of them SimGrid 3.32 walking its list of "
      "transfers; bench/sim/rank_fidelity_simgrid_fix.sh builds the library with SimGrid's own fix (MT-NLG on 4,480 "
      "GPUs: 168 s -> 38 s, the same results), then run twin with LD_LIBRARY_PATH=build-simgrid-set/build/lib",
      gpus, library_path);
}

}  // namespace twin::sim
