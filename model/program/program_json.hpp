// The Program as JSON (`twin graph --json`): the scenario, and per stage its op list.
#pragma once

#include <nlohmann/json.hpp>

#include "model/program/program.hpp"

namespace twin::model {

nlohmann::json program_to_json(const Program& program);
nlohmann::json op_to_json(const Op& op);

}  // namespace twin::model
