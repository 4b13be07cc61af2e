// A scenario as the library takes it: a name under scenarios/ ("mtnlg-530b"), a TOML file, or TOML text, with
// "section.key=value" overrides on top (what `twin --set` gives); and the Program built from it within this host's
// memory. Errors are model::ScenarioError (a problem of the scenario, its field named: field_of) or UserError (a file
// that is not there).
#pragma once

#include <string>
#include <vector>

#include "model/program/program.hpp"
#include "model/scenario/errors.hpp"
#include "model/scenario/scenario.hpp"

namespace twin::api {

// The folder scenario names resolve in: set_scenario_directory's, else $TWIN_SCENARIOS, else the source tree's
// scenarios/ (compiled in; an installed Python package sets its own copy).
std::string scenario_directory();
void set_scenario_directory(const std::string& directory);

// Resolves "mtnlg-530b" or "scenarios/x.toml" or "/abs/x.toml" to an existing file; throws UserError if none.
std::string resolve_scenario_path(const std::string& name_or_path);

// "parallel.tp=8" -> {parallel.tp, 8}; throws ScenarioError naming the text when malformed.
std::vector<model::Override> parse_overrides(const std::vector<std::string>& sets);

// The scenario named or at `name_or_path`, with `overrides` applied before validation.
model::Scenario scenario_named(const std::string& name_or_path, const std::vector<model::Override>& overrides = {});
// The scenario in `toml_text` (reported as `source_name`), with `overrides`.
model::Scenario scenario_from_text(const std::string& toml_text, const std::vector<model::Override>& overrides = {},
                                   const std::string& source_name = "<scenario text>");

// The scenario key the error's first problem names ("parallel.tp": the first section.key after the file's name), or ""
// when none does (a file that cannot be read, a malformed override): what a binding reports as the error's field.
std::string field_of(const UserError& error);

// "op" or "layer"; throws UserError naming `flag` otherwise.
model::Granularity parse_granularity(const std::string& text, const std::string& flag = "granularity");

// Bytes of host memory available (MemAvailable), or 0 when unknown.
double available_memory_bytes();

// build_program, after checking that the Program fits in the memory this host has left: a scenario with absurd
// sizes (a million layers) gets a UserError naming its sizes instead of exhausting memory.
model::Program build_program_within_memory(const model::Scenario& scenario, model::Granularity granularity);
// The same check alone, from the scenario's sizes (nothing allocated): for a command that allocates by the plan before
// it builds the Program (twin run's host-memory estimate builds the schedule).
void require_program_fits_memory(const model::Scenario& scenario, model::Granularity granularity);

}  // namespace twin::api
