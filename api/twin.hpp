// twin as a library: what the `twin` command line and the Python package (python/) call. Each call takes what the
// command's flags say and returns the document the command's --json writes, so that a binding never reaches into cli/.
//
//   model::Scenario s = api::scenario_named("mtnlg-530b", api::parse_overrides({"cluster.nodes=350"}));
//   model::Program p = api::build_program_within_memory(s, model::Granularity::Layer);  // twin graph
//   nlohmann::json summary = api::sim_document(api::simulate(s, {}), {});                // twin sim --json
//   api::sweep_document(api::sweep(request), request);                                  // twin sweep --json
//   api::search_document(api::search(request), request);                                // twin search --json
//   api::compare(summary, "prediction", "60.1").document;                              // twin compare --json
//
// Errors: model::ScenarioError (its field(): the scenario key it names) and the other UserErrors name what was given
// wrong; RunFailure and InternalError as everywhere (model/scenario/errors.hpp).
#pragma once

#include "api/compare.hpp"
#include "api/scenario.hpp"
#include "model/program/program_json.hpp"
#ifdef TWIN_HAVE_SIMGRID
#include "api/search.hpp"
#include "api/simulation.hpp"
#include "api/sweep.hpp"
#endif
