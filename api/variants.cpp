// Variants simulated in this process: a variant's UserError is its row's error, as a child's last line would be.
#include "api/variants.hpp"

#include <exception>

#include "api/scenario.hpp"
#include "model/scenario/errors.hpp"

namespace twin::api {

std::vector<VariantOutcome> simulate_here(const std::string& scenario_path,
                                          const std::vector<std::vector<std::string>>& override_lists,
                                          const SimRequest& extras) {
  std::vector<VariantOutcome> outcomes;
  for (const std::vector<std::string>& sets : override_lists) {
    VariantOutcome outcome;
    try {
      SimRequest request = extras;
      request.isolate = true;
      const model::Scenario scenario = scenario_named(scenario_path, parse_overrides(sets));
      outcome.summary = sim_document(simulate(scenario, request), request);
      outcome.summary.erase("pipeline");  // a variant's row never draws it (report/plan_documents.hpp)
    } catch (const UserError& error) {
      outcome.error = error.what();
      outcome.exit_status = 2;
    } catch (const std::exception& error) {
      outcome.error = error.what();
      outcome.exit_status = 1;
    }
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

}  // namespace twin::api
