// sim/simgrid_library.hpp: which SimGrid library twin runs on, and the hint `twin sim` prints before a
// rank-fidelity run that Debian's SimGrid 3.32 makes slow.
#include <gtest/gtest.h>

#include "sim/simgrid_library.hpp"

namespace twin::sim {
namespace {

TEST(SimgridLibrary, ThePathIsTheLoadedLibsimgrid) {
  const std::string path = simgrid_library_path();
  ASSERT_FALSE(path.empty());
  EXPECT_NE(path.find("libsimgrid"), std::string::npos) << path;
}

TEST(SimgridLibrary, RankFidelityOfThousandsOfGpusOnDebiansLibraryGetsTheHint) {
  const std::string debian = "/usr/lib/x86_64-linux-gnu/libsimgrid.so.3.32";
  const auto hint = rank_fidelity_hint(4480, debian);
  ASSERT_TRUE(hint.has_value());
  EXPECT_NE(hint->find("4480 GPUs at rank fidelity"), std::string::npos) << *hint;
  EXPECT_NE(hint->find("bench/sim/rank_fidelity_simgrid_fix.sh"), std::string::npos) << *hint;
  EXPECT_NE(hint->find(debian), std::string::npos) << *hint;
  EXPECT_TRUE(rank_fidelity_hint(kRankFidelityHintGpus, debian).has_value());
  // what the loader reports on a merged-/usr system such as Debian 12's
  EXPECT_TRUE(rank_fidelity_hint(4480, "/lib/x86_64-linux-gnu/libsimgrid.so.3.32").has_value());
}

TEST(SimgridLibrary, NoHintBelowAThousandGpusNorOnARebuiltLibrary) {
  EXPECT_FALSE(rank_fidelity_hint(kRankFidelityHintGpus - 1, "/usr/lib/x86_64-linux-gnu/libsimgrid.so.3.32"));
  EXPECT_FALSE(rank_fidelity_hint(4480, "/work/build-simgrid-set/build/lib/libsimgrid.so.3.32"));
  EXPECT_FALSE(rank_fidelity_hint(4480, ""));
}

}  // namespace
}  // namespace twin::sim
