// Which SimGrid library this process runs on, and what that means for rank fidelity at scale.
//
// Debian 12's SimGrid 3.32 finds each finished transfer in a list of every transfer in flight (CommImpl::finish), so
// rank fidelity slows as the GPUs grow: MT-NLG on 560 nodes (4,480 GPUs) takes about 170 s on 2 cores with it and
// 38 s with SimGrid 3.34's std::set, rebuilt into 3.32 by bench/sim/rank_fidelity_simgrid_fix.sh (docs/simulator.md,
// "Rank fidelity with SimGrid's own fix"). twin cannot tell the two libraries apart by version (both are 3.32), only
// by where the loaded one lies: Debian's is under /usr/lib (or /lib, the same folder since usrmerge).
#pragma once

#include <optional>
#include <string>

namespace twin::sim {

// The file of the libsimgrid this process runs on (dladdr of one of its functions); "" if it cannot be told.
std::string simgrid_library_path();

// From this many GPUs at rank fidelity the list walk costs minutes on 2 cores (1,120 GPUs: 48 s, of which the fix
// saves a third; 4,480: 168 s, of which it saves three quarters).
inline constexpr long long kRankFidelityHintGpus = 1000;

// A line for `twin sim` to print before a rank-fidelity run of `gpus` GPUs on the library at `library_path`: none
// below kRankFidelityHintGpus or on a library outside /usr/lib and /lib (a rebuilt one), else where the time goes
// and the script that rebuilds the library.
std::optional<std::string> rank_fidelity_hint(long long gpus, const std::string& library_path);

}  // namespace twin::sim
