// The scenario reader (model/scenario: TOML, every rule) and --set overrides. The input is the scenario's text, then
// optionally a line "%%" and one override per line ("parallel.pp=4"). Refusal: twin::UserError (ScenarioError).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "model/scenario/scenario.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t split = input.find("\n%%\n");
  const std::string text = input.substr(0, split);
  twin::fuzz::expect_refusal_only<twin::UserError>([&] {
    std::vector<twin::model::Override> overrides;
    if (split != std::string::npos) {
      std::istringstream lines(input.substr(split + 4));
      std::string line;
      while (std::getline(lines, line)) overrides.push_back(twin::model::parse_override(line));
    }
    const twin::model::Scenario s = twin::model::parse_scenario(text, "fuzz.toml", overrides);
    // What was accepted round-trips: its own TOML loads again to the same text.
    const std::string again = twin::model::to_toml(s);
    if (twin::model::to_toml(twin::model::parse_scenario(again, "fuzz-again.toml")) != again) {
      std::fprintf(stderr, "twin fuzz: the scenario's TOML does not round-trip\n");
      std::abort();
    }
  });
  return 0;
}
